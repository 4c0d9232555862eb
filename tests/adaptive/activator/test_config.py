"""The `activator:` section of a model's config.yaml."""

from __future__ import annotations

from pathlib import Path

import pytest

from adaserve.config import ModelConfig, load_config
from adaserve.errors import ConfigError

BASE = """
inputs: [{name: image, datatype: FP32, shape: [-1, 784]}]
outputs: [{name: logits, datatype: FP32, shape: [-1, 10]}]
"""


def _load(tmp_path: Path, extra: str) -> ModelConfig:
    path = tmp_path / "config.yaml"
    path.write_text(BASE + extra)
    return load_config(path, name="mlp")


def test_no_section_means_no_activator_and_an_empty_one_the_newest_with_dense_fallback(tmp_path: Path) -> None:
    assert _load(tmp_path, "").activator is None
    activator = _load(tmp_path, "activator: {}").activator
    assert activator is not None
    assert activator.version is None and activator.on_mismatch == "dense"
    activator = _load(tmp_path, "activator: {version: 2, on_mismatch: error}").activator
    assert activator is not None
    assert activator.version == 2 and activator.on_mismatch == "error"


@pytest.mark.parametrize(
    ("section", "problem"),
    [
        ("activator: {default_mode: dense}", r"field 'activator.default_mode': unknown field"),
        ("activator: {on_mismatch: ignore}", r"field 'activator.on_mismatch'"),
        ("activator: {version: 0}", r"field 'activator.version'"),
    ],
)
def test_a_bad_section_names_the_field(tmp_path: Path, section: str, problem: str) -> None:
    with pytest.raises(ConfigError, match=problem):
        _load(tmp_path, section)
