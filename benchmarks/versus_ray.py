"""adaserve against Ray Serve: the same model, the same requests from the same load generator, on the same cores.

The example `mlp` (784-256-256-10, FP32, the artifact adaserve serves; `--model cnn` for the example CNN) takes
batch-1 requests from Triton's C++ perf_analyzer over HTTP (binary tensor data), closed loop at concurrency 1 and 8,
interleaved, `--repeats` times. Ray Serve serves it the way its guides batch a PyTorch model: a FastAPI ingress
whose handler awaits a `@serve.batch` method (max_batch_size 16, the model's; batch_wait_timeout_s 0, Ray's
lowest-latency setting), one thread a replica, `--ray-replicas` replicas of one CPU each (`benchmarks/ray_app.py`,
which also answers the metadata and config routes perf_analyzer reads, with adaserve's answers for the same model).
adaserve serves it with its example config (elastic batching, its default worker set). Ray binds every interface
whatever it is asked, so the whole benchmark runs in a network namespace of its own (`unshare -rn`): nothing outside
can reach either server. "server cores" is each server's process tree (Ray's: the driver, GCS, raylet, controller,
proxy and replicas), under load and, before the runs, over five idle seconds.

    benchmarks/perf_analyzer_env.sh                     # once: Triton's perf_analyzer in .venv-perf
    benchmarks/foreign_env.sh ray                       # once: Ray Serve in .venv-ray
    .venv/bin/python -m benchmarks.versus_ray           # ~5 minutes; --quick for one repeat

Writes `benchmarks/results/versus_ray.json` and `.png` (with --quick: under `benchmarks/results/tmp/`).
"""

from __future__ import annotations

import contextlib
import shutil
from pathlib import Path
from typing import Any

from benchmarks.common import (
    RESULTS,
    ROOT,
    ROWS,
    SCRATCH,
    finish_report,
    load_average,
    process_command,
    report_head,
    rerun_in_own_network_namespace,
)
from benchmarks.foreign import (
    example_artifact,
    foreign_server,
    idle_cores,
    paired_perf_runs,
    perf_shape,
    print_pair,
    save_description,
    venv_python,
    version_of,
)
from benchmarks.perf_load import PerfAnalyzer
from benchmarks.serving_overhead import MODEL, paired_cases, paired_plot, perf_parser
from tests.server_utils import ServerHandle, free_port, link_example, running_server

CONCURRENCIES = (1, 8)
SERVERS = ("ray", "adaserve")


def main() -> int:
    parser = perf_parser(__doc__, request_count=2000)
    parser.add_argument("--model", choices=sorted(ROWS), default=MODEL, help=f"example model (default {MODEL})")
    parser.add_argument("--ray-venv", type=Path, default=ROOT / ".venv-ray", help="venv holding Ray Serve")
    parser.add_argument("--ray-replicas", type=int, default=2, help="Ray Serve replicas, one CPU each (default 2)")
    args = parser.parse_args()
    outer = rerun_in_own_network_namespace("benchmarks.versus_ray")
    if outer is not None:
        return outer
    args.repeats = args.repeats or (1 if args.quick else 3)
    args.request_count = args.request_count or (500 if args.quick else 2000)
    stem = "versus_ray" if args.model == MODEL else f"versus_ray-{args.model}"
    output: Path = args.output or (SCRATCH / f"{stem}-quick.json" if args.quick else RESULTS / f"{stem}.json")
    perf = PerfAnalyzer.find(args.perf_venv)
    work = SCRATCH / "versus_ray"
    shutil.rmtree(work, ignore_errors=True)
    link_example(work / "repo", args.model)
    settings = {
        "model": args.model,
        "repeats": args.repeats,
        "measurement_request_count": args.request_count,
        "ray_replicas": args.ray_replicas,
        "ray_batch": {"max_batch_size": 16, "batch_wait_timeout_s": 0.0},
    }
    report = report_head("versus_ray", settings)
    with running_server(work / "repo") as adaserve:
        save_description(adaserve, args.model, "", work / "model_metadata.json")
        save_description(adaserve, args.model, "/config", work / "model_config.json")
        python = venv_python(args.ray_venv, "benchmarks/foreign_env.sh ray")
        report["ray_version"] = version_of(python, "ray")
        with _ray_server(python, work, args.ray_replicas, args.model) as ray:
            report["server_commands"] = {"adaserve": process_command(adaserve.pid), "ray": process_command(ray.pid)}
            servers = {"adaserve": adaserve, "ray": ray}
            report["idle_server_cores"] = {name: idle_cores(server.pid) for name, server in servers.items()}
            speech = dict.fromkeys(SERVERS, (perf_shape(args.model), ()))
            report["runs"] = paired_perf_runs(
                perf, servers, SERVERS, CONCURRENCIES, args.repeats, args.request_count, args.model, speech
            )
    report["load_end"] = load_average()
    report["cases"] = paired_cases(report["runs"], SERVERS, CONCURRENCIES)
    return finish_report(report, output, _plot, _print)


def _ray_server(python: Path, work: Path, replicas: int, model: str) -> contextlib.AbstractContextManager[ServerHandle]:
    """Ray Serve serving the model (`benchmarks/ray_app.py`)."""
    port = free_port()
    command = [
        str(python), "-m", "benchmarks.ray_app", "--artifact", str(example_artifact(model)), "--port", str(port),
        "--metadata", str(work / "model_metadata.json"), "--config", str(work / "model_config.json"),
        "--replicas", str(replicas),
    ]  # fmt: skip
    return foreign_server(command, work / "ray.log", port, "Ray Serve")


def _plot(report: dict[str, Any], path: Path) -> None:
    replicas = report["settings"]["ray_replicas"]
    title = f"adaserve vs Ray Serve ({replicas} replicas), the {report['settings']['model']} at batch 1"
    paired_plot(report, path, SERVERS, title, tick=lambda name: f"concurrency {name[1:]}", log_p50=True)


def _print(report: dict[str, Any], output: Path) -> None:
    print_pair(report, output, SERVERS, ("Ray Serve", "adaserve"))


if __name__ == "__main__":
    raise SystemExit(main())
