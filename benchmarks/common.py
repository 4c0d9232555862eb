"""What every benchmark records the same way: the machine, the load average, the CPU a process tree used, the JSON.

The machine is shared with other work, so every run stores the load average before and after it; a figure taken
while the load average was well above the core count is a figure about a busy machine.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Coroutine, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from adaserve.datasets import load_fashion_mnist
from adaserve.engine.machine_cpu import machine_busy_s, process_stat

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
#: Scratch space (git-ignored): model repositories, server logs, the per-request records of every run.
SCRATCH = RESULTS / "tmp"
#: Each example model's input row.
ROWS = {"mlp": (784,), "cnn": (1, 28, 28)}
#: The `packrat` block of a benchmark's model that leaves `workers` out: it serves the default set throughout, with
#: no background profile that would switch it to Packrat's plan mid-run (the Packrat benchmarks measure that).
DEFAULT_SET_ONLY = {"background_profile": False}


def machine() -> dict[str, Any]:
    """CPU model, cores, kernel and the software versions that shape the figures, this code's among them: the commit
    it ran at and whether the tree differed from it (`code_version`)."""
    import torch

    cpu_model = platform.processor() or platform.machine()
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            cpu_model = line.split(":", 1)[1].strip()
            break
    memory_kib = next(
        (
            int(line.split()[1])
            for line in Path("/proc/meminfo").read_text().splitlines()
            if line.startswith("MemTotal")
        ),
        0,
    )
    return {
        "cpu_model": cpu_model,
        "cores": os.cpu_count(),
        "cores_usable": len(os.sched_getaffinity(0)),
        "memory_gib": round(memory_kib / 2**20, 1),
        "kernel": platform.release(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        # A benchmark's CUDA side runs on this GPU; a CPU-only run records None.
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        **code_version(),
    }


def code_version() -> dict[str, Any]:
    """`commit`: the commit checked out (`git rev-parse HEAD`); `dirty`: whether the tree had changes against it,
    results under `benchmarks/results/` aside (an earlier run's result, not yet committed, changes no figure). Both
    None outside a git checkout. `python -m benchmarks.stale` reads them."""
    try:
        commit = _git("rev-parse", "HEAD")
        changes = _git("status", "--porcelain", "--", ".", ":(exclude)benchmarks/results")
    except (OSError, subprocess.CalledProcessError):
        return {"commit": None, "dirty": None}
    return {"commit": commit, "dirty": bool(changes)}


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()


def command_line() -> str:
    """How this benchmark was started, as a shell line that repeats it from the repository root."""
    module = Path(sys.argv[0]).resolve()
    try:
        name = ".".join(module.relative_to(ROOT).with_suffix("").parts)
    except ValueError:
        return shlex.join([sys.executable, *sys.argv])
    return shlex.join([os.path.relpath(sys.executable, ROOT), "-m", name, *sys.argv[1:]])


def shown_path(path: Path) -> str:
    """`path` relative to the checkout when it lies inside it (records stay comparable across checkouts), else
    absolute (a smoke run's scratch directory)."""
    resolved = path.resolve()
    return str(resolved.relative_to(ROOT)) if resolved.is_relative_to(ROOT) else str(resolved)


def process_command(pid: int) -> str:
    """The command line a running process was started with, as one string (for a result file)."""
    parts = Path(f"/proc/{pid}/cmdline").read_bytes().rstrip(b"\0").split(b"\0")
    return " ".join(part.decode() for part in parts)


def real_images(count: int, model: str) -> np.ndarray:
    """The first `count` Fashion-MNIST test images shaped as rows of an example model's input (float32 in [0, 1],
    as `load_fashion_mnist` gives them and the examples were trained on)."""
    images, _ = load_fashion_mnist("test")
    return images[:count].reshape(count, *ROWS[model])


def load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


@contextmanager
def load_window(record: dict[str, Any]) -> Iterator[None]:
    """Stores in `record`: `load_before`/`load_after` (1, 5, 15-minute load averages), `wall_s`, and
    `machine_busy_cores`, the cores the whole machine kept busy on average during the block (ours and others')."""
    record["load_before"] = load_average()
    began, busy = time.monotonic(), machine_busy_s()
    try:
        yield
    finally:
        record["wall_s"] = round(time.monotonic() - began, 2)
        record["machine_busy_cores"] = round((machine_busy_s() - busy) / max(record["wall_s"], 1e-3), 3)
        record["load_after"] = load_average()


def wait_for_quiet(max_wait_s: float, busy_cores: float = 0.3) -> dict[str, float]:
    """Wait (at most `max_wait_s`) for a one-second window in which the machine keeps fewer than `busy_cores`
    busy, so a run does not start in the middle of someone else's burst; returns the wait and the last reading.
    With `max_wait_s` ≤ 0 it returns at once."""
    if max_wait_s <= 0:
        return {"waited_s": 0.0}
    began = time.monotonic()
    while True:
        before = machine_busy_s()
        time.sleep(1.0)
        busy = machine_busy_s() - before
        waited = time.monotonic() - began
        if busy < busy_cores or waited >= max_wait_s:
            return {"waited_s": round(waited, 1), "busy_cores_before": round(busy, 2)}


def tree_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) used so far by process `pid` and its live descendants (a server's workers)."""
    return sum(_tree_times(pid).values())


class TreeCPU:
    """CPU seconds used by a process and its descendants, the ones that exited since included: every `sample`
    remembers each descendant's last reading (a worker retired by a reconfiguration would take its CPU with it,
    and show up as other people's work)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self._last: dict[int, float] = {}

    def sample(self) -> float:
        self._last.update(_tree_times(self.pid))
        return sum(self._last.values())


def _tree_times(pid: int) -> dict[int, float]:
    """CPU seconds of `pid` and each of its live descendants."""
    stats = _process_stats()
    return {p: stats[p][1] for p in tree_depths(pid, stats)}


def tree_depths(pid: int, stats: dict[int, tuple[int, float]] | None = None) -> dict[int, int]:
    """`pid` and each of its live descendants, with its depth below `pid` (0 for `pid`, 1 for its children...);
    `stats`: a reading of /proc (`_process_stats`) already at hand."""
    parents = {child: parent for child, (parent, _) in (stats or _process_stats()).items()}
    depths, frontier = {pid: 0}, [pid]
    while frontier:
        parent = frontier.pop()
        children = [child for child, p in parents.items() if p == parent and child not in depths]
        depths.update((child, depths[parent] + 1) for child in children)
        frontier += children
    return depths


def _process_stats() -> dict[int, tuple[int, float]]:
    """Every live process's parent and CPU seconds, in one pass over /proc."""
    stats: dict[int, tuple[int, float]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stats[int(entry.name)] = process_stat(int(entry.name))
        except OSError:
            continue
    return stats


def server_stats_delta(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """What the server did during a run: batches by size, mean batch, compute per batch, queue time per request."""
    old = {b["batch_size"]: b["compute_infer"] for b in before.get("batch_stats", [])}
    batches, compute_ms = {}, {}
    for entry in after.get("batch_stats", []):
        size, now = entry["batch_size"], entry["compute_infer"]
        count = now["count"] - old.get(size, {"count": 0})["count"]
        if count > 0:
            batches[size] = count
            compute_ms[size] = (now["ns"] - old.get(size, {"ns": 0})["ns"]) / count / 1e6
    queue = {k: after["inference_stats"]["queue"][k] - before["inference_stats"]["queue"][k] for k in ("count", "ns")}
    total = sum(batches.values())
    return {
        "batches": batches,
        "compute_ms_per_batch": compute_ms,
        "mean_batch": sum(size * n for size, n in batches.items()) / total if total else None,
        "queue_ms_mean": queue["ns"] / queue["count"] / 1e6 if queue["count"] > 0 else None,
    }


def add_noise_arguments(parser: argparse.ArgumentParser, *, run: str) -> None:
    """`--noise-cores`, `--attempts` and `--quiet-s`: how a benchmark on a shared machine treats a `run` during which
    other work was busy (made again after a quiet second, the quietest kept)."""
    parser.add_argument(
        "--noise-cores",
        type=float,
        default=0.25,
        help=f"a {run} during which other work took more CPU than this (cores) is made again (default 0.25)",
    )
    parser.add_argument("--attempts", type=int, default=3, help=f"{run}s made at most (default 3)")
    parser.add_argument(
        "--quiet-s",
        type=float,
        default=15.0,
        help=f"before each {run}, wait at most this long for a quiet second (default 15)",
    )


def add_seeds_argument(parser: argparse.ArgumentParser, *, build: str, each: str) -> None:
    """`--seeds 0,1,2` (the default) for a benchmark whose headline is the median over fresh builds: a `build` per
    seed, the first seed running every part, and `each` seed what its bars read."""

    def seed_list(text: str) -> list[int]:
        try:
            seeds = [int(part) for part in text.split(",")]
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r}: seeds are integers separated by commas, e.g. 0,1,2") from None
        if len(set(seeds)) != len(seeds):
            raise argparse.ArgumentTypeError(f"{text!r}: a seed repeated builds the same thing twice")
        return seeds

    parser.add_argument(
        "--seeds",
        type=seed_list,
        default=[0, 1, 2],
        metavar="0,1,2",
        help=f"a {build} per seed; the first runs every part, each one {each} (default 0,1,2)",
    )


#: Set in the network namespace a benchmark re-runs itself in.
_IN_OWN_NETWORK = "ADASERVE_BENCH_OWN_NETWORK"


def rerun_in_own_network_namespace(module: str) -> int | None:
    """Run `python -m module` with this process's arguments again in a network namespace of its own (`unshare -rn`:
    no privileges, a loopback of its own, nothing outside reachable) and return its exit status; None when this is
    that run, whose loopback is then up. For a benchmark that shapes loopback, or runs servers that bind every
    interface whatever they are asked (Ray)."""
    if os.environ.get(_IN_OWN_NETWORK) == "1":
        subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
        return None
    command = ["unshare", "-rn", sys.executable, "-m", module, *sys.argv[1:]]
    return subprocess.run(command, env={**os.environ, _IN_OWN_NETWORK: "1"}, check=False).returncode


def report_head(benchmark: str, settings: dict[str, Any]) -> dict[str, Any]:
    """What a result file begins with: the benchmark, the command that repeats it, the machine, when it started and
    the load average then, and its settings."""
    return {
        "benchmark": benchmark,
        "command": command_line(),
        "machine": machine(),
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "load_start": load_average(),
        "settings": settings,
    }


def finish_report(
    report: dict[str, Any],
    output: Path,
    plot: Callable[[dict[str, Any], Path], None],
    show: Callable[[dict[str, Any], Path], None],
) -> int:
    """Write a finished result: the JSON at `output`, the PNG `plot` draws beside it, the table `show` prints (given
    the JSON's path); 0, the benchmark's exit status."""
    write_json(report, output)
    plot(report, output.with_suffix(".png"))
    show(report, output)
    return 0


def ms_text(value: float | None) -> str:
    """A latency in milliseconds to three decimals for a printed table, or "-" where there is none."""
    return "-" if value is None else f"{value:.3f}"


def write_json(data: dict[str, Any], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(_finite(data), indent=2) + "\n")


def _finite(value: Any) -> Any:
    """NaN and infinities become None, so the file is strict JSON."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def figure(width: float, height: float) -> Any:
    """A matplotlib figure from the object API (no pyplot, no display), as adaserve.bench's plots make them."""
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height))


@contextmanager
def pinned(cores: Sequence[int] | None) -> Iterator[None]:
    """This process on `cores` (None: as it is) while the block runs, so the processes it starts there inherit
    them."""
    if cores is None:
        yield
        return
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cores)
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def serve_on_port(serve: Callable[..., Coroutine[Any, Any, None]], description: str, loops: Sequence[str] = ()) -> None:
    """A floor server's command line (`benchmarks.rest_floor`, `benchmarks.grpc_floor`): `--port PORT`, and
    `--loop` among `loops` where it has several (the first by default), served on uvloop, as adaserve's frontend
    runs, until terminated."""
    import uvloop

    parser = argparse.ArgumentParser(description=description.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    if loops:
        parser.add_argument("--loop", choices=loops, default=loops[0])
    args = parser.parse_args()
    uvloop.run(serve(args.port, args.loop) if loops else serve(args.port))
