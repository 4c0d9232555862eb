"""Writing models into a repository: config round trip, artifact round trip at every batch, shipped examples."""

from __future__ import annotations

import json
import re
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from adaserve import zoo
from adaserve.config import ModelConfig, TensorSpec, load_config
from adaserve.datasets import load_fashion_mnist
from adaserve.errors import ConfigError
from adaserve.export import ArtifactFormat, write_model

EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "models"
MAX_BATCH = 8


def spec(name: str, *row_shape: int) -> TensorSpec:
    return TensorSpec(name=name, datatype="FP32", shape=(-1, *row_shape))


def mlp_config(**overrides: object) -> ModelConfig:
    fields: dict[str, object] = {
        "name": "tiny",
        "max_batch_size": MAX_BATCH,
        "inputs": (spec("x", 6),),
        "outputs": (spec("y", 3),),
        **overrides,
    }
    return ModelConfig.model_validate(fields)


def load_artifact(path: Path) -> Callable[..., torch.Tensor]:
    """Load what the server loads; torch.jit warns that it is deprecated on every call."""
    if path.suffix == ".pt2":
        return torch.export.load(path).module()
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"`torch\.jit\.", category=DeprecationWarning)
        return torch.jit.load(str(path))


class TwoInputs(nn.Module):
    """Two inputs sharing the batch dimension, two outputs."""

    def __init__(self) -> None:
        super().__init__()
        self.left = nn.Linear(4, 3)
        self.right = nn.Linear(2, 3)

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.left(a) + self.right(b), self.left(a).relu()


@pytest.mark.parametrize("fmt", ["torch_export", "torchscript"])
def test_round_trip_at_every_batch(tmp_path: Path, fmt: ArtifactFormat) -> None:
    config = mlp_config(parameters={"temperature": 1.5})
    module = zoo.mlp([6, 16, 3])
    path = write_model(tmp_path, config, module, (torch.randn(2, 6),), fmt=fmt)

    assert path == tmp_path / "tiny" / "1" / {"torch_export": "model.pt2", "torchscript": "model.pt"}[fmt]
    assert load_config(tmp_path / "tiny" / "config.yaml", name="tiny") == config
    loaded = load_artifact(path)
    for batch in (1, 3, MAX_BATCH):
        x = torch.randn(batch, 6)
        with torch.no_grad():
            torch.testing.assert_close(loaded(x), module(x))


def test_exported_batch_bound_is_max_batch_size(tmp_path: Path) -> None:
    path = write_model(tmp_path, mlp_config(), zoo.mlp([6, 3]), (torch.randn(2, 6),))
    with pytest.raises(AssertionError):  # the exported module's own input guard
        load_artifact(path)(torch.randn(MAX_BATCH + 1, 6))


def test_batch_one_example_still_exports_a_dynamic_batch(tmp_path: Path) -> None:
    module = zoo.mlp([6, 3])
    path = write_model(tmp_path, mlp_config(), module, (torch.randn(1, 6),))
    x = torch.randn(MAX_BATCH, 6)
    with torch.no_grad():
        torch.testing.assert_close(load_artifact(path)(x), module(x))


@pytest.mark.parametrize("fmt", ["torch_export", "torchscript"])
def test_several_inputs_and_outputs(tmp_path: Path, fmt: ArtifactFormat) -> None:
    config = mlp_config(inputs=(spec("a", 4), spec("b", 2)), outputs=(spec("sum", 3), spec("relu", 3)))
    module = TwoInputs()
    path = write_model(tmp_path, config, module, (torch.randn(2, 4), torch.randn(2, 2)), version=3, fmt=fmt)
    assert path.parent.name == "3"
    loaded = load_artifact(path)
    for batch in (1, 3, MAX_BATCH):
        a, b = torch.randn(batch, 4), torch.randn(batch, 2)
        with torch.no_grad():
            torch.testing.assert_close(tuple(loaded(a, b)), module(a, b))


def test_module_is_put_in_eval_mode(tmp_path: Path) -> None:
    module = nn.Sequential(nn.Linear(6, 3), nn.Dropout(0.5))
    path = write_model(tmp_path, mlp_config(), module, (torch.randn(2, 6),))
    assert not module.training
    x = torch.randn(4, 6)
    torch.testing.assert_close(load_artifact(path)(x), load_artifact(path)(x))


def test_rewriting_in_the_other_format_replaces_the_artifact(tmp_path: Path) -> None:
    module = zoo.mlp([6, 3])
    first = write_model(tmp_path, mlp_config(), module, (torch.randn(2, 6),))
    second = write_model(tmp_path, mlp_config(), module, (torch.randn(2, 6),), fmt="torchscript")
    assert not first.exists() and second.exists()


@pytest.mark.parametrize(
    ("config", "example", "message"),
    [
        (mlp_config(inputs=(spec("x", 5),)), torch.randn(2, 6), r"input 'x': expected FP32 \[-1, 5\]"),
        (
            mlp_config(),
            torch.randn(2, 6, dtype=torch.float64),
            r"input 'x': expected FP32 \[-1, 6\], got torch.float64",
        ),
        (mlp_config(outputs=(spec("y", 4),)), torch.randn(2, 6), r"output 'y': expected FP32 \[-1, 4\]"),
        (mlp_config(), torch.randn(MAX_BATCH + 1, 6), "expected 1 to max_batch_size 8"),
        (mlp_config(platform="torchscript"), torch.randn(2, 6), "config.platform is 'torchscript'"),
    ],
    ids=["input-shape", "input-dtype", "output-shape", "batch", "platform"],
)
def test_mismatched_config_is_refused(tmp_path: Path, config: ModelConfig, example: torch.Tensor, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        write_model(tmp_path, config, zoo.mlp([6, 3]), (example,))
    assert not (tmp_path / "tiny" / "config.yaml").exists()


def test_plain_objects_describe_the_model(tmp_path: Path) -> None:
    """A str repository, the config as a mapping or as keywords (overriding it), the name apart, one tensor."""
    module = zoo.mlp([6, 3])
    fields = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 6]}], "max_batch_size": MAX_BATCH}
    outputs = [{"name": "y", "datatype": "FP32", "shape": [-1, 3]}]
    written = [
        write_model(str(tmp_path / "a"), {**fields, "outputs": outputs}, module, torch.randn(2, 6), name="tiny"),
        write_model(tmp_path / "b", None, module, torch.randn(2, 6), name="tiny", outputs=outputs, **fields),
        write_model(
            tmp_path / "c", {**fields, "name": "tiny", "outputs": []}, module, torch.randn(2, 6), outputs=outputs
        ),
    ]
    for path in written:
        assert path == path.parents[2] / "tiny" / "1" / "model.pt2"
        assert load_config(path.parents[1] / "config.yaml", name="tiny") == mlp_config()


@pytest.mark.parametrize(
    ("config", "name", "message"),
    [
        ({"inputs": [], "outputs": []}, None, "the model needs a name"),
        ({"name": "tiny"}, "other", "name='other' but the config's name is 'tiny'"),
        ({"name": "tiny", "outputs": [{"name": "y", "datatype": "FP32", "shape": [-1, 3]}]}, None, "field 'inputs'"),
        ({"name": "tiny", "inputs": [], "outputs": [], "max_bach_size": 4}, None, "field 'max_bach_size': unknown"),
    ],
)
def test_a_config_that_is_not_one_is_named(
    tmp_path: Path, config: dict[str, object], name: str | None, message: str
) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        write_model(tmp_path, config, zoo.mlp([6, 3]), torch.randn(2, 6), name=name)
    assert not list(tmp_path.iterdir())


@pytest.fixture(scope="module")
def test_split() -> tuple[np.ndarray, np.ndarray]:
    return load_fashion_mnist("test")


@pytest.mark.parametrize("name", ["mlp", "cnn", "mlp_torchscript"])
def test_shipped_example_reproduces_its_accuracy(name: str, test_split: tuple[np.ndarray, np.ndarray]) -> None:
    """The committed artifacts are what examples/train.py recorded: same config, same test accuracy."""
    model_dir = EXAMPLES / name
    config = load_config(model_dir / "config.yaml", name=name)
    metrics = json.loads((model_dir / "1" / "metrics.json").read_text())
    (artifact,) = [p for p in (model_dir / "1").iterdir() if p.suffix in (".pt2", ".pt")]
    model = load_artifact(artifact)

    images, labels = test_split
    images = images.reshape(len(images), *config.inputs[0].row_shape)
    correct = 0
    with torch.no_grad():
        for start in range(0, len(images), config.max_batch_size):
            logits = model(torch.from_numpy(images[start : start + config.max_batch_size]))
            correct += int((logits.argmax(1).numpy() == labels[start : start + config.max_batch_size]).sum())
    assert correct / len(images) == pytest.approx(metrics["test_accuracy"], abs=1e-6)
    assert metrics["test_accuracy"] > 0.85
    assert artifact.stat().st_size < 3_000_000
