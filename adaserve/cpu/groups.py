"""Core groups: several node servers on one machine, each on cores of its own, sharing the ports.

One frontend process spends 0.2-0.9 ms of a core on each request, so on a machine of many cores the frontend, not
the workers, caps a small model. There several `adaserve serve --reuse-port --cpus LIST` run side by side: the
kernel spreads new connections over their listening sockets (SO_REUSEPORT), and each server plans, with Packrat,
only the cores of its group. `core_groups` cuts this process's cores into such groups (the node actor of a cluster
asks it how to start its servers); `restrict_to` is what `--cpus` does in the server before anything starts.
"""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path

from adaserve.cpu.topology import AllocationError, Cpu, Topology, machine_topology
from adaserve.errors import ConfigError

__all__ = ["core_groups", "format_cpus", "parse_cpus", "restrict_to"]


def parse_cpus(text: str) -> list[int]:
    """A CPU list as the kernel and `taskset -c` write it (`0-3`, `0,2,4-7`) → the sorted CPU ids. Strict, unlike
    `topology.parse_cpulist` (which reads what the kernel wrote): a user's typo is refused with what was wrong,
    never read as some other set of cores."""
    cpus: set[int] = set()
    for part in text.split(","):
        low, dash, high = part.strip().partition("-")
        if not (low.isascii() and low.isdigit()) or (dash and not (high.isascii() and high.isdigit())):
            raise ValueError(f"expected CPU ids and ranges such as 0-3 or 0,2,4-7; got {text!r}")
        first, last = int(low), int(high) if dash else int(low)
        if last < first:
            raise ValueError(f"the range {part.strip()} runs backwards in {text!r}")
        cpus.update(range(first, last + 1))
    return sorted(cpus)


def format_cpus(cpus: Iterable[int]) -> str:
    """CPU ids → the kernel's compact list (`[0, 1, 2, 3, 8]` → `0-3,8`), as `--cpus` takes it."""
    ranges: list[list[int]] = []
    for cpu in sorted(set(cpus)):
        if ranges and cpu == ranges[-1][1] + 1:
            ranges[-1][1] = cpu
        else:
            ranges.append([cpu, cpu])
    return ",".join(str(low) if low == high else f"{low}-{high}" for low, high in ranges)


def restrict_to(cpus: Sequence[int]) -> list[int]:
    """Run this process, every thread it has now and every thread and process it starts later, on `cpus` only, so
    that all that plans with `os.sched_getaffinity(0)` (Packrat, the worker sets, the spare-core count) plans
    those cores, and the workers inherit them. A CPU this process may not use is refused, naming it. Returns the
    CPUs, sorted."""
    wanted = sorted(set(cpus))
    usable = os.sched_getaffinity(0)
    missing = [cpu for cpu in wanted if cpu not in usable]
    if not wanted or missing:
        raise ConfigError(
            f"--cpus: CPUs {format_cpus(missing) or 'none'} are not available to this process "
            f"(it may use {format_cpus(usable)})"
        )
    # sched_setaffinity(0) sets the calling thread's mask only: the threads already started (gRPC's, imported
    # with the command line) are each set too; a thread or process started later inherits its creator's mask.
    for task in _threads():
        try:
            os.sched_setaffinity(task, wanted)
        except ProcessLookupError:
            continue  # the thread ended meanwhile
    os.sched_setaffinity(0, wanted)
    return wanted


def _threads() -> list[int]:
    try:
        return [int(task.name) for task in Path("/proc/self/task").iterdir()]
    except OSError:
        return []


def core_groups(count: int, topology: Topology | None = None) -> list[list[int]]:
    """This process's CPUs (or `topology`'s) cut into `count` disjoint groups, one per node server, each a sorted
    list of CPU ids for its `--cpus`.

    When the machine has several NUMA nodes and `count` is a multiple of their number, each node is cut into
    `count / nodes` groups, so no server's memory and cores straddle nodes. Otherwise the cores are cut in order
    (by node, then CPU id) into contiguous groups. Either way a physical core's SMT siblings stay in one group
    (two frontends on one core's execution units would slow each other) unless there are fewer physical cores
    than groups; groups differ in size by at most one core, and every CPU is in one."""
    if count < 1:
        raise ValueError(f"expected 1 group or more; got {count}")
    topology = topology or machine_topology()
    if len(topology.cpus) < count:
        raise AllocationError(f"cannot cut {len(topology.cpus)} CPUs into {count} groups ({topology.describe()})")
    nodes: dict[int, list[Cpu]] = defaultdict(list)
    for cpu in topology.cpus:
        nodes[cpu.node].append(cpu)
    if len(nodes) > 1 and count % len(nodes) == 0 and all(len(cpus) >= count // len(nodes) for cpus in nodes.values()):
        return [group for node in sorted(nodes) for group in _cut(nodes[node], count // len(nodes))]
    return _cut(list(topology.cpus), count)


def _cut(cpus: list[Cpu], count: int) -> list[list[int]]:
    """`cpus` in `count` contiguous groups of whole physical cores (of single CPUs when cores are too few)."""
    cores: dict[tuple[int, int], list[int]] = defaultdict(list)
    for cpu in sorted(cpus, key=lambda c: (c.node, c.id)):
        cores[cpu.socket, cpu.core].append(cpu.id)
    units = list(cores.values()) if len(cores) >= count else [[cpu.id] for cpu in sorted(cpus, key=_thread_order)]
    size, extra = divmod(len(units), count)
    groups, start = [], 0
    for index in range(count):
        end = start + size + (index < extra)
        groups.append(sorted(cpu for unit in units[start:end] for cpu in unit))
        start = end
    return groups


def _thread_order(cpu: Cpu) -> tuple[int, int, int, int]:
    """Cores in order, each core's siblings together, when groups must split cores."""
    return (cpu.node, cpu.socket, cpu.core, cpu.sibling)
