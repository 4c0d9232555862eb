"""Worker-set planners without a server: the busy-thread limit a set gets when its config leaves
`batching.max_busy_threads` out, and what `workers: auto` does with the profile it finds."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from adaserve.cpu.profiler import fingerprint, save_profile
from adaserve.engine.worker_sets import create_worker_set_planner
from adaserve.repository import ModelRepository
from tests.cpu.test_profiler import synthetic_record, unstable_record
from tests.server_utils import link_example


@pytest.mark.parametrize(("cpus", "limit"), [({0}, 1), ({0, 1}, 1), (set(range(16)), 15)])
def test_a_configured_set_leaves_one_cpu_to_the_frontend(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cpus: set[int], limit: int
) -> None:
    link_example(tmp_path, "mlp")
    planner = create_worker_set_planner(ModelRepository(tmp_path).read("mlp"))
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: cpus)
    assert planner.default_busy_threads() == limit


def test_a_packrat_set_may_keep_all_its_threads_busy(tmp_path: Path) -> None:
    link_example(tmp_path, "mlp", "mlp_auto", workers="auto", packrat={"threads": 2})
    planner = create_worker_set_planner(ModelRepository(tmp_path).read("mlp_auto"))
    assert planner.default_busy_threads() == 2


def test_a_packrat_set_is_not_planned_from_an_unstable_profile(tmp_path: Path) -> None:
    """`workers: auto` at server start: the stated default, its reason naming the cells that did not settle."""
    link_example(tmp_path, "mlp", "mlp_auto", workers="auto", packrat={"threads": 2})
    spec = ModelRepository(tmp_path).read("mlp_auto")
    save_profile(spec.directory, unstable_record(spec))
    choice = create_worker_set_planner(spec).initial()
    assert [(w.threads, w.batch) for w in choice.workers] == [(2, 16)]  # the fat instance
    assert "unstable cells t=2 b=2 (spread 43.2%)" in choice.reason and not choice.details["from_profile"]


def test_a_packrat_set_logs_its_profiles_warnings(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    link_example(tmp_path, "mlp", "mlp_auto", workers="auto", packrat={"threads": 2})
    spec = ModelRepository(tmp_path).read("mlp_auto")
    busy = synthetic_record(spec, fingerprint()).model_copy(update={"load_average": (9.0, 9.5)})
    save_profile(spec.directory, busy)
    with caplog.at_level(logging.WARNING, logger="adaserve.engine"):
        assert create_worker_set_planner(spec).initial().details["from_profile"]
    (record,) = caplog.records
    assert record.getMessage().startswith("Packrat profile: the machine was busy while profiling")
