"""Storing an activator beside its model, versioned and bound to the model version and weights."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from adaserve.adaptive.activator.artifact import (
    Activator,
    ActivatorMismatchError,
    load_activator,
    save_activator,
    versions,
)
from adaserve.errors import ConfigError


def test_a_saved_activator_loads_back_equal_as_the_next_version(tmp_path: Path, activator: Activator) -> None:
    bound = replace(activator, model_version=3, weights_sha256="ab" * 32)
    assert save_activator(tmp_path, bound) == tmp_path / "activator" / "1"
    assert save_activator(tmp_path, bound) == tmp_path / "activator" / "2"
    assert versions(tmp_path) == [1, 2]
    loaded = load_activator(tmp_path)
    assert loaded.version == 2 and load_activator(tmp_path, 1).version == 1
    assert loaded.nodes.rank_nodes.dtype == np.int16
    np.testing.assert_array_equal(loaded.nodes.rank_nodes, bound.nodes.rank_nodes)
    np.testing.assert_array_equal(loaded.confidence.values, bound.confidence.values)
    np.testing.assert_array_equal(loaded.calibration.accuracy, bound.calibration.accuracy)
    np.testing.assert_array_equal(loaded.latency.cpu_p99_ms, bound.latency.cpu_p99_ms)
    assert loaded.dense_at.dtype == np.bool_
    np.testing.assert_array_equal(loaded.dense_at, bound.dense_at)
    assert loaded.aclo_from == bound.aclo_from
    save_activator(tmp_path, replace(bound, aclo_from=math.inf))  # ACLO never faster: stored as null
    assert load_activator(tmp_path).aclo_from == math.inf
    loaded.check(3, "ab" * 32)


def test_an_activator_for_another_model_version_or_other_weights_is_refused(
    tmp_path: Path, activator: Activator
) -> None:
    save_activator(tmp_path, replace(activator, model_version=1, weights_sha256="ab" * 32))
    loaded = load_activator(tmp_path)
    with pytest.raises(ActivatorMismatchError, match="built for model version 1, not version 2"):
        loaded.check(2, "ab" * 32)
    with pytest.raises(ActivatorMismatchError, match="other weights"):
        loaded.check(1, "cd" * 32)


def test_missing_unknown_or_corrupt_activators_name_the_path(tmp_path: Path, activator: Activator) -> None:
    with pytest.raises(ConfigError, match="no activator"):
        load_activator(tmp_path)
    folder = save_activator(tmp_path, replace(activator, model_version=1, weights_sha256="ab" * 32))
    with pytest.raises(ConfigError, match="no such activator version"):
        load_activator(tmp_path, 7)
    tables = dict(np.load(folder / "activator.npz"))
    tables["rank_nodes"] = tables["rank_nodes"] + 1000  # node ids out of range would crash the compiled kernel
    np.savez(folder / "activator.npz", **tables)
    with pytest.raises(ConfigError, match="ranked node ids"):
        load_activator(tmp_path)
    meta = json.loads((folder / "activator.json").read_text())
    (folder / "activator.json").write_text(json.dumps({**meta, "format": 99}))
    with pytest.raises(ConfigError, match="format 99"):
        load_activator(tmp_path)
    (folder / "activator.npz").write_bytes(b"not a zip")
    (folder / "activator.json").write_text(json.dumps(meta))
    with pytest.raises(ConfigError, match="unreadable activator"):
        load_activator(tmp_path)


def test_an_activator_for_other_layers_before_the_head_is_refused(tmp_path: Path, activator: Activator) -> None:
    save_activator(tmp_path, replace(activator, model_version=1, weights_sha256="ab" * 32, prefix_sha256="ef" * 32))
    loaded = load_activator(tmp_path)
    loaded.check(1, "ab" * 32, "ef" * 32)
    with pytest.raises(ActivatorMismatchError, match="other layers before the MLP head"):
        loaded.check(1, "ab" * 32, "12" * 32)
    with pytest.raises(ActivatorMismatchError, match="other layers before the MLP head"):
        loaded.check(1, "ab" * 32)  # the model became a pure MLP


def test_a_format_1_activator_still_loads_as_one_for_a_pure_mlp(tmp_path: Path, activator: Activator) -> None:
    folder = save_activator(tmp_path, replace(activator, model_version=1, weights_sha256="ab" * 32))
    meta = json.loads((folder / "activator.json").read_text())
    del meta["prefix_sha256"]
    (folder / "activator.json").write_text(json.dumps({**meta, "format": 1}))
    loaded = load_activator(tmp_path)
    assert loaded.prefix_sha256 == ""
    loaded.check(1, "ab" * 32)


def test_a_format_2_activator_without_a_gate_runs_every_layer_sparse_and_aclo_everywhere(
    tmp_path: Path, activator: Activator
) -> None:
    gated = replace(activator, dense_at=np.ones_like(activator.dense_at))
    folder = save_activator(tmp_path, gated)
    with np.load(folder / "activator.npz") as arrays:
        tables = {name: arrays[name] for name in arrays.files if name != "dense_at"}
    np.savez(folder / "activator.npz", **tables)
    meta = json.loads((folder / "activator.json").read_text())
    (folder / "activator.json").write_text(json.dumps({**meta, "format": 2}))
    loaded = load_activator(tmp_path)
    assert loaded.dense_at.shape == activator.dense_at.shape and not loaded.dense_at.any()
    assert loaded.aclo_from == 0.0  # and ACLO at every threshold


def test_a_gate_of_the_wrong_shape_is_refused(tmp_path: Path, activator: Activator) -> None:
    save_activator(tmp_path, replace(activator, dense_at=np.zeros((1, 1), np.bool_)))
    with pytest.raises(ConfigError, match="dense_at shape"):
        load_activator(tmp_path)
