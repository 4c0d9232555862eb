"""The busy-thread limit a worker set gets when its config leaves `batching.max_busy_threads` out."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from adaserve.engine.worker_sets import create_worker_set_planner
from adaserve.repository import ModelRepository
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
