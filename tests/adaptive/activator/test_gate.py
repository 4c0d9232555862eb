"""The build's gate: per k, each layer dense where the dense step measured faster, layer by layer from the input."""

from __future__ import annotations

import numpy as np
import pytest

from adaserve.adaptive.activator import gate
from adaserve.adaptive.activator.artifact import Activator
from adaserve.adaptive.activator.kernel import DENSE, SERVE, Kernel, PackedNetwork
from adaserve.adaptive.activator.layers import MLPLayers
from tests.adaptive.activator.conftest import tiny_data


@pytest.fixture(scope="module")
def kernel(layers: MLPLayers, activator: Activator) -> Kernel:
    return Kernel.build(PackedNetwork.from_layers(layers), activator)


def test_a_layer_runs_dense_where_its_dense_step_costs_no_more(kernel: Kernel, monkeypatch: pytest.MonkeyPatch) -> None:
    """With a made-up cost per layer and k (ties included), the gate picks exactly the cheaper step of each."""
    grid, layers = kernel.dense_at.shape
    sparse_cost = np.random.default_rng(0).integers(1, 4, (grid, layers)).astype(float)
    dense_cost = np.full(layers, 2.0)

    def cost(of: Kernel, x: np.ndarray, index: int, plan: int = SERVE) -> float:
        if plan == DENSE:
            return float(dense_cost.sum()) * len(x)
        row = of.dense_at[index]
        return float(np.where(row, dense_cost, sparse_cost[index]).sum()) * len(x)

    monkeypatch.setattr(gate, "_pass_s", cost)
    x, _ = tiny_data(64)
    chosen = gate.measure_dense_layers(kernel.gated(np.zeros_like(kernel.dense_at)), x, passes=3)
    np.testing.assert_array_equal(chosen, dense_cost[None, :] <= sparse_cost)


def test_the_measured_gate_covers_every_k_and_layer(kernel: Kernel, activator: Activator) -> None:
    x, _ = tiny_data(64)
    chosen = gate.measure_dense_layers(kernel, x, passes=1)
    assert chosen.dtype == np.bool_ and chosen.shape == (len(activator.k_grid), len(activator.sizes) - 1)
    assert activator.dense_at.shape == chosen.shape  # the build stored one
