"""FreeHash keys, Node Importance tables (ranked int16 lists in CSR form) and the round-robin merge."""

from __future__ import annotations

import numpy as np

from adaserve.adaptive.activator.artifact import Activator
from adaserve.adaptive.activator.layers import MLPLayers
from adaserve.adaptive.activator.lsh import (
    LayerTableBuilder,
    bucket_keys,
    bucket_keys_batch,
    pack_tables,
    sample_hash_nodes,
    select_lsh,
)
from tests.adaptive.activator.conftest import tiny_data


def test_keys_are_the_sign_bits_of_each_tables_hash_nodes() -> None:
    z = np.array([1.0, -1.0, 2.0, 0.0, -3.0, 4.0], np.float32)  # K = 3, L = 2
    keys = np.zeros(2, np.int64)
    bucket_keys(z, 3, 2, keys)
    assert keys.tolist() == [0b101, 0b100]
    assert bucket_keys_batch(z[None], 3, 2).tolist() == [[0b101, 0b100]]


def test_hash_nodes_are_distinct_and_never_drawn_from_nodes_that_do_not_vary() -> None:
    variance = np.r_[np.zeros(10), np.ones(10)]
    nodes = sample_hash_nodes(variance, bits=2, tables=5, rng=np.random.default_rng(0))
    assert len(set(nodes.tolist())) == 10 and nodes.min() >= 10


def test_each_bucket_ranks_nodes_by_summed_activation_stored_as_int16(layers: MLPLayers) -> None:
    x, _ = tiny_data(500)
    pre = layers.pre_activations(x)[0]
    hashed = np.arange(6, dtype=np.int32)
    builder = LayerTableBuilder(pre.shape[1], hashed, bits=3, tables=2)
    builder.add(pre[:200])
    builder.add(pre[200:])
    lists, ranking = builder.finish(max_rank=30)
    tables = pack_tables(3, 2, [hashed], [(lists, ranking)])
    assert tables.rank_nodes.dtype == np.int16 and tables.global_rank.dtype == np.int16
    keys = bucket_keys_batch(np.ascontiguousarray(pre[:, hashed]), 3, 2)
    activations = np.maximum(pre, 0)
    for t in range(2):
        for key in np.unique(keys[:, t]):
            sums = activations[keys[:, t] == key].sum(axis=0)
            index = tables.bucket_of[0, t, key]
            ranked = tables.rank_nodes[tables.rank_ptr[index] : tables.rank_ptr[index + 1]]
            assert len(ranked) == min(30, np.count_nonzero(sums))
            assert np.all(np.diff(sums[ranked]) <= 1e-9)  # highest summed activation first
            assert sums[ranked[-1]] >= np.sort(sums)[::-1][len(ranked) - 1] - 1e-9
    assert tables.bucket_of[0][tables.bucket_of[0] >= 0].size == len(tables.rank_ptr) - 1


def test_the_merge_takes_each_tables_next_node_in_turn_then_the_global_ranking() -> None:
    bucket_of = np.array([[[0, -1], [1, -1]]], np.int32)  # one layer, two tables of one bit
    rank_ptr = np.array([0, 3, 5], np.int64)
    rank_nodes = np.array([4, 2, 7, 2, 5], np.int16)  # table 0: 4 2 7, table 1: 2 5
    global_rank = np.arange(8, dtype=np.int16)[::-1].copy()
    for count, expected in [(2, {4, 2}), (4, {4, 2, 5, 7}), (6, {4, 2, 5, 7, 6, 3})]:
        selected = np.zeros(8, np.bool_)
        select_lsh(0, count, np.array([0, 0]), bucket_of, rank_ptr, rank_nodes, global_rank, selected)
        assert set(np.flatnonzero(selected).tolist()) == expected
    selected = np.zeros(8, np.bool_)  # an unseen bucket: the global ranking alone
    select_lsh(0, 3, np.array([1, 1]), bucket_of, rank_ptr, rank_nodes, global_rank, selected)
    assert set(np.flatnonzero(selected).tolist()) == {7, 6, 5}


def test_the_built_activator_stores_compact_lists(activator: Activator) -> None:
    nodes = activator.nodes
    assert nodes.rank_nodes.dtype == np.int16
    widest_list = int(np.diff(nodes.rank_ptr).max())
    assert widest_list <= 24  # lists stop at the largest k below 100% (0.5 of 48 nodes)
