"""adaserve against Ray Serve: the same model, the same requests from the same load generator, on the same cores.

The example `mlp` (784-256-256-10, FP32, the artifact adaserve serves) takes batch-1 requests from Triton's C++
perf_analyzer over HTTP (binary tensor data), closed loop at concurrency 1 and 8, interleaved, `--repeats` times.
Ray Serve serves it the way its guides batch a PyTorch model: a FastAPI ingress whose handler awaits a
`@serve.batch` method (max_batch_size 16, the model's; batch_wait_timeout_s 0, Ray's lowest-latency setting), one
thread a replica, `--ray-replicas` replicas of one CPU each (`benchmarks/ray_app.py`, which also answers the
metadata and config routes perf_analyzer reads, with adaserve's answers for the same model). adaserve serves it
with its example config (elastic batching, its default worker set). Ray binds every interface whatever it is asked,
so the whole benchmark runs in a network namespace of its own (`unshare -rn`): nothing outside can reach either
server. "server cores" is each server's process tree (Ray's: the driver, GCS, raylet, controller, proxy and
replicas), under load and, before the runs, over five idle seconds.

    benchmarks/perf_analyzer_env.sh                     # once: Triton's perf_analyzer in .venv-perf
    benchmarks/ray_env.sh                               # once: Ray Serve in .venv-ray
    .venv/bin/python -m benchmarks.versus_ray           # ~5 minutes; --quick for one repeat

Writes `benchmarks/results/versus_ray.json` and `.png` (with --quick: under `benchmarks/results/tmp/`).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from benchmarks.common import (
    RESULTS,
    ROOT,
    SCRATCH,
    finish_report,
    load_average,
    process_command,
    report_head,
    rerun_in_own_network_namespace,
    tree_cpu_s,
)
from benchmarks.perf_load import PerfAnalyzer
from benchmarks.serving_overhead import MODEL, paired_case, paired_plot, perf_parser, perf_run
from tests.server_utils import ServerHandle, free_port, link_example, running_server

CONCURRENCIES = (1, 8)
SERVERS = ("adaserve", "ray")
#: How long Ray may take to start and deploy.
RAY_START_S = 240.0


def main() -> int:
    parser = perf_parser(__doc__, request_count=2000)
    parser.add_argument("--ray-python", type=Path, default=ROOT / ".venv-ray" / "bin" / "python")
    parser.add_argument("--ray-replicas", type=int, default=2, help="Ray Serve replicas, one CPU each (default 2)")
    args = parser.parse_args()
    outer = rerun_in_own_network_namespace("benchmarks.versus_ray")
    if outer is not None:
        return outer
    args.repeats = args.repeats or (1 if args.quick else 3)
    args.request_count = args.request_count or (500 if args.quick else 2000)
    output: Path = args.output or (SCRATCH / "versus_ray-quick.json" if args.quick else RESULTS / "versus_ray.json")
    perf = PerfAnalyzer.find(args.perf_venv)
    work = SCRATCH / "versus_ray"
    shutil.rmtree(work, ignore_errors=True)
    link_example(work / "repo", MODEL)
    settings = {
        "model": MODEL,
        "repeats": args.repeats,
        "measurement_request_count": args.request_count,
        "ray_replicas": args.ray_replicas,
        "ray_batch": {"max_batch_size": 16, "batch_wait_timeout_s": 0.0},
    }
    report = report_head("versus_ray", settings)
    with running_server(work / "repo") as adaserve:
        for route in ("", "/config"):
            with urllib.request.urlopen(f"http://{adaserve.http_url}/v2/models/{MODEL}{route}", timeout=10) as answer:
                (work / f"model{route.replace('/', '_') or '_metadata'}.json").write_bytes(answer.read())
        with _ray_server(args.ray_python, work, args.ray_replicas) as ray:
            report["ray_version"] = ray.log.read_text().split("ray ", 1)[-1].split()[0] if ray.log.exists() else None
            report["server_commands"] = {"adaserve": process_command(adaserve.pid), "ray": process_command(ray.pid)}
            servers = {"adaserve": adaserve, "ray": ray}
            report["idle_server_cores"] = {name: _idle_cores(server.pid) for name, server in servers.items()}
            report["runs"] = [
                perf_run(perf, servers[name], "http", concurrency, repeat, args.request_count, name)
                for repeat in range(args.repeats)
                for concurrency in CONCURRENCIES
                for name in SERVERS
            ]
    report["load_end"] = load_average()
    report["cases"] = _cases(report["runs"])
    return finish_report(report, output, _plot, _print)


@contextlib.contextmanager
def _ray_server(python: Path, work: Path, replicas: int) -> Iterator[ServerHandle]:
    """Ray Serve serving the model (`benchmarks/ray_app.py`), up once it prints "ready"; stopped after, with every
    process it started."""
    if not python.is_file():
        raise SystemExit(f"{python} not found: run benchmarks/ray_env.sh first")
    port = free_port()
    log = work / "ray.log"
    artifact = ROOT / "examples" / "models" / MODEL / "1" / "model.pt2"
    command = [
        str(python), "-m", "benchmarks.ray_app", "--artifact", str(artifact), "--port", str(port),
        "--metadata", str(work / "model_metadata.json"), "--config", str(work / "model_config.json"),
        "--replicas", str(replicas),
    ]  # fmt: skip
    with log.open("wb") as out:
        version = subprocess.run([str(python), "-c", "import ray; print('ray', ray.__version__)"], capture_output=True)
        out.write(version.stdout)
        out.flush()
        process = subprocess.Popen(command, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    handle = ServerHandle(f"127.0.0.1:{port}", "", process.pid, log)
    try:
        deadline = time.monotonic() + RAY_START_S
        while "\nready" not in log.read_text(errors="replace"):
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"Ray Serve did not start; see {log}")
            time.sleep(1.0)
        yield handle
    finally:
        _stop_group(process)


def _idle_cores(pid: int, seconds: float = 5.0) -> float:
    """Cores a server's process tree keeps busy while nobody sends it anything."""
    before = tree_cpu_s(pid)
    time.sleep(seconds)
    return (tree_cpu_s(pid) - before) / seconds


def _stop_group(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM the Ray driver (it shuts Serve and Ray down), then SIGKILL whatever of its session is left: the
    driver started it in a session of its own, so its group is exactly the processes this benchmark started."""
    if process.poll() is None:
        os.kill(process.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=60)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def _cases(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per concurrency: each server's medians, and adaserve's req/s and p50 over Ray's."""
    return {
        f"c{concurrency}": paired_case([r for r in runs if r["concurrency"] == concurrency], ("ray", "adaserve"))
        for concurrency in CONCURRENCIES
    }


def _plot(report: dict[str, Any], path: Path) -> None:
    replicas = report["settings"]["ray_replicas"]
    title = f"adaserve vs Ray Serve ({replicas} replicas), the MLP at batch 1"
    paired_plot(report, path, SERVERS, title, tick=lambda name: f"concurrency {name[1:]}", log_p50=True)


def _print(report: dict[str, Any], output: Path) -> None:
    print("\n| case | adaserve: p50 ms / p99 ms / req/s / server cores | Ray Serve: same | req/s × | p50 × |")
    print("|---|---|---|---|---|")
    for name, case in report["cases"].items():
        cells = [
            f"{case[s]['p50_ms']:.3f} / {case[s]['p99_ms']:.3f} / {case[s]['throughput_rps']:,.0f} / "
            f"{case[s]['server_cores']:.2f}"
            if case[s]["p50_ms"]
            else "failed"
            for s in SERVERS
        ]
        ratios = (
            f"{case['throughput_ratio']:.2f}× | {case['p50_ratio']:.2f}×" if "throughput_ratio" in case else "- | -"
        )
        print(f"| {name} | {' | '.join(cells)} | {ratios} |")
    idle = report["idle_server_cores"]
    print(f"\nidle: adaserve {idle['adaserve']:.2f} cores, Ray Serve {idle['ray']:.2f} cores")
    print(f"wrote {output}")


if __name__ == "__main__":
    raise SystemExit(main())
