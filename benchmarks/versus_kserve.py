"""adaserve against KServe's Python model server: the same model, the same requests from the same load generator, on
the same cores.

The example `mlp` (784-256-256-10, FP32, the artifact adaserve serves; `--model cnn` for the example CNN) takes
batch-1 requests of real Fashion-MNIST test images over the Open Inference Protocol's REST API (`--protocol grpc`:
its gRPC API), closed loop at concurrency 1 and 8, interleaved, `--repeats` times. KServe serves it as its guides
write a custom predictor (`benchmarks/kserve_app.py`: a `kserve.Model` whose `predict` runs the model, one torch
thread; KServe's server has no batching of its own), with its access and latency logs off. adaserve serves the
example config (elastic batching, its default workers). The load generator is `adaserve bench` (closed loop):
perf_analyzer cannot drive KServe, which has no model configuration route. It is a Python generator; its own CPU a
request is recorded beside each run. KServe listens on every interface, so the whole benchmark runs in a network
namespace of its own (`unshare -rn`). "server cores" is each server's process tree.

    benchmarks/foreign_env.sh kserve                    # once: KServe in .venv-kserve
    .venv/bin/python -m benchmarks.versus_kserve        # ~2 minutes; --quick for one repeat

Writes `benchmarks/results/versus_kserve.json` and `.png` (with --quick: under `benchmarks/results/tmp/`).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import (
    RESULTS,
    ROOT,
    ROWS,
    SCRATCH,
    finish_report,
    load_average,
    process_command,
    real_images,
    report_head,
    rerun_in_own_network_namespace,
    tree_cpu_s,
)
from benchmarks.foreign import example_artifact, foreign_server, save_description, venv_python, version_of
from benchmarks.serving_overhead import MODEL, paired_cases, paired_plot, paired_table
from tests.server_utils import ServerHandle, free_ports, link_example, running_server

CONCURRENCIES = (1, 8)
SERVERS = ("kserve", "adaserve")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="one repeat of 3 s runs (a smoke run)")
    parser.add_argument("--repeats", type=int, help="runs of each case, interleaved (default 3; --quick 1)")
    parser.add_argument("--duration", type=float, help="seconds a run (default 8; --quick 3)")
    parser.add_argument("--model", choices=sorted(ROWS), default=MODEL, help=f"example model (default {MODEL})")
    parser.add_argument("--protocol", choices=("http", "grpc"), default="http", help="the API (default http)")
    parser.add_argument("--kserve-venv", type=Path, default=ROOT / ".venv-kserve", help="venv holding KServe")
    parser.add_argument("--output", type=Path, help="result JSON (the PNG goes beside it)")
    args = parser.parse_args()
    outer = rerun_in_own_network_namespace("benchmarks.versus_kserve")
    if outer is not None:
        return outer
    args.repeats = args.repeats or (1 if args.quick else 3)
    args.duration = args.duration or (3.0 if args.quick else 8.0)
    stem = "-".join(["versus_kserve", *[a for a in (args.model, args.protocol) if a not in (MODEL, "http")]])
    output: Path = args.output or (SCRATCH / f"{stem}-quick.json" if args.quick else RESULTS / f"{stem}.json")
    work = SCRATCH / "versus_kserve"
    shutil.rmtree(work, ignore_errors=True)
    link_example(work / "repo", args.model)
    np.save(work / "images.npy", real_images(2000, args.model))
    python = venv_python(args.kserve_venv, "benchmarks/foreign_env.sh kserve")
    settings = {
        "model": args.model,
        "repeats": args.repeats,
        "duration_s": args.duration,
        "generator": "adaserve bench",
        "protocol": args.protocol,
    }
    report = report_head("versus_kserve", settings)
    report["kserve_version"] = version_of(python, "kserve")
    with running_server(work / "repo") as adaserve:
        metadata = save_description(adaserve, args.model, "", work / "metadata.json")
        port, grpc_port = free_ports(2)
        command = [
            str(python), "-m", "benchmarks.kserve_app", "--artifact", str(example_artifact(args.model)),
            "--metadata", str(metadata), "--port", str(port), "--grpc-port", str(grpc_port),
        ]  # fmt: skip
        with foreign_server(command, work / "kserve.log", port, "KServe", grpc_port) as kserve:
            report["server_commands"] = {
                "adaserve": process_command(adaserve.pid),
                "kserve": process_command(kserve.pid),
            }
            servers = {"adaserve": adaserve, "kserve": kserve}
            report["runs"] = [
                _run(servers[name], name, args.model, args.protocol, concurrency, repeat, args.duration, work)
                for repeat in range(args.repeats)
                for concurrency in CONCURRENCIES
                for name in SERVERS
            ]
    report["load_end"] = load_average()
    report["cases"] = paired_cases(report["runs"], SERVERS, CONCURRENCIES)
    return finish_report(report, output, _plot, _print)


def _run(
    server: ServerHandle,
    name: str,
    model: str,
    protocol: str,
    concurrency: int,
    repeat: int,
    duration: float,
    work: Path,
) -> dict[str, Any]:
    """One closed-loop run of `adaserve bench`; its summary and the server's cores over it."""
    result = work / f"{name}-c{concurrency}-r{repeat}.json"
    url = server.http_url if protocol == "http" else server.grpc_url
    command = [
        sys.executable, "-m", "adaserve", "bench", "--url", url, "--protocol", protocol, "--model", model,
        "--input", f"image={work / 'images.npy'}", "--rows", "1", "--concurrency", str(concurrency),
        "--duration", str(duration), "--no-plots", "--quiet", "--output", str(result),
    ]  # fmt: skip
    before = tree_cpu_s(server.pid)
    done = subprocess.run(command, capture_output=True, text=True, timeout=duration + 120)
    server_cpu = tree_cpu_s(server.pid) - before
    run: dict[str, Any] = {"server": name, "concurrency": concurrency, "repeat": repeat, "returncode": done.returncode}
    if done.returncode != 0 or not result.is_file():
        run["output_tail"] = (done.stdout + done.stderr)[-1500:]
        print(f"{name} c{concurrency} r{repeat}: FAILED rc={done.returncode}", flush=True)
        return run
    summary = json.loads(result.read_text())["summary"]
    latency = summary["latency"]
    run.update(
        throughput_rps=summary["throughput_rps"],
        p50_ms=latency["p50_ms"],
        p99_ms=latency["p99_ms"],
        mean_ms=latency["mean_ms"],
        errors=summary["errors"],
        server_cores=server_cpu / summary["span_s"],
        generator_cpu_per_request_us=summary["generator"]["cpu_per_request_us"],
    )
    print(
        f"{name} c{concurrency} r{repeat}: {run['throughput_rps']:,.0f}/s p50 {run['p50_ms']:.3f} ms "
        f"p99 {run['p99_ms']:.3f} ms, server {run['server_cores']:.2f} cores",
        flush=True,
    )
    return run


def _plot(report: dict[str, Any], path: Path) -> None:
    settings = report["settings"]
    protocol = settings.get("protocol", "http")  # results made before --protocol existed were over HTTP
    title = f"adaserve vs KServe's Python server, the {settings['model']} at batch 1 over {protocol}"
    paired_plot(report, path, SERVERS, title, tick=lambda name: f"concurrency {name[1:]}")


def _print(report: dict[str, Any], output: Path) -> None:
    paired_table(report, SERVERS, ("KServe", "adaserve"))
    print(f"wrote {output}")


if __name__ == "__main__":
    raise SystemExit(main())
