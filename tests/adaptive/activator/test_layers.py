"""Reading the Linear + ReLU chain from every kind of loaded model, and refusing what does not end in one."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from adaserve.adaptive.activator.layers import NotAnMLPError, extract_layers
from adaserve.repository import load_artifact
from adaserve.zoo import mlp
from tests.adaptive.activator.conftest import SIZES, tiny_mlp


def _reference(x: np.ndarray) -> np.ndarray:
    with torch.inference_mode():
        return tiny_mlp()(torch.from_numpy(x)).numpy()


def test_an_eager_mlp_gives_its_weights_and_reproduces_its_output() -> None:
    layers = extract_layers(tiny_mlp(), (SIZES[0],))
    assert layers.sizes == SIZES and layers.hidden == 2
    assert all(w.dtype == np.float32 and w.flags.c_contiguous for w in layers.weights)
    x = np.random.default_rng(0).random((5, SIZES[0]), dtype=np.float32)
    np.testing.assert_allclose(layers.forward(x), _reference(x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("artifact", ["mlp/1/model.pt2", "mlp_torchscript/1/model.pt"])
def test_exported_and_torchscript_artifacts_give_the_same_layers(artifact: str) -> None:
    examples = Path(__file__).resolve().parents[3] / "examples" / "models"
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=DeprecationWarning)
        model = load_artifact(examples / artifact, 16)
    layers = extract_layers(model, (784,))
    assert layers.sizes == (784, 256, 256, 10)
    assert len(layers.digest()) == 64


def test_the_digest_changes_with_the_weights() -> None:
    assert extract_layers(tiny_mlp(0), (SIZES[0],)).digest() != extract_layers(tiny_mlp(1), (SIZES[0],)).digest()


def test_a_flatten_before_the_first_linear_is_allowed() -> None:
    model = torch.nn.Sequential(torch.nn.Flatten(), *mlp([16, 8, 3])).eval()
    assert extract_layers(model, (1, 4, 4)).sizes == (16, 8, 3)


@pytest.mark.parametrize(
    ("model", "row_shape", "message"),
    [
        (torch.nn.Sequential(*mlp([8, 4, 2]), torch.nn.Softmax(1)), (8,), "ends with .*Softmax"),
        (torch.nn.Sequential(torch.nn.Linear(8, 3)), (8,), "no Linear \\+ ReLU"),
        (torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2)), (8,), "Tanh"),
        (torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.ReLU()), (8,), "no Linear \\+ ReLU"),
    ],
)
def test_a_model_without_a_linear_relu_chain_is_refused_with_what_it_holds(
    model: torch.nn.Module, row_shape: tuple[int, ...], message: str
) -> None:
    with pytest.raises(NotAnMLPError, match=message):
        extract_layers(model.eval(), row_shape, "m")


def test_a_model_that_only_looks_like_a_chain_is_refused() -> None:
    class Doubled(torch.nn.Sequential):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return super().forward(x) * 2

    with pytest.raises(NotAnMLPError, match="do not reproduce"):
        extract_layers(Doubled(*mlp([8, 4, 2])).eval(), (8,))
