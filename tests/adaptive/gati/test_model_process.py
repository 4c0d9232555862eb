"""The model process of `caches.lookup: process`: it runs a batch's blocks handed over through shared memory and
reports each exit's output in order, drops the rows the worker marks answered, sleeps between batches, reports a
failed block by its message, and does not outlive its worker; a worker whose model process died goes on inline."""

from __future__ import annotations

import contextlib
import gc
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from adaserve.adaptive.gati import model_process
from adaserve.adaptive.gati.blocks import BlockChain
from adaserve.adaptive.gati.model_process import AWAKE, LINGER_S, ModelProcess, Sizes
from adaserve.adaptive.gati.runtime import EarlyExit, ExitPlan
from tests.adaptive.gati.test_runtime import ALWAYS, NEVER, ROOM, cache_after, requests_of, run
from tests.adaptive.gati.test_runtime import chain as chain  # a fixture
from tests.adaptive.gati.test_runtime import images as images

#: Three blocks that add 1, 10 and 100; the third fails on a NaN.
SIZES = Sizes(rows=4, row_bytes=4 * 3, reports=3)


def add(value: float) -> torch.nn.Module:
    class Add(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            if value == 100 and bool(torch.isnan(x).any()):
                raise ValueError("a NaN reached the last block")
            return x + value

    return Add()


def toy_chain() -> BlockChain:
    return BlockChain(("one", "ten", "hundred"), (add(1), add(10), add(100)), (4, 4, 4))


@pytest.fixture
def process() -> Iterator[ModelProcess]:
    started = ModelProcess(toy_chain(), SIZES)
    yield started
    started.close()


@contextlib.contextmanager
def batch(process: ModelProcess) -> Iterator[None]:
    """A batch, as the runtime brackets one."""
    process.begin()
    try:
        yield
    finally:
        process.end()


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_each_exit_and_the_last_block_come_back_in_order(process: ModelProcess) -> None:
    x = torch.tensor([[0.0, 1, 2], [3, 4, 5], [6, 7, 8]])
    with batch(process):
        job = process.start(x, 1, [1])
        index, after_ten, rows = job.next()
        assert index == 1 and rows.tolist() == [0, 1, 2]
        torch.testing.assert_close(after_ten, x + 10)
        index, last, rows = job.next()
        job.cancel()
    assert index == 2 and rows.tolist() == [0, 1, 2]
    torch.testing.assert_close(last, x + 110)
    deadline = time.monotonic() + 5
    while not process.idle() and time.monotonic() < deadline:
        time.sleep(0.001)
    assert process.idle()


def test_rows_marked_answered_leave_the_batch(process: ModelProcess) -> None:
    """The worker marks rows answered while the model process runs; it drops them at its next block boundary."""
    x = torch.tensor([[0.0, 0, 0], [1, 1, 1], [2, 2, 2], [3, 3, 3]])
    with batch(process):
        job = process.start(x, 0, [0, 1])
        _, _, rows = job.next()  # after block 0 ("one")
        job.mark(np.array([0, 2]))  # two rows hit there (the model process may be past block 1 already)
        reports = [job.next(), job.next()]
        job.cancel()
    index, out, rows = reports[-1]
    assert index == 2 and set(rows.tolist()) <= {0, 1, 2, 3} and {1, 3} <= set(rows.tolist())
    torch.testing.assert_close(out, x[rows] + 111)


def test_the_model_process_sleeps_between_batches(process: ModelProcess) -> None:
    assert process.pid is not None
    with batch(process):
        process.start(torch.ones(1, 3), 0, []).next()
    time.sleep(0.2)  # it stops spinning shortly after the batch
    before = cpu_seconds(process.pid)
    time.sleep(1.0)
    assert cpu_seconds(process.pid) - before < 0.2  # spinning, it would have taken the whole second
    with batch(process):  # asleep, it is woken for the next batch
        _, out, _ = process.start(torch.ones(1, 3), 0, []).next()
    torch.testing.assert_close(out, torch.full((1, 3), 112.0))


def test_batches_spaced_around_the_linger_are_all_served(process: ModelProcess) -> None:
    """Whether the model process is still spinning or has just gone to sleep when a batch comes, it runs it."""
    for gap in np.random.default_rng(0).uniform(0, 2 * LINGER_S, 30):
        time.sleep(gap)
        with batch(process):
            job = process.start(torch.zeros(1, 3), 0, [])
            _, out, _ = job.next()
            job.cancel()
        torch.testing.assert_close(out, torch.full((1, 3), 111.0))
        while not process.idle():
            time.sleep(0.0001)


def test_a_batch_that_finds_the_model_process_awake_but_it_falls_asleep_is_still_served(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A batch does not wake a model process that says it is spinning; should it have just stopped, and missed the
    batch, the wait for the batch's first output wakes it (long before the sleeper's own hourly look)."""
    monkeypatch.setattr(model_process, "PARENT_CHECK_S", 3600.0)
    process = ModelProcess(toy_chain(), SIZES)
    try:
        with batch(process):
            process.start(torch.ones(1, 3), 0, []).next()
        time.sleep(10 * LINGER_S)  # asleep now
        process._words[AWAKE] = 1  # as if it were still spinning when the batch looks...
        began = time.monotonic()
        with batch(process):
            process._words[AWAKE] = 0  # ...and stopped just after
            job = process.start(torch.ones(1, 3), 0, [])
            _, out, _ = job.next()
            job.cancel()
        assert time.monotonic() - began < 60
        torch.testing.assert_close(out, torch.full((1, 3), 112.0))
    finally:
        process.close()


def test_a_failed_block_is_the_batchs_error_by_its_message_and_the_next_batch_is_served(
    process: ModelProcess,
) -> None:
    with batch(process):
        job = process.start(torch.full((2, 3), float("nan")), 0, [])
        with pytest.raises(RuntimeError, match="in the model process: ValueError: a NaN reached the last block"):
            job.next()
        job.cancel()
    while not process.idle():
        time.sleep(0.001)
    with batch(process):
        _, out, _ = process.start(torch.ones(2, 3), 0, []).next()
    torch.testing.assert_close(out, torch.full((2, 3), 112.0))


def test_a_model_process_dropped_without_close_leaves_and_never_touches_the_next() -> None:
    """A runtime replaced without `close` dropped its model process while the process lived on; with memory from
    multiprocessing's shared heap its successor got the same memory, and the orphan ran or reported the successor's
    jobs (a report with no shape). Now each has memory of its own, and a dropped one is hung up on."""
    dropped = ModelProcess(toy_chain(), SIZES)
    orphan = dropped._process
    del dropped
    gc.collect()
    successor = ModelProcess(toy_chain(), SIZES)
    try:
        x = torch.tensor([[0.0, 1, 2], [3, 4, 5]])
        for _ in range(200):
            with batch(successor):
                job = successor.start(x, 0, [])
                index, out, _ = job.next()
                job.cancel()
            assert index == 2
            torch.testing.assert_close(out, x + 111)
        orphan.join(timeout=2 * model_process.PARENT_CHECK_S + 5)
        assert not orphan.is_alive()
    finally:
        successor.close()


def test_a_tensor_larger_than_the_buffers_is_refused(process: ModelProcess) -> None:
    with pytest.raises(ValueError, match="does not fit the model process's 48-byte buffer"):
        process.start(torch.ones(5, 3), 0, [])


def test_more_exits_than_the_reports_sized_are_refused() -> None:
    process = ModelProcess(toy_chain(), Sizes(rows=4, row_bytes=4 * 3, reports=2))
    try:
        with pytest.raises(ValueError, match=r"exits \[0, 1\] and the last block need 3 reports, 2 are sized"):
            process.start(torch.ones(1, 3), 0, [0, 1])
        with batch(process):
            _, out, _ = process.start(torch.ones(1, 3), 0, [0]).next()
        torch.testing.assert_close(out, torch.full((1, 3), 2.0))
    finally:
        process.close()


def test_the_model_process_dies_with_its_worker() -> None:
    worker = textwrap.dedent(
        """
        import time
        from adaserve.adaptive.gati.model_process import ModelProcess
        from tests.adaptive.gati.test_model_process import SIZES, toy_chain
        process = ModelProcess(toy_chain(), SIZES)
        print(process.pid, flush=True)
        time.sleep(60)
        """
    )
    with subprocess.Popen([sys.executable, "-c", worker], stdout=subprocess.PIPE, text=True) as worker_process:
        assert worker_process.stdout is not None
        model_pid = int(worker_process.stdout.readline())
        os.kill(worker_process.pid, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and Path(f"/proc/{model_pid}").exists():
        if Path(f"/proc/{model_pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
            break  # a zombie waiting for its new parent to reap it: it has exited
        time.sleep(0.05)
    else:
        assert not Path(f"/proc/{model_pid}").exists(), "the model process outlived its worker"


def kill(early_exit: EarlyExit) -> None:
    process = early_exit._ahead
    assert process is not None and process.pid is not None
    os.kill(process.pid, signal.SIGKILL)
    while process.alive():
        time.sleep(0.01)


def answered_as_the_model(early_exit: EarlyExit, chain: BlockChain, images: np.ndarray) -> None:
    """Two requests whose rows no cache answers get the model's outputs, from its last block."""
    outputs, early, rest = run(early_exit, images, requests_of(5, 7))
    with torch.inference_mode():
        base = chain.run(torch.from_numpy(images)).numpy()
    np.testing.assert_allclose(outputs, base, rtol=1e-5, atol=1e-5)
    assert early == [] and [p.values["exit_block"] for p in rest] == ["head", "head"]


def test_a_worker_whose_model_process_died_looks_up_inline(
    chain: BlockChain, images: np.ndarray, caplog: pytest.LogCaptureFixture
) -> None:
    early_exit = EarlyExit(chain, [ExitPlan(0.9, {0: cache_after(chain, 0, ALWAYS)})], 0.0, "test", "process")
    early_exit.start_lookups("process", ROOM)
    kill(early_exit)
    _, early, rest = run(early_exit, images, requests_of(12))
    assert rest == [] and len(early) == 1  # every row hit after stage1, looked up inline
    assert early_exit.lookups_run == "inline"
    assert "the model process exited" in caplog.text


def test_a_model_process_that_died_spinning_is_found_by_the_batch_that_waits_for_it(
    chain: BlockChain, images: np.ndarray, caplog: pytest.LogCaptureFixture
) -> None:
    """Dead while it said it was awake, it is not woken by the next batch (so no broken pipe tells): the wait for
    its first output finds it dead, and the worker runs the batch, and the later ones, inline."""
    early_exit = EarlyExit(chain, [ExitPlan(0.9, {0: cache_after(chain, 0, NEVER)})], 0.0, "test", "process")
    early_exit.start_lookups("process", ROOM)
    process = early_exit._ahead
    assert process is not None
    kill(early_exit)
    process._words[AWAKE] = 1
    answered_as_the_model(early_exit, chain, images)
    assert early_exit.lookups_run == "inline" and "during a batch" in caplog.text


def test_a_batch_whose_model_process_dies_under_it_ends_inline(
    chain: BlockChain, images: np.ndarray, caplog: pytest.LogCaptureFixture
) -> None:
    """The model process dies after the batch has handed it the blocks: the worker finds out while it waits for
    the next output, runs the rest of the chain itself, and answers every row as the model does."""

    def slow(x: torch.Tensor) -> torch.Tensor:  # stage2, in the model process while the worker looks up stage1
        time.sleep(0.3)
        return chain.blocks[1](x)

    slowed = BlockChain(chain.names, (chain.blocks[0], slow, chain.blocks[2]), chain.weight_bytes)
    early_exit = EarlyExit(slowed, [ExitPlan(0.9, {0: cache_after(chain, 0, NEVER)})], 0.0, "test", "process")
    early_exit.start_lookups("process", ROOM)
    killed = False
    look_up = early_exit.plans[0].lookups[0]

    class KillFirst(torch.nn.Module):
        """The cache after stage1, which kills the model process the first time it is consulted."""

        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
            nonlocal killed
            if not killed:
                killed = True
                kill(early_exit)
            return look_up(x)

    early_exit.plans[0].lookups[0] = KillFirst()  # type: ignore[assignment]
    answered_as_the_model(early_exit, chain, images)
    assert early_exit.lookups_run == "inline" and "lookups run inline from now on" in caplog.text
