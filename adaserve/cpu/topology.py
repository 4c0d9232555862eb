"""The machine's CPUs (sockets, NUMA nodes, physical cores, hyperthread siblings) and Packrat's core allocator (§3.4).

Read from sysfs (`/sys/devices/system/cpu/cpu*/topology`, `/sys/devices/system/node/node*/cpulist`) rather than
from a library, so tests can point it at a fake tree. `allocate` gives every worker of a plan its own CPUs:
disjoint sets, each inside one NUMA node of one socket when it fits (the paper keeps instances socket-local to
avoid cross-socket traffic), physical cores before hyperthread siblings (a sibling shares its core's execution
units, so a second thread there adds little). The worker applies its set itself (`adaserve.engine.worker.place`:
`sched_setaffinity` and `torch.set_num_threads`).
"""

from __future__ import annotations

import os
import re
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from adaserve.config import WorkerSpec
from adaserve.errors import ConfigError

__all__ = ["SYSFS", "AllocationError", "Cpu", "Topology", "allocate", "machine_topology", "parse_cpulist"]

#: Where Linux describes CPUs and NUMA nodes.
SYSFS = Path("/sys/devices/system")


class AllocationError(ConfigError):
    """The plan asks for more threads than the machine (or this process's CPU set) has."""


@dataclass(frozen=True, order=True)
class Cpu:
    """One logical CPU. `sibling` is 0 for the first logical CPU of a physical core, 1.. for its SMT siblings."""

    id: int
    socket: int
    core: int  # core_id, unique within its socket
    node: int  # NUMA node (the socket when the kernel exposes no NUMA information)
    sibling: int = 0


@dataclass(frozen=True)
class Topology:
    cpus: tuple[Cpu, ...]

    @property
    def sockets(self) -> int:
        return len({c.socket for c in self.cpus})

    @property
    def numa_nodes(self) -> int:
        return len({c.node for c in self.cpus})

    @property
    def physical_cores(self) -> int:
        return len({(c.socket, c.core) for c in self.cpus})

    @property
    def ids(self) -> list[int]:
        return [c.id for c in self.cpus]

    def describe(self) -> str:
        smt = len(self.cpus) // max(self.physical_cores, 1)
        return (
            f"{len(self.cpus)} CPUs: {self.physical_cores} physical cores × {smt} thread(s), "
            f"{self.sockets} socket(s), {self.numa_nodes} NUMA node(s)"
        )


def parse_cpulist(text: str) -> list[int]:
    """`0-3,8,10-11` → [0, 1, 2, 3, 8, 10, 11] (the kernel's cpulist format)."""
    cpus: list[int] = []
    for part in text.strip().split(","):
        if not part:
            continue
        low, _, high = part.partition("-")
        cpus.extend(range(int(low), int(high or low) + 1))
    return cpus


def read_topology(sysfs: Path = SYSFS, allowed: Iterable[int] | None = None) -> Topology:
    """The CPUs under `sysfs`, limited to `allowed`; missing topology or NUMA files degrade to one core per CPU."""
    cpu_root = sysfs / "cpu"
    online = _read(cpu_root / "online")
    ids = parse_cpulist(online) if online is not None else _cpu_dirs(cpu_root)
    if allowed is not None:
        wanted = set(allowed)
        ids = [i for i in ids if i in wanted]
    nodes = _numa_nodes(sysfs / "node")
    raw = []
    for cpu in ids:
        topology = cpu_root / f"cpu{cpu}" / "topology"
        socket = _read_int(topology / "physical_package_id", default=0)
        core = _read_int(topology / "core_id", default=cpu)
        raw.append((cpu, socket, core, nodes.get(cpu, socket)))
    first_seen: dict[tuple[int, int], int] = defaultdict(int)
    cpus = []
    for cpu, socket, core, node in sorted(raw):
        cpus.append(Cpu(cpu, socket, core, node, sibling=first_seen[socket, core]))
        first_seen[socket, core] += 1
    if not cpus:
        raise AllocationError(f"{cpu_root}: no usable CPUs found")
    return Topology(tuple(cpus))


def machine_topology() -> Topology:
    """This machine's CPUs that this process may run on (a container's cpuset is respected)."""
    return read_topology(SYSFS, os.sched_getaffinity(0))


def _cpu_dirs(cpu_root: Path) -> list[int]:
    if not cpu_root.is_dir():
        return sorted(os.sched_getaffinity(0))
    return sorted(int(m.group(1)) for p in cpu_root.iterdir() if (m := re.fullmatch(r"cpu(\d+)", p.name)))


def _numa_nodes(node_root: Path) -> dict[int, int]:
    """CPU id → NUMA node; empty when the kernel has no NUMA directory (containers, some VMs)."""
    mapping: dict[int, int] = {}
    if not node_root.is_dir():
        return mapping
    for entry in node_root.iterdir():
        match = re.fullmatch(r"node(\d+)", entry.name)
        text = _read(entry / "cpulist") if match else None
        if match and text is not None:
            for cpu in parse_cpulist(text):
                mapping[cpu] = int(match.group(1))
    return mapping


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def _read_int(path: Path, default: int) -> int:
    text = _read(path)
    try:
        return int(text) if text is not None else default
    except ValueError:
        return default


# -- allocation ----------------------------------------------------------------------------------------------------


def allocate(instances: Iterable[tuple[int, int, int]], topology: Topology) -> list[WorkerSpec]:
    """One `WorkerSpec(batch, threads, cpus)` per worker of a plan [(count, threads, batch)], on disjoint CPUs.

    Workers are placed largest first (first-fit decreasing keeps big workers whole). Each takes, in order of
    preference, free physical cores in one NUMA node, in one socket, anywhere; then the same with SMT siblings.
    Within a scope the group with the fewest free CPUs that still fits is chosen (best fit), so the large holes
    are kept for large workers. The result is in plan order.
    """
    wanted = [(threads, batch) for count, threads, batch in instances for _ in range(count)]
    total = sum(t for t, _ in wanted)
    if any(t < 1 for t, _ in wanted) or any(b < 1 for _, b in wanted):
        raise AllocationError(f"every worker needs ≥ 1 thread and batch ≥ 1, got {wanted}")
    if total > len(topology.cpus):
        raise AllocationError(
            f"the plan needs {total} threads but only {len(topology.cpus)} CPUs are available "
            f"({topology.describe()}); ask for T ≤ {len(topology.cpus)}"
        )
    free = set(topology.cpus)
    placed: dict[int, list[int]] = {}
    for index in sorted(range(len(wanted)), key=lambda i: -wanted[i][0]):
        chosen = _take(free, wanted[index][0])
        free.difference_update(chosen)
        placed[index] = sorted(c.id for c in chosen)
    return [WorkerSpec(batch=b, threads=t, cpus=tuple(placed[i])) for i, (t, b) in enumerate(wanted)]


def _take(free: set[Cpu], threads: int) -> list[Cpu]:
    """`threads` free CPUs from the most local group that holds them; physical cores before siblings."""
    for physical_only in (True, False):
        pool = [c for c in free if c.sibling == 0] if physical_only else list(free)
        for scope in (_by_node, _by_socket, _whole):
            groups = [g for g in scope(pool) if len(g) >= threads]
            if groups:
                best = min(groups, key=lambda g: (len(g), min(c.id for c in g)))
                return sorted(best, key=_preference)[:threads]
    raise AllocationError(f"no {threads} free CPUs left")  # unreachable: the total was checked


def _preference(cpu: Cpu) -> tuple[int, int, int, int]:
    """First siblings of each core first, then cores in order, so a worker's threads sit on distinct cores."""
    return (cpu.sibling, cpu.node, cpu.core, cpu.id)


def _by_node(cpus: Sequence[Cpu]) -> list[list[Cpu]]:
    return _group(cpus, lambda c: (c.socket, c.node))


def _by_socket(cpus: Sequence[Cpu]) -> list[list[Cpu]]:
    return _group(cpus, lambda c: (c.socket,))


def _whole(cpus: Sequence[Cpu]) -> list[list[Cpu]]:
    return [list(cpus)] if cpus else []


def _group(cpus: Sequence[Cpu], key: Callable[[Cpu], tuple[int, ...]]) -> list[list[Cpu]]:
    groups: dict[tuple[int, ...], list[Cpu]] = defaultdict(list)
    for cpu in cpus:
        groups[key(cpu)].append(cpu)
    return list(groups.values())
