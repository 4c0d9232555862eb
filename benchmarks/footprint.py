"""What `adaserve serve` costs before it serves a request: the time to ready and the memory of its processes.

Starts the server on the example repository (three ~1 MB models, default configs) as a user would, polls
`/v2/health/ready` every 20 ms from the moment the process starts, then, once the models' processes have settled,
reads every process of the server's tree: its PSS (each shared page divided among the processes sharing it, so the
sum is what the tree adds to the machine), USS (pages only it holds) and RSS, by role (server, zygote, host,
worker, and the profiler: the examples leave `workers` out, so a model with no profile of this machine is profiled
in the background from its first load sample on). Which examples already had a profile is recorded. Repeated in
fresh servers; the medians are judged against issue 53's bars: ready in at most 4 s, total PSS at most 400 MiB.

Usage: .venv/bin/python -m benchmarks.footprint [--repeats 3] [--quick]
Writes benchmarks/results/footprint.json and .png (--quick: one repeat, under benchmarks/results/tmp/).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from adaserve.cpu.profiler import PROFILE_FILE, PROFILER_NAME
from adaserve.engine.footprint import ProcessMemory
from benchmarks.common import (
    RESULTS,
    SCRATCH,
    figure,
    finish_report,
    load_average,
    report_head,
    tree_cpu_s,
    tree_depths,
)
from tests.server_utils import EXAMPLES, free_ports, serve_command, stop_server

BARS = {"ready_s": 4.0, "pss_mib": 400.0}
ROLES = ("server", "zygote", "host", "worker", "profiler")
MIB = 1 << 20
SETTLE_S = 2.0  # after ready: the workers' first passes and the server's first collections have run
#: The zygote's preparation (`adaserve.engine.zygote.prepare`), a step at a time: what runs, and what it is.
ZYGOTE_STEPS = (
    ("import torch", "torch"),
    ("from adaserve.engine import host", "the engine"),
    ("import torch._dynamo", "torch._dynamo, which torch.export.load's deserializer imports"),
    ("host.prime_program_loading()", "the rest of the first program load"),
)
_REPLAY = """
import json, sys, time
def rss_mib():
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) / 1024 for line in status if line.startswith("VmRSS:"))
steps = [{"step": "interpreter", "rss_mib": rss_mib(), "s": 0.0}]
for code, name in json.loads(sys.argv[1]):
    began = time.perf_counter()
    exec(code)
    steps.append({"step": name, "rss_mib": rss_mib(), "s": time.perf_counter() - began})
print(json.dumps(steps))
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=None, help="fresh servers measured (default 3, quick 1)")
    parser.add_argument("--quick", action="store_true", help="one repeat, written under benchmarks/results/tmp/")
    parser.add_argument("--output", type=Path, default=None)
    args = parser.parse_args()
    repeats = args.repeats or (1 if args.quick else 3)
    output: Path = args.output or (SCRATCH / "footprint-quick.json" if args.quick else RESULTS / "footprint.json")
    profiled = sorted(path.parent.name for path in EXAMPLES.glob(f"*/{PROFILE_FILE}"))  # start on Packrat's plan
    settings = {"repository": str(EXAMPLES), "repeats": repeats, "settle_s": SETTLE_S, "profiled_models": profiled}
    report = report_head("footprint", settings)
    report["runs"] = [measure_start(EXAMPLES) for _ in range(repeats)]
    report["zygote_steps"] = zygote_steps()
    report["load_end"] = load_average()
    report["median"] = {key: statistics.median(run[key] for run in report["runs"]) for key in ("ready_s", "pss_mib")}
    report["bars"] = {
        key: {"measured": report["median"][key], "target": f"<= {limit:g}", "pass": report["median"][key] <= limit}
        for key, limit in BARS.items()
    }
    return finish_report(report, output, _plot, _print)


def measure_start(repository: Path) -> dict[str, Any]:
    """Start a server on `repository`; its time to ready, and its processes' memory once settled."""
    http_port, grpc_port = free_ports(2)
    command = serve_command(repository, http_port, grpc_port)
    began = time.perf_counter()
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
    try:
        ready_s = _wait_ready(process, f"http://127.0.0.1:{http_port}/v2/health/ready", began)
        cpu_s = tree_cpu_s(process.pid)
        time.sleep(SETTLE_S)
        processes = [_memory(pid, role) for pid, role in _tree_roles(process.pid).items()]
    finally:
        stop_server(process)
    processes = [p for p in processes if p is not None]
    return {
        "ready_s": ready_s,
        "cpu_s_to_ready": cpu_s,
        "processes": len(processes),
        "pss_mib": sum(p["pss_mib"] for p in processes),
        "uss_mib": sum(p["uss_mib"] for p in processes),
        "rss_mib": sum(p["rss_mib"] for p in processes),
        "by_role": {
            role: {
                "count": sum(p["role"] == role for p in processes),
                "pss_mib": sum(p["pss_mib"] for p in processes if p["role"] == role),
                "uss_mib": sum(p["uss_mib"] for p in processes if p["role"] == role),
            }
            for role in ROLES
        },
    }


def zygote_steps() -> list[dict[str, Any]]:
    """The zygote's preparation replayed in a fresh interpreter: each step's resident memory after it (MiB) and its
    wall time (s). Its memory is the zygote's pages before it forks, which every host and worker shares."""
    replay = [sys.executable, "-c", _REPLAY, json.dumps(ZYGOTE_STEPS)]
    steps: list[dict[str, Any]] = json.loads(subprocess.run(replay, capture_output=True, check=True, text=True).stdout)
    return steps


def _wait_ready(process: subprocess.Popen[bytes], url: str, began: float, timeout_s: float = 120.0) -> float:
    while time.perf_counter() - began < timeout_s:
        if process.poll() is not None:
            raise RuntimeError(f"the server exited with code {process.returncode} before it was ready")
        try:
            with urllib.request.urlopen(url, timeout=1) as response:
                if response.status == 200:
                    return time.perf_counter() - began
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.02)
    raise TimeoutError(f"the server was not ready after {timeout_s} s")


def _tree_roles(root: int) -> dict[int, str]:
    """Every live process of the server's tree and its role, by its depth: the server, the zygote (its child that
    forks hosts), each host (the zygote's children) and each worker (a host's children); a model's background
    profile (a child of the zygote, as the hosts are, named `PROFILER_NAME`; with no usable profile of the model)
    and the process it forks per thread count are the profiler's."""
    roles = {pid: ROLES[min(depth, 3)] for pid, depth in tree_depths(root).items()}
    for pid in [pid for pid, role in roles.items() if role == "host" and _is_profiler(pid)]:
        roles.update(dict.fromkeys(tree_depths(pid), "profiler"))
    return roles


def _is_profiler(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip() == PROFILER_NAME
    except OSError:
        return False


def _memory(pid: int, role: str) -> dict[str, Any] | None:
    """One process's PSS, USS and RSS in MiB; None for one that exited meanwhile."""
    if not Path(f"/proc/{pid}").exists():
        return None
    held = ProcessMemory.of([pid])
    return {
        "pid": pid,
        "role": role,
        "pss_mib": held.pss_bytes / MIB,
        "uss_mib": held.uss_bytes / MIB,
        "rss_mib": held.rss_bytes / MIB,
    }


def _plot(report: dict[str, Any], path: Path) -> None:
    fig = figure(6.0, 3.2)
    axes = fig.add_subplot()
    runs = report["runs"]
    bottom = [0.0] * len(runs)
    for role in [role for role in ROLES if any(role in run["by_role"] for run in runs)]:
        heights = [run["by_role"].get(role, {"pss_mib": 0.0})["pss_mib"] for run in runs]
        axes.bar(range(len(runs)), heights, bottom=bottom, label=role)
        bottom = [b + h for b, h in zip(bottom, heights, strict=True)]
    axes.axhline(BARS["pss_mib"], color="black", linestyle="--", linewidth=1, label="bar")
    axes.set_xticks(range(len(runs)), [f"run {i + 1}\nready {run['ready_s']:.2f} s" for i, run in enumerate(runs)])
    axes.set_ylabel("PSS (MiB)")
    axes.set_title("adaserve serve on the example repository")
    axes.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def _print(report: dict[str, Any], path: Path) -> None:
    for run in report["runs"]:
        by_role = run["by_role"]
        roles = ", ".join(  # the roles the run recorded: results from before the profiler have none
            f"{role} {entry['count']} × {entry['pss_mib'] / max(1, entry['count']):.0f}"
            for role, entry in by_role.items()
        )
        print(
            f"ready {run['ready_s']:.2f} s; {run['processes']} processes, PSS {run['pss_mib']:.0f} MiB "
            f"(USS {run['uss_mib']:.0f}, RSS {run['rss_mib']:.0f}); PSS by role, MiB each: {roles}"
        )
    steps = report["zygote_steps"]
    print(
        "the zygote's preparation, MiB resident after each step (s): "
        + ", ".join(f"{step['step']} {step['rss_mib']:.0f} ({step['s']:.2f})" for step in steps)
    )
    for key, bar in report["bars"].items():
        print(f"{key}: median {bar['measured']:.2f}, bar {bar['target']}: {'pass' if bar['pass'] else 'missed'}")
    print(f"wrote {path}")


if __name__ == "__main__":
    raise SystemExit(main())
