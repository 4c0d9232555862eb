"""The cores the server's workers have to themselves (`adaserve.engine.machine_cpu`, through `Cores.measure`): the
CPUs less what this process and every other program used lately, the workers' own CPU left out."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from adaserve.engine.cores import Cores
from adaserve.engine.machine_cpu import SpareCores, machine_busy_s, process_cpu_s
from tests.engine.test_cores import model

CPUS = len(os.sched_getaffinity(0))
needs_two_cores = pytest.mark.skipif(CPUS < 2, reason="a busy process and this test need a core each")


@contextmanager
def busy_process(seconds: float = 3.0) -> Iterator[int]:
    """Another program keeping one core busy (a bounded loop, ended by its PID)."""
    loop = f"import time\nend = time.monotonic() + {seconds}\nwhile time.monotonic() < end: pass"
    process = subprocess.Popen([sys.executable, "-c", loop])
    try:
        yield process.pid
    finally:
        process.kill()
        process.wait()


def spare_after(cores: Cores, seconds: float) -> float:
    start = time.monotonic()
    cores.measure(start)  # the first reading
    time.sleep(seconds)
    cores.measure(time.monotonic())
    return cores.spare_cores


def test_the_frontends_own_cpu_counts() -> None:
    meter = SpareCores(list)
    start = time.monotonic()
    while time.monotonic() - start < 0.3:  # a frontend busy on one core
        pass
    assert meter.update(time.monotonic()) < CPUS - 0.5


@needs_two_cores
def test_another_program_on_the_cores_counts() -> None:
    """A client on the same machine takes its cores from the workers: they must not poll on them."""
    with busy_process():
        time.sleep(0.2)  # past its start
        spare = spare_after(Cores(), 0.5)
    assert spare < CPUS - 0.6


def test_the_servers_own_workers_do_not_count() -> None:
    """A worker's batches and polling are counted by the scheduler itself (busy threads and pollers): the cores
    spare with a busy process as the server's worker exceed those without by just what it used, whatever else the
    machine runs (an absolute bound failed beside a busy neighbour: 0.96 spare where above 1.55 was expected)."""
    as_worker, as_other = Cores(), Cores()
    with busy_process() as pid:
        as_worker.connect(
            model(as_worker, (1, 1)), pump=lambda: None, rest=lambda worker: None, worker_pids=lambda: [pid]
        )
        time.sleep(0.2)
        start, used = time.monotonic(), process_cpu_s(pid)
        as_worker.measure(start)
        as_other.measure(start)
        time.sleep(0.5)
        end = time.monotonic()
        as_worker.measure(end)
        as_other.measure(end)
        worker_cores = (process_cpu_s(pid) - used) / (end - start)
    assert worker_cores > 0.1  # it ran
    assert as_worker.spare_cores - as_other.spare_cores == pytest.approx(worker_cores, abs=0.1)


def test_spare_cores_stay_within_the_cpus_when_a_worker_exits() -> None:
    pids: list[int] = []
    meter = SpareCores(lambda: pids)
    with busy_process(seconds=0.4) as pid:
        pids.append(pid)
        time.sleep(0.15)
        meter.update(time.monotonic())
        time.sleep(0.5)  # it ends meanwhile; its PID stays listed, unreadable
    assert 0.0 <= meter.update(time.monotonic()) <= CPUS


def test_the_machines_cpu_time_is_the_sum_over_its_cpus() -> None:
    every = set(range(os.cpu_count() or 1))
    whole, by_cpu = machine_busy_s(), machine_busy_s(every)
    assert by_cpu == pytest.approx(whole, abs=0.05 * len(every) + 0.05)
    assert machine_busy_s(set()) == 0.0


def test_a_processes_cpu_time_grows_as_it_runs() -> None:
    """By the CPU this process used, not the time that passed: on a busy machine 0.1 s of wall time gave 0.03 s."""
    before, start = process_cpu_s(os.getpid()), time.process_time()
    while time.process_time() - start < 0.1:
        pass
    assert process_cpu_s(os.getpid()) - before > 0.05


def test_spare_cores_keep_their_last_figure_while_proc_cannot_be_read(monkeypatch: pytest.MonkeyPatch) -> None:
    """With the server's open files exhausted /proc/stat could not be opened, and the error, raised in a batch's
    completion, left its requests unanswered for good."""
    meter = SpareCores(list)
    start = time.monotonic()
    meter.update(start + 0.2)
    before = meter.spare

    def exhausted(cpus: object = None) -> float:
        raise OSError(24, "Too many open files")

    monkeypatch.setattr("adaserve.engine.machine_cpu.machine_busy_s", exhausted)
    assert meter.update(start + 0.4) == before
    assert SpareCores(list).update(start + 0.6) == CPUS  # made while it cannot read: all spare until it can
