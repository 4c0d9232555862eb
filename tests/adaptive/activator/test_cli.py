"""`adaserve activator build MODEL --data DATA` end to end on a tiny model and an .npz."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch

from adaserve.adaptive.activator.artifact import load_activator
from adaserve.adaptive.activator.cli import load_data
from adaserve.cli import main
from adaserve.config import ModelConfig, TensorSpec
from adaserve.errors import ConfigError
from adaserve.export import write_model
from adaserve.repository import ModelRepository
from tests.adaptive.activator.conftest import SIZES, tiny_data, tiny_mlp


def _repository(tmp_path: Path) -> Path:
    config = ModelConfig(
        name="tiny",
        max_batch_size=4,
        inputs=(TensorSpec(name="x", datatype="FP32", shape=(-1, SIZES[0])),),
        outputs=(TensorSpec(name="y", datatype="FP32", shape=(-1, SIZES[-1])),),
    )
    write_model(tmp_path / "models", config, tiny_mlp(), (torch.zeros(2, SIZES[0]),))
    return tmp_path / "models"


def _build(repository: Path, data: Path, *extra: str) -> int:
    args = ["activator", "build", "tiny", "--data", str(data), "--model-repository", str(repository)]
    with pytest.raises(SystemExit) as exited:
        main([*args, "--quick", "--busy-levels", "0", "--no-progress", *extra])
    return int(exited.value.code or 0)


def test_build_writes_the_next_version_bound_to_the_model(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    repository = _repository(tmp_path)
    x, y = tiny_data(1500)
    np.savez(tmp_path / "data.npz", x=x, y=y)
    assert _build(repository, tmp_path / "data.npz", "--bits", "3", "--tables", "4") == 0
    printed = capsys.readouterr().out
    assert "wrote" in printed
    activator = load_activator(repository / "tiny")
    assert activator.version == 1 and activator.model_version == 1 and activator.sizes == SIZES
    gate = next(line for line in printed.splitlines() if line.startswith("plan "))
    plans = ["".join("ds"[not dense] for dense in row) for row in activator.dense_at]
    assert gate.split()[1 : 1 + len(activator.k_grid)] == plans
    said = "was not faster" if math.isinf(activator.aclo_from) else "ACLO serves accuracy targets up to"
    assert said in printed
    assert activator.built["data"].endswith("1200 inputs for the tables, 300 held out")
    config = ModelRepository(repository).read("tiny").config  # the block that serves it, added
    assert config.activator is not None and config.activator.version is None and "added `activator: {}`" in printed
    before = (repository / "tiny" / "config.yaml").read_text()
    assert _build(repository, tmp_path / "data.npz", "--bits", "3", "--tables", "4") == 0
    assert (repository / "tiny" / "config.yaml").read_text() == before  # there already: left as it is
    assert "config.yaml keeps its `activator:` block: it serves the newest version" in capsys.readouterr().out


def test_print_config_leaves_the_config_as_it_is(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    repository = _repository(tmp_path)
    x, y = tiny_data(600)
    np.savez(tmp_path / "data.npz", x=x, y=y)
    before = (repository / "tiny" / "config.yaml").read_text()
    assert _build(repository, tmp_path / "data.npz", "--bits", "3", "--tables", "4", "--print-config") == 0
    assert (repository / "tiny" / "config.yaml").read_text() == before
    assert "add to" in capsys.readouterr().out and ModelRepository(repository).read("tiny").config.activator is None


def test_bad_data_or_lsh_shape_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    repository = _repository(tmp_path)
    x, y = tiny_data(200)
    np.savez(tmp_path / "data.npz", x=x, y=y)
    assert _build(repository, tmp_path / "data.npz", "--bits", "8", "--tables", "16") == 2
    assert "K·L = 8·16 hash nodes do not fit the narrowest hidden layer (48 nodes)" in capsys.readouterr().err
    np.savez(tmp_path / "wide.npz", x=np.zeros((10, 7), np.float32), y=np.zeros(10))
    assert _build(repository, tmp_path / "wide.npz") == 2
    assert "data rows have 7 values, model 'tiny' takes 20" in capsys.readouterr().err
    np.savez(tmp_path / "unnamed.npz", np.zeros(3))
    with pytest.raises(ConfigError, match="needs arrays 'x' and 'y'"):
        load_data(str(tmp_path / "unnamed.npz"))
    with pytest.raises(ConfigError, match=r"expected 'fashion-mnist' or an \.npz"):
        load_data("cifar")
