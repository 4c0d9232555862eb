"""The compiled forward: dense plan = torch, k = 100% = dense, top-k = a masked torch forward, a layer gated dense
computes all its nodes."""

from __future__ import annotations

import numpy as np
import pytest

from adaserve.adaptive.activator.artifact import Activator
from adaserve.adaptive.activator.kernel import DENSE, GLOBAL, LSH, RANDOM, ROWS, SERVE, Kernel, PackedNetwork
from adaserve.adaptive.activator.layers import MLPLayers
from adaserve.adaptive.activator.lsh import bucket_keys, select_lsh
from tests.adaptive.activator.conftest import masked_forward, tiny_data


def _run(kernel: Kernel, x: np.ndarray, index: int, plan: int, ranking: int = LSH, seed: int = 0) -> np.ndarray:
    out = np.empty((len(x), int(kernel.network.sizes[-1])), np.float32)
    kernel.run(x, out, np.full(len(x), index, np.int64), np.full(len(x), -1.0), plan, ranking, seed)
    return out


@pytest.fixture(scope="module")
def kernel(layers: MLPLayers, activator: Activator) -> Kernel:
    return Kernel.build(PackedNetwork.from_layers(layers), activator)


def test_the_dense_plan_and_every_plan_at_k_100_equalmasked_forward(kernel: Kernel) -> None:
    x, _ = tiny_data(64, seed=7)
    full = len(kernel.counts) - 1
    for plan in (DENSE, ROWS, SERVE):
        np.testing.assert_allclose(_run(kernel, x, full, plan), masked_forward(x), rtol=1e-4, atol=1e-5)
    dense = Kernel.dense(kernel.network)
    np.testing.assert_allclose(_run(dense, x, 0, SERVE), masked_forward(x), rtol=1e-4, atol=1e-5)


def test_the_global_ranking_at_k_below_100_equals_torch_with_the_other_nodes_dropped(kernel: Kernel) -> None:
    x, _ = tiny_data(32, seed=8)
    ranking, sizes = kernel.nodes.global_rank, kernel.network.sizes
    for index in range(len(kernel.counts) - 1):
        masks, at = [], 0
        for layer, width in enumerate(sizes[1:-1]):
            mask = np.zeros(width, np.float32)
            mask[ranking[at : at + kernel.counts[index, layer]]] = 1
            masks.append(mask)
            at += width
        np.testing.assert_allclose(_run(kernel, x, index, ROWS, GLOBAL), masked_forward(x, masks), rtol=1e-4, atol=1e-5)


def test_lsh_at_k_below_100_equals_torch_with_the_tables_choice(kernel: Kernel) -> None:
    """The LSH choice replayed outside the kernel: hash each layer's (sparse) input, merge the buckets' lists."""
    x, _ = tiny_data(16, seed=9)
    nodes, net = kernel.nodes, kernel.network
    weights = [net.w[a : a + n_out * n_in].reshape(n_out, n_in) for a, n_in, n_out in
               zip(net.w_off, net.sizes[:-1], net.sizes[1:], strict=True)]  # fmt: skip
    biases = [net.b[a : a + n] for a, n in zip(net.b_off, net.sizes[1:], strict=True)]
    index = 1
    for row in x:
        masks, h, at = [], row, 0
        for layer, width in enumerate(net.sizes[1:-1]):
            pre = weights[layer] @ h + biases[layer]
            keys = np.zeros(nodes.tables, np.int64)
            bucket_keys(pre[nodes.hash_nodes[layer]].astype(np.float32), nodes.bits, nodes.tables, keys)
            selected = np.zeros(width, np.bool_)
            count = kernel.counts[index, layer]
            layer_rank = nodes.global_rank[at : at + width]
            select_lsh(layer, count, keys, nodes.bucket_of, nodes.rank_ptr, nodes.rank_nodes, layer_rank, selected)
            masks.append(selected.astype(np.float32))
            h = np.maximum(pre, 0) * selected
            at += width
        np.testing.assert_allclose(
            _run(kernel, row[None], index, ROWS), masked_forward(row[None], masks), rtol=1e-4, atol=1e-5
        )


def test_random_dropout_is_seeded(kernel: Kernel) -> None:
    x, _ = tiny_data(8, seed=10)
    first, again, other = (_run(kernel, x, 0, ROWS, RANDOM, seed) for seed in (1, 1, 2))
    np.testing.assert_array_equal(first, again)
    assert not np.array_equal(first, other)


def test_aclo_picks_k_per_row_from_the_confidence_tables(kernel: Kernel) -> None:
    x, _ = tiny_data(40, seed=11)
    out = np.empty((len(x), 4), np.float32)
    chosen = np.zeros(len(x), np.int64)
    kernel.run(x, out, chosen, np.zeros(len(x)))  # δ = 0: only k = 100% is surely within it
    assert (chosen == len(kernel.counts) - 1).all() or np.allclose(out, masked_forward(x), atol=1e-4)
    kernel.run(x, out, chosen, np.full(len(x), 1e9))  # any distance is within δ: the smallest k
    assert (chosen == 0).all()


def _gated_run(kernel: Kernel, x: np.ndarray, index: int, dense_at: np.ndarray, threshold: float = -1.0) -> np.ndarray:
    out = np.empty((len(x), int(kernel.network.sizes[-1])), np.float32)
    kernel.gated(dense_at).run(x, out, np.full(len(x), index, np.int64), np.full(len(x), threshold))
    return out


def test_every_layer_gated_dense_is_the_dense_forward_at_every_k(kernel: Kernel) -> None:
    x, _ = tiny_data(32, seed=12)
    dense_at = np.ones_like(kernel.dense_at)
    for index in range(len(kernel.counts)):
        np.testing.assert_allclose(_gated_run(kernel, x, index, dense_at), masked_forward(x), rtol=1e-4, atol=1e-5)
    # ACLO hashes the first layer to choose k; the gated layer then computes the rest of its nodes
    np.testing.assert_allclose(
        _gated_run(kernel, x, 0, dense_at, threshold=1e9), masked_forward(x), rtol=1e-4, atol=1e-5
    )


def test_at_k_100_any_gate_is_the_dense_forward(kernel: Kernel) -> None:
    x, _ = tiny_data(16, seed=13)
    full = len(kernel.counts) - 1
    layers = kernel.dense_at.shape[1]
    for pattern in range(1 << layers):
        dense_at = np.zeros_like(kernel.dense_at)
        dense_at[full] = [(pattern >> layer) & 1 for layer in range(layers)]
        np.testing.assert_allclose(_gated_run(kernel, x, full, dense_at), masked_forward(x), rtol=1e-4, atol=1e-5)


def test_a_gate_changes_only_the_layers_and_ks_it_names(kernel: Kernel) -> None:
    """The output layer computes every node either way; a hidden layer gated dense computes all it had dropped."""
    x, _ = tiny_data(64, seed=14)
    sparse = np.zeros_like(kernel.dense_at)
    output_only, first_hidden = sparse.copy(), sparse.copy()
    output_only[:, -1] = True
    first_hidden[0, 0] = True
    for index in range(len(kernel.counts)):
        np.testing.assert_allclose(
            _gated_run(kernel, x, index, output_only), _gated_run(kernel, x, index, sparse), rtol=1e-4, atol=1e-5
        )
    assert not np.allclose(_gated_run(kernel, x, 0, first_hidden), _gated_run(kernel, x, 0, sparse), atol=1e-5)
    np.testing.assert_array_equal(_gated_run(kernel, x, 1, first_hidden), _gated_run(kernel, x, 1, sparse))
