"""Reading sysfs topologies (fake trees and this machine) and placing workers on disjoint, local CPU sets."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest
import yaml

from adaserve.config import WorkerSpec
from adaserve.cpu.topology import AllocationError, Topology, allocate, machine_topology, parse_cpulist, read_topology


def fake_sysfs(
    root: Path, *, sockets: int, cores: int, smt: int = 1, nodes_per_socket: int = 1, numa: bool = True
) -> Path:
    """Write a tree under `root`; CPU ids run over every core's first thread, then every core's second, ..."""
    per_node = cores // nodes_per_socket
    node_cpus: dict[int, list[int]] = {}
    total = sockets * cores * smt
    for sibling in range(smt):
        for socket in range(sockets):
            for core in range(cores):
                cpu = sibling * sockets * cores + socket * cores + core
                topology = root / "cpu" / f"cpu{cpu}" / "topology"
                topology.mkdir(parents=True)
                (topology / "physical_package_id").write_text(f"{socket}\n")
                (topology / "core_id").write_text(f"{core}\n")
                node_cpus.setdefault(socket * nodes_per_socket + core // per_node, []).append(cpu)
    (root / "cpu" / "online").write_text(f"0-{total - 1}\n")
    if numa:
        for node, cpus in node_cpus.items():
            (root / "node" / f"node{node}").mkdir(parents=True)
            (root / "node" / f"node{node}" / "cpulist").write_text(",".join(map(str, sorted(cpus))) + "\n")
    return root


def by_id(topology: Topology) -> dict[int, tuple[int, int, int, int]]:
    return {c.id: (c.socket, c.node, c.core, c.sibling) for c in topology.cpus}


def check_disjoint(workers: list[WorkerSpec], topology: Topology) -> None:
    seen: set[int] = set()
    for worker in workers:
        cpus = set(worker.cpus or ())
        assert len(cpus) == worker.threads
        assert not cpus & seen
        seen |= cpus
    assert seen <= set(topology.ids)


def sockets_of(worker: WorkerSpec, topology: Topology) -> set[int]:
    info = by_id(topology)
    return {info[c][0] for c in worker.cpus or ()}


def nodes_of(worker: WorkerSpec, topology: Topology) -> set[int]:
    info = by_id(topology)
    return {info[c][1] for c in worker.cpus or ()}


def test_parse_cpulist() -> None:
    assert parse_cpulist("0-3,8,10-11\n") == [0, 1, 2, 3, 8, 10, 11]
    assert parse_cpulist("") == []


def test_two_sockets_two_numa_nodes_with_smt(tmp_path: Path) -> None:
    topology = read_topology(fake_sysfs(tmp_path, sockets=2, cores=4, smt=2))
    assert (len(topology.cpus), topology.physical_cores, topology.sockets, topology.numa_nodes) == (16, 8, 2, 2)
    info = by_id(topology)
    assert info[0] == (0, 0, 0, 0) and info[4] == (1, 1, 0, 0)
    assert info[8] == (0, 0, 0, 1)  # cpu8 is core 0's second thread on socket 0
    assert "8 physical cores × 2 thread(s), 2 socket(s), 2 NUMA node(s)" in topology.describe()


def test_missing_numa_directory_falls_back_to_sockets(tmp_path: Path) -> None:
    topology = read_topology(fake_sysfs(tmp_path, sockets=2, cores=2, numa=False))
    assert topology.numa_nodes == 2
    assert {c.node for c in topology.cpus if c.socket == 1} == {1}


def test_missing_topology_files_mean_one_core_per_cpu(tmp_path: Path) -> None:
    for cpu in range(3):
        (tmp_path / "cpu" / f"cpu{cpu}").mkdir(parents=True)
    (tmp_path / "cpu" / "cpufreq").mkdir()
    topology = read_topology(tmp_path)
    assert topology.ids == [0, 1, 2]
    assert (topology.physical_cores, topology.sockets, topology.numa_nodes) == (3, 1, 1)


def test_allowed_cpus_limit_the_topology(tmp_path: Path) -> None:
    topology = read_topology(fake_sysfs(tmp_path, sockets=1, cores=4), allowed={1, 3})
    assert topology.ids == [1, 3]


def test_workers_are_socket_local_and_physical_first(tmp_path: Path) -> None:
    topology = read_topology(fake_sysfs(tmp_path, sockets=2, cores=4, smt=2))
    workers = allocate([(2, 4, 8)], topology)
    assert [(w.batch, w.threads) for w in workers] == [(8, 4), (8, 4)]
    check_disjoint(workers, topology)
    assert [sockets_of(w, topology) for w in workers] == [{0}, {1}]
    assert all(by_id(topology)[c][3] == 0 for w in workers for c in w.cpus or ())


def test_siblings_only_once_physical_cores_run_out(tmp_path: Path) -> None:
    topology = read_topology(fake_sysfs(tmp_path, sockets=2, cores=4, smt=2))
    workers = allocate([(3, 4, 2)], topology)
    check_disjoint(workers, topology)
    siblings = [{by_id(topology)[c][3] for c in w.cpus or ()} for w in workers]
    assert siblings == [{0}, {0}, {1}]
    assert all(len(sockets_of(w, topology)) == 1 for w in workers)


def test_non_uniform_plan_on_fourteen_cores(tmp_path: Path) -> None:
    """Appendix B's ⟨1, 6, 8⟩ + ⟨2, 4, 4⟩ on two 8-core sockets: every worker stays inside one socket."""
    topology = read_topology(fake_sysfs(tmp_path, sockets=2, cores=8))
    workers = allocate([(1, 6, 8), (2, 4, 4)], topology)
    assert [(w.threads, w.batch) for w in workers] == [(6, 8), (4, 4), (4, 4)]
    check_disjoint(workers, topology)
    assert all(len(sockets_of(w, topology)) == 1 for w in workers)


def test_workers_stay_inside_a_numa_node_when_they_fit(tmp_path: Path) -> None:
    topology = read_topology(fake_sysfs(tmp_path, sockets=1, cores=8, nodes_per_socket=2))
    workers = allocate([(1, 2, 1), (1, 4, 1), (1, 2, 1)], topology)
    check_disjoint(workers, topology)
    assert all(len(nodes_of(w, topology)) == 1 for w in workers)


def test_a_worker_larger_than_a_socket_spans_sockets(tmp_path: Path) -> None:
    topology = read_topology(fake_sysfs(tmp_path, sockets=2, cores=4, smt=2))
    (worker,) = allocate([(1, 8, 16)], topology)
    assert sockets_of(worker, topology) == {0, 1}
    assert all(by_id(topology)[c][3] == 0 for c in worker.cpus or ())  # 8 physical cores, no siblings


def test_more_threads_than_cpus_is_refused(tmp_path: Path) -> None:
    topology = read_topology(fake_sysfs(tmp_path, sockets=1, cores=4))
    with pytest.raises(AllocationError, match="needs 6 threads but only 4 CPUs"):
        allocate([(3, 2, 1)], topology)
    with pytest.raises(AllocationError, match="≥ 1 thread"):
        allocate([(1, 0, 1)], topology)


def test_this_machine() -> None:
    topology = machine_topology()
    assert topology.ids == sorted(os.sched_getaffinity(0))
    workers = allocate([(len(topology.cpus), 1, 1)], topology)
    check_disjoint(workers, topology)
    assert sorted(c for w in workers for c in w.cpus or ()) == topology.ids


def allowed_cpus(pid: int) -> list[int]:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Cpus_allowed_list:"):
            return parse_cpulist(line.split(":", 1)[1])
    raise AssertionError("no Cpus_allowed_list")


def test_engine_workers_run_on_the_planned_cores_and_threads(tmp_path: Path) -> None:
    """The allocation reaches real workers: each pins itself and sets its threads as planned.

    Two engines start side by side: one single-thread worker per CPU (thin), and one worker on every CPU (fat).
    """
    from adaserve.engine.engine import ModelEngine
    from adaserve.repository import ModelRepository
    from tests.server_utils import link_example

    topology = machine_topology()
    cpus = len(topology.cpus)
    plans = {"thin": allocate([(cpus, 1, 1)], topology), "fat": allocate([(1, cpus, 16)], topology)}
    for name, planned in plans.items():
        workers = [{"batch": w.batch, "threads": w.threads, "cpus": list(w.cpus or ())} for w in planned]
        link_example(tmp_path, "mlp", name, workers=workers)
        assert yaml.safe_load((tmp_path / name / "config.yaml").read_text())["workers"] == workers
    repository = ModelRepository(tmp_path)

    async def start_and_look(name: str) -> list[tuple[int, int, list[int], list[int]]]:
        engine = ModelEngine(repository.read(name))
        await engine.start(timeout_s=120)
        try:
            return sorted(
                (info.batch, info.threads, info.cpus, allowed_cpus(info.pid)) for info in engine.workers.values()
            )
        finally:
            await engine.stop(drain_timeout_s=1)

    async def both() -> list[list[tuple[int, int, list[int], list[int]]]]:
        return list(await asyncio.gather(*(start_and_look(name) for name in plans)))

    for seen, planned in zip(asyncio.run(both()), plans.values(), strict=True):
        assert seen == sorted((w.batch, w.threads, list(w.cpus or ()), list(w.cpus or ())) for w in planned)
