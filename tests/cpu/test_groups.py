"""Core groups for several node servers on one machine: reading `--cpus`, cutting the cores, pinning a process."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from adaserve.cpu.groups import core_groups, format_cpus, parse_cpus, restrict_to
from adaserve.cpu.topology import AllocationError, read_topology
from adaserve.errors import ConfigError
from tests.cpu.test_topology import by_id, fake_sysfs
from tests.server_utils import ROOT


def test_cpu_lists_read_as_taskset_writes_them() -> None:
    assert parse_cpus("0-3") == [0, 1, 2, 3]
    assert parse_cpus("0,2,4-7") == [0, 2, 4, 5, 6, 7]
    assert parse_cpus(" 5, 1-2,2 ") == [1, 2, 5]
    assert format_cpus([7, 0, 1, 2, 3, 5, 6]) == "0-3,5-7"
    assert format_cpus([4]) == "4"
    for text in ("", "0-", "-3", "a", "1,,2", "0x1", "1.5", "٣"):
        with pytest.raises(ValueError, match="expected CPU ids and ranges"):
            parse_cpus(text)
    with pytest.raises(ValueError, match="the range 3-1 runs backwards"):
        parse_cpus("0,3-1")


def test_one_group_is_every_cpu(tmp_path: Path) -> None:
    topology = read_topology(fake_sysfs(tmp_path, sockets=1, cores=6))
    assert core_groups(1, topology) == [[0, 1, 2, 3, 4, 5]]


def test_groups_follow_numa_nodes_when_the_count_fits_them(tmp_path: Path) -> None:
    topology = read_topology(fake_sysfs(tmp_path, sockets=2, cores=4, smt=2))  # node 0: 0-3, 8-11; node 1: the rest
    assert core_groups(2, topology) == [[0, 1, 2, 3, 8, 9, 10, 11], [4, 5, 6, 7, 12, 13, 14, 15]]
    quarters = core_groups(4, topology)
    assert quarters == [[0, 1, 8, 9], [2, 3, 10, 11], [4, 5, 12, 13], [6, 7, 14, 15]]
    nodes = by_id(topology)
    assert all(len({nodes[cpu][1] for cpu in group}) == 1 for group in quarters)


def test_groups_keep_a_cores_siblings_together(tmp_path: Path) -> None:
    topology = read_topology(fake_sysfs(tmp_path, sockets=1, cores=4, smt=2))  # core c: CPUs c and c + 4
    assert core_groups(2, topology) == [[0, 1, 4, 5], [2, 3, 6, 7]]
    # More groups than physical cores: siblings part, each group still on the fewest cores.
    assert core_groups(8, topology) == [[0], [4], [1], [5], [2], [6], [3], [7]]


def test_other_counts_cut_contiguous_groups_differing_by_one_core(tmp_path: Path) -> None:
    topology = read_topology(fake_sysfs(tmp_path, sockets=2, cores=5))  # two nodes: 0-4 and 5-9
    groups = core_groups(3, topology)  # 3 is no multiple of 2 nodes: cut in order
    assert groups == [[0, 1, 2, 3], [4, 5, 6], [7, 8, 9]]
    assert sorted(cpu for group in groups for cpu in group) == topology.ids


def test_groups_of_the_cpus_allowed(tmp_path: Path) -> None:
    topology = read_topology(fake_sysfs(tmp_path, sockets=1, cores=8), allowed={2, 3, 4, 5, 6, 7})
    assert core_groups(2, topology) == [[2, 3, 4], [5, 6, 7]]


def test_too_many_groups_are_refused(tmp_path: Path) -> None:
    topology = read_topology(fake_sysfs(tmp_path, sockets=1, cores=2))
    with pytest.raises(AllocationError, match="cannot cut 2 CPUs into 3 groups"):
        core_groups(3, topology)
    with pytest.raises(ValueError, match="1 group or more"):
        core_groups(0, topology)


def test_this_machine_by_default() -> None:
    usable = sorted(os.sched_getaffinity(0))
    groups = core_groups(len(usable))
    assert sorted(cpu for group in groups for cpu in group) == usable and all(len(g) == 1 for g in groups)


def test_restricting_a_cpu_not_allowed_is_refused_naming_it() -> None:
    usable = os.sched_getaffinity(0)
    outside = max(usable) + 1
    with pytest.raises(ConfigError, match=f"CPUs {outside} are not available to this process") as refused:
        restrict_to([min(usable), outside])
    assert format_cpus(usable) in str(refused.value)
    assert os.sched_getaffinity(0) == usable  # refused: nothing changed


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="restricting to a core needs two to choose from")
def test_restricting_pins_every_thread_already_running_and_those_started_after() -> None:
    """In a process of its own (this one's affinity stays): a thread started before, one started after."""
    core = max(os.sched_getaffinity(0))
    program = f"""
import os, threading
from adaserve.cpu.groups import restrict_to
release = threading.Event()
before = threading.Thread(target=release.wait)
before.start()
restrict_to([{core}])
after = threading.Thread(target=release.wait)
after.start()
print(sorted({{cpu for task in os.listdir("/proc/self/task") for cpu in os.sched_getaffinity(int(task))}}))
print(len(os.listdir("/proc/self/task")))
release.set()
"""
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    cpus, threads = done.stdout.split("\n")[:2]
    assert cpus == f"[{core}]" and int(threads) >= 3
