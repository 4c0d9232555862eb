"""The lookup process of `caches.lookup: core`: it answers lookups handed over through shared memory, sleeps between
batches, reports a failed lookup, and does not outlive its worker; a worker whose lookup process died goes on with
its lookups inline."""

from __future__ import annotations

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

from adaserve.adaptive.gati.blocks import BlockChain
from adaserve.adaptive.gati.lookup_core import LookupCore, Sizes
from adaserve.adaptive.gati.runtime import EarlyExit, ExitPlan
from tests.adaptive.gati.test_runtime import ALWAYS, ROOMY, cache_after, requests_of, run
from tests.adaptive.gati.test_runtime import chain as chain  # a fixture
from tests.adaptive.gati.test_runtime import images as images

SIZES = Sizes(rows=4, activation_row_bytes=4 * 8, logits_row_bytes=4 * 3)


class Threshold(torch.nn.Module):
    """A stand-in cache: a row hits when its first value is positive; logits are its first three values."""

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if bool(torch.isnan(x).any()):
            raise RuntimeError("a NaN reached the cache")
        return x[:, 0] > 0, x[:, :3], x[:, 0]


@pytest.fixture
def core() -> Iterator[LookupCore]:
    started = LookupCore([{2: torch.jit.script(Threshold())}], SIZES)
    yield started
    started.close()


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_a_lookup_comes_back_through_shared_memory(core: LookupCore) -> None:
    x = torch.tensor([[1.0, 2, 3, 4, 5, 6, 7, 8], [-1, 0, 1, 2, 3, 4, 5, 6], [2, 2, 2, 2, 2, 2, 2, 2]])
    with core.batch():
        found, logits = core.result(core.launch(0, 2, x), len(x))
        again, _ = core.result(core.launch(0, 2, -x[:1]), 1)  # the next lookup of the batch, one row
    assert found.tolist() == [True, False, True] and again.tolist() == [False]
    torch.testing.assert_close(logits, x[:, :3])


def test_the_lookup_process_sleeps_between_batches(core: LookupCore) -> None:
    assert core.pid is not None
    with core.batch():
        core.result(core.launch(0, 2, torch.ones(1, 8)), 1)
    time.sleep(0.2)  # it leaves its spin when the batch ends
    before = cpu_seconds(core.pid)
    time.sleep(1.0)
    assert cpu_seconds(core.pid) - before < 0.2  # spinning, it would have taken the whole second


def test_a_failed_lookup_is_the_batchs_error_and_the_next_one_is_served(core: LookupCore) -> None:
    with core.batch(), pytest.raises(RuntimeError, match="failed in the lookup process"):
        core.result(core.launch(0, 2, torch.full((2, 8), float("nan"))), 2)
    with core.batch():
        found, _ = core.result(core.launch(0, 2, torch.ones(2, 8)), 2)
    assert found.tolist() == [True, True]


def test_the_lookup_process_dies_with_its_worker() -> None:
    worker = textwrap.dedent(
        """
        import sys, time, torch
        from adaserve.adaptive.gati.lookup_core import LookupCore, Sizes
        from tests.adaptive.gati.test_lookup_core import SIZES, Threshold
        core = LookupCore([{2: torch.jit.script(Threshold())}], SIZES)
        print(core.pid, flush=True)
        time.sleep(60)
        """
    )
    with subprocess.Popen([sys.executable, "-c", worker], stdout=subprocess.PIPE, text=True) as process:
        assert process.stdout is not None
        lookup_pid = int(process.stdout.readline())
        os.kill(process.pid, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and Path(f"/proc/{lookup_pid}").exists():
        if Path(f"/proc/{lookup_pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
            break  # a zombie waiting for its new parent to reap it: it has exited
        time.sleep(0.05)
    else:
        assert not Path(f"/proc/{lookup_pid}").exists(), "the lookup process outlived its worker"


def test_a_worker_whose_lookup_process_died_looks_up_inline(
    chain: BlockChain, images: np.ndarray, caplog: pytest.LogCaptureFixture
) -> None:
    early_exit = EarlyExit(chain, [ExitPlan(0.9, {0: cache_after(chain, 0, ALWAYS)})], 0.0, "test", "core")
    early_exit.start_lookups("core", ROOMY)
    core = early_exit._core
    assert core is not None and core.pid is not None
    os.kill(core.pid, signal.SIGKILL)
    while core.alive():
        time.sleep(0.01)
    _, early, rest = run(early_exit, images, requests_of(12))
    assert rest == [] and len(early) == 1  # every row hit after stage1, looked up inline
    assert early_exit.lookups_run == "inline"
    assert "the lookup process exited" in caplog.text
