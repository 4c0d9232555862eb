"""What keeps the machine's CPUs busy, read from /proc: the whole machine's CPU time, one process's, and the cores
the server's own workers leave (`SpareCores`), which decides whether a worker may poll between batches.
"""

from __future__ import annotations

import os
import time
from collections import deque
from collections.abc import Callable, Collection, Iterable
from pathlib import Path

__all__ = ["SpareCores", "machine_busy_s", "process_cpu_s", "process_stat"]

_TICKS = os.sysconf("SC_CLK_TCK")


def machine_busy_s(cpus: Collection[int] | None = None) -> float:
    """CPU seconds the machine's processes have used since boot (user, nice, system, irq, softirq, steal): on every
    CPU, or on `cpus` alone."""
    lines = Path("/proc/stat").read_text().splitlines()
    if cpus is None:
        return _busy_ticks(lines[0]) / _TICKS
    wanted = {f"cpu{cpu}" for cpu in cpus}
    return sum(_busy_ticks(line) for line in lines[1:] if line.split(" ", 1)[0] in wanted) / _TICKS


def process_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) process `pid` has used so far, its threads included."""
    return process_stat(pid)[1]


def process_stat(pid: int) -> tuple[int, float]:
    """Process `pid`'s parent and its CPU seconds (user + system) so far; OSError once it has exited."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()  # the command's name may hold spaces
    return int(fields[1]), (int(fields[11]) + int(fields[12])) / _TICKS


def _busy_ticks(line: str) -> int:
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in line.split()[1:9])
    return user + nice + system + irq + softirq + steal


class SpareCores:
    """The cores of this process's CPU set that nothing but the server's own workers used, over about the last
    second, sampled at most every 0.1 s: the CPUs less the frontend (this process) and every other program on them.

    The workers' own CPU (`worker_pids`: their batches and their polling) is left out because the scheduler counts it
    itself, as busy threads and pollers. Counting only the frontend, as this once did, let workers poll beside a
    client on the same two cores: over gRPC at concurrency 8 polling took a third of the throughput
    (1,743-2,394 req/s against 2,653-2,867 without it)."""

    def __init__(self, worker_pids: Callable[[], Iterable[int]]) -> None:
        self._cpus = sorted(os.sched_getaffinity(0))
        self._worker_pids = worker_pids
        self._worker_cpu: dict[int, float] = {}  # each worker's CPU seconds at the last sample
        self._workers_s = 0.0  # the workers' CPU seconds summed over samples (a worker that exits keeps its share)
        # (monotonic time, the CPU seconds the machine used less the workers')
        self._samples: deque[tuple[float, float]] = deque()
        self.spare = float(len(self._cpus))
        self.update(time.monotonic())

    def update(self, now: float) -> float:
        """The spare cores at `now` (monotonic): a new sample once 0.1 s have passed since the last."""
        if not self._samples or now - self._samples[-1][0] >= 0.1:
            try:
                self._samples.append(self._sample(now))
            except OSError:
                return self.spare  # /proc unreadable now (the open files exhausted, say): the last figure stands
            if len(self._samples) < 2:
                return self.spare
            while len(self._samples) > 2 and now - self._samples[1][0] >= 1.0:
                self._samples.popleft()
            (then, used_then), (at, used_now) = self._samples[0], self._samples[-1]
            # /proc/stat counts in ticks: on CPUs busy throughout, a window can read a little over its length
            busy = min(float(len(self._cpus)), max(0.0, used_now - used_then) / (at - then))
            self.spare = len(self._cpus) - busy
        return self.spare

    def _sample(self, now: float) -> tuple[float, float]:
        readings: dict[int, float] = {}
        for pid in self._worker_pids():
            try:
                readings[pid] = process_cpu_s(pid)
            except (OSError, ValueError, IndexError):
                continue  # exited since it was listed
        # A worker seen for the first time adds nothing yet: what it used before is not this window's.
        self._workers_s += sum(cpu - self._worker_cpu.get(pid, cpu) for pid, cpu in readings.items())
        self._worker_cpu = readings
        return now, machine_busy_s(self._cpus) - self._workers_s
