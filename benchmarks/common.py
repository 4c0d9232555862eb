"""What every benchmark records the same way: the machine, the load average, the CPU a process tree used, the JSON.

The machine is shared with other work, so every run stores the load average before and after it; a figure taken
while the load average was well above the core count is a figure about a busy machine.
"""

from __future__ import annotations

import json
import math
import os
import platform
import shlex
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
#: Scratch space (git-ignored): model repositories, server logs, the per-request records of every run.
SCRATCH = RESULTS / "tmp"
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def machine() -> dict[str, Any]:
    """CPU model, cores, kernel and the software versions that shape the figures."""
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
    }


def command_line() -> str:
    """How this benchmark was started, as a shell line that repeats it from the repository root."""
    module = Path(sys.argv[0]).resolve()
    try:
        name = ".".join(module.relative_to(ROOT).with_suffix("").parts)
    except ValueError:
        return shlex.join([sys.executable, *sys.argv])
    return shlex.join([os.path.relpath(sys.executable, ROOT), "-m", name, *sys.argv[1:]])


def load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def machine_busy_s() -> float:
    """CPU seconds all processes on the machine have used since boot (user, nice, system, irq, steal)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields[:8]
    return (user + nice + system + irq + softirq + steal) / _CLOCK_TICKS


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
    busy, so a run does not start in the middle of someone else's burst; returns the wait and the last reading."""
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
    parents: dict[int, int] = {}
    times: dict[int, float] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()  # the command name may hold spaces
        parents[int(entry.name)] = int(fields[1])
        times[int(entry.name)] = (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS
    tree, frontier = {pid}, [pid]
    while frontier:
        parent = frontier.pop()
        children = [child for child, p in parents.items() if p == parent and child not in tree]
        tree.update(children)
        frontier += children
    return sum(times.get(p, 0.0) for p in tree)


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
