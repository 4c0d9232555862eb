"""The `caches:` section of a model config: defaults, and errors that name the field and the problem."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from adaserve.config import LearnedCachesSpec, ModelConfig, load_config
from adaserve.errors import ConfigError


def load(tmp_path: Path, caches: Any) -> ModelConfig:
    path = tmp_path / "m" / "config.yaml"
    path.parent.mkdir(exist_ok=True)
    tensors = {
        "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 4]}],
        "outputs": [{"name": "y", "datatype": "FP32", "shape": [-1, 2]}],
    }
    path.write_text(yaml.safe_dump({**tensors, "caches": caches}))
    return load_config(path, name="m")


def test_caches_are_optional_and_default_to_auto(tmp_path: Path) -> None:
    assert load(tmp_path, None).caches is None
    assert load(tmp_path, {}).caches == LearnedCachesSpec(blocks="auto", version="latest", targets=(0.99,))
    caches = load(
        tmp_path,
        {"blocks": ["stem", "layer1.0", "head"], "version": 3, "targets": [0.99, 0.97], "memory_budget_mb": 64},
    )
    assert caches.caches == LearnedCachesSpec(
        blocks=("stem", "layer1.0", "head"), version=3, targets=(0.99, 0.97), memory_budget_mb=64
    )


@pytest.mark.parametrize(
    ("caches", "problem"),
    [
        (
            {"blocks": "everything"},
            "field 'caches.blocks': expected 'auto' or a list of module paths, got 'everything'",
        ),
        ({"blocks": []}, "field 'caches.blocks': the block list is empty; name the blocks or use 'auto'"),
        ({"blocks": ["a", "b", "a"]}, "field 'caches.blocks': blocks are named once each; repeated: a"),
        ({"blocks": ["a", 3]}, "field 'caches.blocks': block names are module paths like 'layer1.0', got 3"),
        ({"version": "newest"}, "field 'caches.version': expected 'latest' or a version number .*, got 'newest'"),
        ({"version": 0}, "field 'caches.version': expected 'latest' or a version number .*, got 0"),
        (
            {"targets": [0.99, 1.0]},
            "field 'caches.targets': a target is an agreement fraction strictly between 0 and 1, got 1.0",
        ),
        ({"memory_budget_mb": 0}, "field 'caches.memory_budget_mb': Input should be greater than 0"),
        ({"block": "auto"}, "field 'caches.block': unknown field"),
        (
            {"version": 2, "adaptation": {}},
            "field 'caches.adaptation': adaptation deploys new cache set versions: it needs `version: latest`",
        ),
        (
            {"adaptation": {"sample_fraction": 0}},
            "field 'caches.adaptation.sample_fraction': Input should be greater than 0",
        ),
        ({"adaptation": {"window": 10}}, "field 'caches.adaptation.window': unknown field"),
    ],
)
def test_bad_values_are_named(tmp_path: Path, caches: dict[str, Any], problem: str) -> None:
    with pytest.raises(ConfigError, match=rf"config\.yaml: {problem}$"):
        load(tmp_path, caches)


def test_adaptation_is_off_unless_asked_and_the_activator_excludes_caches(tmp_path: Path) -> None:
    assert load(tmp_path, {}).caches.adaptation is None  # type: ignore[union-attr]
    adaptation = load(tmp_path, {"adaptation": {"period_s": 60}}).caches.adaptation  # type: ignore[union-attr]
    assert adaptation is not None and adaptation.period_s == 60 and adaptation.sample_fraction == 0.2
    path = tmp_path / "m" / "config.yaml"
    config = yaml.safe_load(path.read_text())
    path.write_text(yaml.safe_dump({**config, "activator": {}}))
    with pytest.raises(ConfigError, match=r"either a node activator .* or learned caches"):
        load_config(path, name="m")
