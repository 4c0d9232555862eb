"""The GPU's stream profile: its file beside the model, keyed by device, torch, artifact and `cuda_graphs`, and its
measurement, run end to end on the CPU form (threads with no streams) on the example MLP; on a GPU too where one
is present."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from pydantic import ValidationError

from adaserve.cpu.profiler import ProfileError, ProfileSettings, Stability
from adaserve.engine import stream_profile
from adaserve.engine.stream_profile import (
    STREAM_PROFILE_FILE,
    find_profile,
    obtain_profile,
    save_profile,
    stream_count,
    stream_key,
)
from adaserve.repository import ModelRepository, ModelSpec
from tests.engine.stream_profiles import KEY, gpu_like, profile_of
from tests.server_utils import link_example, needs_cuda

#: Short trials (`adaserve profile --quick`'s) that always settle: what is checked is the grid and the cache, not
#: the latencies (on a busy CPU they do not agree).
QUICK = ProfileSettings.for_run(quick=True, stability_percentage=1e6)


def small_mlp(tmp_path: Path, **overrides: object) -> ModelSpec:
    """The example MLP with max_batch_size 4: 4 streams (Ebird's 1, 1, 2, 4) × batches 1, 2, 4."""
    link_example(tmp_path, "mlp", max_batch_size=4, device="cuda", **overrides)
    return ModelRepository(tmp_path).read("mlp")


def test_a_profile_is_found_by_its_whole_key(tmp_path: Path) -> None:
    profile = profile_of(gpu_like)
    save_profile(tmp_path, profile)
    assert find_profile(tmp_path, KEY) == profile
    for change in (
        {"device": "NVIDIA H100"},
        {"torch": "2.12.0"},
        {"artifact_sha256": "1" * 64},
        {"cuda_graphs": False},
    ):
        assert find_profile(tmp_path, KEY.model_copy(update=change)) is None


def test_a_new_artifacts_profile_replaces_the_old_one_and_keeps_other_devices(tmp_path: Path) -> None:
    old, h100 = (
        profile_of(gpu_like),
        profile_of(gpu_like).model_copy(update={"key": KEY.model_copy(update={"device": "NVIDIA H100"})}),
    )
    save_profile(tmp_path, old)
    save_profile(tmp_path, h100)
    new_key = KEY.model_copy(update={"artifact_sha256": "2" * 64})
    save_profile(tmp_path, old.model_copy(update={"key": new_key}))
    assert find_profile(tmp_path, KEY) is None
    assert find_profile(tmp_path, new_key) is not None and find_profile(tmp_path, h100.key) == h100


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("{", "corrupt profile, not valid JSON"),
        ('{"format": 2, "profiles": []}', "profile format 2 is not supported (expected 1)"),
        ('{"format": 1, "profiles": [{"key": {}}]}', "corrupt profile: field 'profiles.0.key.device': Field required"),
    ],
)
def test_a_file_that_cannot_be_used_is_an_error_naming_it(tmp_path: Path, text: str, problem: str) -> None:
    path = tmp_path / STREAM_PROFILE_FILE
    path.write_text(text)
    with pytest.raises(ProfileError, match=f"^{re.escape(str(path))}: .*{re.escape(problem)}"):
        find_profile(tmp_path, KEY)


def test_a_profile_must_cover_its_grid_once() -> None:
    profile = profile_of(gpu_like)
    missing = r"do not cover streams × batches once each: missing \(streams, batch\) cells \[\(4, 8\)\]"
    with pytest.raises(ValidationError, match=missing):
        profile.model_validate({**profile.model_dump(), "cells": [c.model_dump() for c in profile.cells[:-1]]})


def test_the_cpu_form_measures_every_cell_then_reuses_the_stored_profile(tmp_path: Path) -> None:
    spec = small_mlp(tmp_path)
    cpu = torch.device("cpu")
    profile, source = obtain_profile(spec, cpu, QUICK)
    assert source.startswith("stream profile measured at load (cpu: ")
    assert (profile.streams, profile.batches) == ((1, 2, 3, 4), (1, 2, 4)) and stream_count(spec.config) == 4
    assert all(cell.runs >= 3 * QUICK.repeats and cell.mean_s > 0 for cell in profile.cells)
    assert profile.key == stream_key(spec, cpu) and (spec.directory / STREAM_PROFILE_FILE).exists()
    again, source = obtain_profile(spec, cpu, QUICK)
    assert again == profile and source.startswith(f"stream profile of {profile.created}")


def test_a_changed_artifact_is_measured_again_and_replaces_the_old_profile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = small_mlp(tmp_path)
    cpu = torch.device("cpu")
    first, _ = obtain_profile(spec, cpu, QUICK)
    monkeypatch.setattr(stream_profile, "artifact_digest", lambda path: "3" * 64)
    second, source = obtain_profile(spec, cpu, QUICK)
    assert source.startswith("stream profile measured at load") and second.key.artifact_sha256 == "3" * 64
    assert find_profile(spec.directory, first.key) is None


def test_a_profile_of_another_grid_is_measured_again(tmp_path: Path) -> None:
    spec = small_mlp(tmp_path)
    cpu = torch.device("cpu")
    obtain_profile(spec, cpu, QUICK)
    smaller = ModelSpec(spec.config.model_copy(update={"max_batch_size": 2}), spec.version, spec.artifact, (1,))
    profile, source = obtain_profile(smaller, cpu, QUICK)
    assert source.startswith("stream profile measured at load") and (profile.streams, profile.batches) == (
        (1, 2, 3),
        (1, 2),
    )


def test_a_profile_with_unsettled_cells_is_measured_again(tmp_path: Path) -> None:
    spec = small_mlp(tmp_path)
    cpu = torch.device("cpu")
    first, _ = obtain_profile(spec, cpu, QUICK)
    unsettled = Stability(trials=10, spread_pct=40.0, stable=False)
    cells = (first.cells[0].model_copy(update={"stability": unsettled}), *first.cells[1:])
    save_profile(spec.directory, first.model_copy(update={"cells": cells}))
    again, source = obtain_profile(spec, cpu, QUICK)
    assert source.startswith("stream profile measured at load") and again.created >= first.created


@needs_cuda
def test_a_gpu_profile_replays_the_workers_graphs_on_streams(tmp_path: Path) -> None:
    spec = small_mlp(tmp_path)
    profile, _ = obtain_profile(spec, torch.device("cuda"), QUICK)
    assert profile.key.device == torch.cuda.get_device_name() and profile.key.cuda_graphs
    assert len(profile.cells) == 12 and all(cell.mean_s > 0 for cell in profile.cells)
