"""A model with an MLP head: its prefix runs in torch, the activator is built on and serves the head."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from adaserve.adaptive.activator.build import BuildData, BuildOptions, build_activator
from adaserve.adaptive.activator.layers import NotAnMLPError, extract_head, extract_layers
from adaserve.adaptive.activator.runtime import ActivatorRuntime
from adaserve.config import ActivatorSpec, ModelConfig, TensorSpec
from adaserve.export import ArtifactFormat, write_model
from adaserve.repository import ModelRepository, ModelSpec, load_artifact
from tests.adaptive.activator.conftest import CNN_ROW, CNN_SIZES, tiny_cnn, tiny_images

EXAMPLES = Path(__file__).resolve().parents[3] / "examples" / "models"


def _write(repository: Path, module: torch.nn.Module, fmt: ArtifactFormat = "torch_export") -> ModelSpec:
    config = ModelConfig(
        name="cnn",
        max_batch_size=4,
        inputs=(TensorSpec(name="x", datatype="FP32", shape=(-1, *CNN_ROW)),),
        outputs=(TensorSpec(name="y", datatype="FP32", shape=(-1, 10)),),
        activator=ActivatorSpec(),
    )
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=DeprecationWarning)  # torch.jit
        write_model(repository, config, module, (torch.rand(2, *CNN_ROW),), fmt=fmt)
    return ModelRepository(repository).read("cnn")


def _load(spec: ModelSpec) -> torch.nn.Module:
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=DeprecationWarning)
        model = load_artifact(spec.artifact, spec.config.max_batch_size)
    assert isinstance(model, torch.nn.Module)
    return model


def _run(model: torch.nn.Module, x: np.ndarray) -> np.ndarray:
    with torch.inference_mode():
        return model(torch.from_numpy(x)).numpy()


@pytest.mark.parametrize("fmt", ["torch_export", "torchscript", None])
def test_a_cnn_splits_into_a_prefix_and_an_mlp_head_that_reproduce_it(
    tmp_path: Path, fmt: ArtifactFormat | None
) -> None:
    model = tiny_cnn() if fmt is None else _load(_write(tmp_path, tiny_cnn(), fmt))
    head = extract_head(model, CNN_ROW, "cnn")
    assert head.layers.sizes == CNN_SIZES and not head.prefix.empty
    x, _ = tiny_images(5)
    np.testing.assert_allclose(head.layers.forward(head.prefix(x)), _run(model, x), rtol=1e-4, atol=1e-5)
    assert len(head.prefix.digest()) == 64
    with pytest.raises(NotAnMLPError, match="not a pure MLP"):
        extract_layers(model, CNN_ROW, "cnn")


def test_the_example_cnn_has_an_mlp_head_and_the_example_mlp_no_prefix() -> None:
    cnn = load_artifact(EXAMPLES / "cnn" / "1" / "model.pt2", 16)
    assert extract_head(cnn, CNN_ROW).layers.sizes == (1568, 64, 10)
    mlp = extract_head(load_artifact(EXAMPLES / "mlp" / "1" / "model.pt2", 16), (784,))
    assert mlp.prefix.empty and mlp.prefix.digest() == ""


def test_the_prefix_digest_changes_with_the_convolutions_alone() -> None:
    first, second = tiny_cnn(0), tiny_cnn(1)
    second.head.load_state_dict(first.head.state_dict())
    a, b = extract_head(first, CNN_ROW), extract_head(second, CNN_ROW)
    assert a.layers.digest() == b.layers.digest()
    assert a.prefix.digest() != b.prefix.digest()


@pytest.mark.parametrize("exported", [True, False])
def test_a_conv_model_ending_in_a_single_linear_is_refused_naming_its_end(tmp_path: Path, exported: bool) -> None:
    model = torch.nn.Sequential(
        torch.nn.Conv2d(1, 2, 5, stride=4), torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(72, 10)
    ).eval()
    loaded = _load(_write(tmp_path, model)) if exported else model
    with pytest.raises(NotAnMLPError, match=r"cnn: has no Linear \+ ReLU layer .* ends with .*[Ff]latten, [Ll]inear\)"):
        extract_head(loaded, CNN_ROW, "cnn")


def test_a_cnn_activator_is_built_on_head_inputs_and_serves_the_model_at_k_100(tmp_path: Path) -> None:
    spec = _write(tmp_path, tiny_cnn())
    x, y = tiny_images(700)
    data = BuildData(x[:500], x[500:], y[500:], "random images")
    options = BuildOptions(bits=3, tables=4, k_grid=(0.25, 0.5, 1.0), busy_levels=0, latency_repeats=10)
    _, activator = build_activator(spec, data, options, progress=False)
    assert activator.sizes == CNN_SIZES and len(activator.prefix_sha256) == 64

    model = _load(spec)
    runtime = ActivatorRuntime.load(spec.config, spec.artifact, model)
    assert runtime.activator is not None and not runtime.prefix.empty
    rows = np.ascontiguousarray(x[600:604])
    out = np.empty((4, 10), np.float32)
    parameters = runtime.run([rows], [out], {"latency_ms": 1e6})
    gated = ",".join("dense" if dense else "sparse" for dense in activator.dense_at[-1])  # the build's, at k = 100%
    assert parameters == {"mode": "lcao", "k": 1.0, "layers": gated, "interference": 0.0}
    np.testing.assert_allclose(out, _run(model, rows), rtol=1e-4, atol=1e-5)
    parameters = runtime.run([rows], [out], {"accuracy": 0.5})
    assert parameters["mode"] == "aclo" and 0 < parameters["k"] <= 1
