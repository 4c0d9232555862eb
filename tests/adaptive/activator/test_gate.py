"""The build's gate: per k, each layer dense where the dense step measured faster, layer by layer from the input;
ACLO only from the threshold where it beats computing k = 100% outright."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from adaserve.adaptive.activator import gate
from adaserve.adaptive.activator.artifact import Activator
from adaserve.adaptive.activator.kernel import DENSE, SERVE, Kernel, PackedNetwork
from adaserve.adaptive.activator.layers import MLPLayers
from adaserve.adaptive.activator.runtime import ActivatorRuntime
from tests.adaptive.activator.conftest import masked_forward, tiny_data


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


def test_aclo_runs_from_the_least_threshold_above_which_it_is_always_faster(
    kernel: Kernel, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Made-up costs: ACLO costs 10 - 10·δ (a noisy dip at δ = 0.2), k = 100% costs `whole`."""
    full = len(kernel.counts) - 1
    whole = 5.0

    def cost(of: Kernel, x: np.ndarray, index: int, plan: int = SERVE, threshold: float = -1.0) -> float:
        if plan == DENSE:
            return 1.0
        if threshold < 0:
            assert index == full
            return whole
        return 1.0 if math.isclose(threshold, 0.2) else 10 - 10 * threshold

    monkeypatch.setattr(gate, "_pass_s", cost)
    x, _ = tiny_data(16)
    thresholds = np.round(np.linspace(0, 1, 11), 6)
    assert gate.measure_aclo_floor(kernel, x, thresholds, candidates=10, passes=1) == pytest.approx(0.6)
    whole = 0.0
    assert gate.measure_aclo_floor(kernel, x, thresholds, candidates=10, passes=1) == math.inf
    assert gate.measure_aclo_floor(kernel, x, np.zeros(1), passes=1) == math.inf


def test_a_target_below_aclo_from_runs_at_k_100_and_says_so(kernel: Kernel, activator: Activator) -> None:
    x, _ = tiny_data(8, seed=5)
    loose = {"accuracy": float(activator.calibration.accuracy.min())}  # the largest threshold
    sparse_out, whole_out = np.empty((8, 4), np.float32), np.empty((8, 4), np.float32)
    everywhere = ActivatorRuntime(kernel, replace(activator, aclo_from=0.0)).run([x], [sparse_out], loose)
    never = ActivatorRuntime(kernel, replace(activator, aclo_from=math.inf)).run([x], [whole_out], loose)
    assert everywhere["mode"] == never["mode"] == "aclo"
    assert everywhere["k"] < 1.0 and never["k"] == 1.0
    assert never["layers"] == ",".join("dense" if dense else "sparse" for dense in kernel.dense_at[-1])
    np.testing.assert_allclose(whole_out, masked_forward(x), rtol=1e-4, atol=1e-5)
