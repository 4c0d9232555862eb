"""Node Importance LSH tables with FreeHash (SLO-NNs §3.2, §3.4, Algorithm 1), stored as ranked int16 index lists.

FreeHash hashes a layer's input x with K·L of the layer's own nodes: bit = sign(w_i·x + b_i), i.e. whether node i
is active. The nodes are sampled with probability proportional to their activation variance over the training
inputs, so the bits split inputs where the layer actually varies. Table t's key is its K bits. Per bucket, the
activations of the training inputs that fall in it are summed, and the nodes sorted by that sum are the bucket's
ranking.

Storage: a dense float vector per bucket grows as 2^K × nodes (a prototype reached 257 MB at K = 12). Here each
bucket keeps only the ranked node ids (int16) of nodes with a non-zero sum, up to the largest k below 100%, in one
CSR array per model; an empty or unseen bucket falls back to the layer's global ranking, which also fills a list
shorter than k.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import njit

#: Node ids are stored as int16, so a layer may hold at most this many nodes.
MAX_NODES = np.iinfo(np.int16).max
#: Keys are indexes into a direct table of 2^K entries per table.
MAX_BITS = 16


@dataclass(frozen=True)
class NodeTables:
    """Every hidden layer's Node Importance tables, flat so the compiled kernel reads them without Python."""

    bits: int  # K: bits per key
    tables: int  # L: tables per layer
    hash_nodes: np.ndarray  # int32 (hidden layers, K·L): FreeHash nodes; table t uses [t·K, (t+1)·K)
    bucket_of: np.ndarray  # int32 (hidden layers, L, 2^K): index of the bucket's list in rank_ptr, -1 if none
    rank_ptr: np.ndarray  # int64 (lists + 1,): list i is rank_nodes[rank_ptr[i]:rank_ptr[i + 1]]
    rank_nodes: np.ndarray  # int16: each list's nodes by summed activation, highest first
    global_rank: np.ndarray  # int16 (sum of hidden widths,): each layer's nodes by activation over all inputs

    def nbytes(self) -> int:
        return sum(a.nbytes for a in (self.hash_nodes, self.bucket_of, self.rank_ptr, self.rank_nodes))


def sample_hash_nodes(variance: np.ndarray, bits: int, tables: int, rng: np.random.Generator) -> np.ndarray:
    """K·L distinct nodes drawn with probability proportional to activation variance (FreeHash's sampling)."""
    wanted = bits * tables
    if wanted > len(variance):
        raise ValueError(f"K·L = {wanted} hash nodes do not fit a layer of {len(variance)} nodes")
    weights = np.asarray(variance, np.float64) + 1e-12 * max(float(np.max(variance)), 1e-12)
    return rng.choice(len(variance), size=wanted, replace=False, p=weights / weights.sum()).astype(np.int32)


@njit(cache=True)
def bucket_keys(z: np.ndarray, bits: int, tables: int, keys: np.ndarray) -> None:
    """keys[t] = the K sign bits of the hash nodes' pre-activations `z` for table t."""
    for t in range(tables):
        key = 0
        for bit in range(bits):
            if z[t * bits + bit] > 0:
                key |= 1 << bit
        keys[t] = key


@njit(cache=True)
def bucket_keys_batch(z: np.ndarray, bits: int, tables: int) -> np.ndarray:
    """`bucket_keys` for every row of z (rows × K·L): the build path hashes with the runtime's function."""
    keys = np.empty((z.shape[0], tables), np.int64)
    for row in range(z.shape[0]):
        bucket_keys(z[row], bits, tables, keys[row])
    return keys


@njit(cache=True)
def select_lsh(
    layer: int,
    count: int,
    keys: np.ndarray,
    bucket_of: np.ndarray,
    rank_ptr: np.ndarray,
    rank_nodes: np.ndarray,
    global_rank: np.ndarray,
    selected: np.ndarray,
) -> None:
    """Mark `count` nodes: the L buckets' rankings merged round-robin (rank 0 of every table, then rank 1, ...),
    then the layer's global ranking for what the lists lack. Cost is O(count · L), not O(nodes)."""
    tables = keys.shape[0]
    starts = np.empty(tables, np.int64)
    ends = np.empty(tables, np.int64)
    for t in range(tables):
        bucket = bucket_of[layer, t, keys[t]]
        if bucket >= 0:
            starts[t] = rank_ptr[bucket]
            ends[t] = rank_ptr[bucket + 1]
        else:
            starts[t] = ends[t] = 0
    taken = 0
    position = 0
    remaining = True
    while taken < count and remaining:
        remaining = False
        for t in range(tables):
            at = starts[t] + position
            if at < ends[t]:
                remaining = True
                node = rank_nodes[at]
                if not selected[node]:
                    selected[node] = True
                    taken += 1
                    if taken == count:
                        return
        position += 1
    for node in global_rank:
        if taken == count:
            return
        if not selected[node]:
            selected[node] = True
            taken += 1


@njit(cache=True)
def _segment_sums(segment: np.ndarray, rows: np.ndarray, sums: np.ndarray) -> None:
    """sums[segment[r]] += rows[r] (numpy's reduceat on rows was the build's slowest step)."""
    for r in range(rows.shape[0]):
        sums[segment[r]] += rows[r]


class LayerTableBuilder:
    """Algorithm 1 for one layer, streamed over chunks of training inputs: per table and bucket, summed activations."""

    def __init__(self, nodes: int, hash_nodes: np.ndarray, bits: int, tables: int) -> None:
        if nodes > MAX_NODES:
            raise ValueError(f"a layer of {nodes} nodes does not fit int16 node ids (at most {MAX_NODES})")
        if not 1 <= bits <= MAX_BITS:
            raise ValueError(f"K must be 1..{MAX_BITS} bits, got {bits}")
        self.hash_nodes, self.bits, self.tables = hash_nodes, bits, tables
        self.sums: list[dict[int, np.ndarray]] = [{} for _ in range(tables)]  # only buckets an input reached
        self.total = np.zeros(nodes, np.float64)

    def add(self, pre_activations: np.ndarray) -> None:
        """A chunk's pre-activations (rows × nodes) of this layer, computed on its dense input."""
        activations = np.maximum(pre_activations, 0).astype(np.float64)
        keys = bucket_keys_batch(np.ascontiguousarray(pre_activations[:, self.hash_nodes]), self.bits, self.tables)
        self.total += activations.sum(axis=0)
        for t in range(self.tables):
            present, inverse = np.unique(keys[:, t], return_inverse=True)
            sums = np.zeros((len(present), activations.shape[1]), np.float64)
            _segment_sums(inverse, activations, sums)
            for key, row in zip(present.tolist(), sums, strict=True):
                known = self.sums[t].get(key)
                self.sums[t][key] = row if known is None else known + row

    def finish(self, max_rank: int) -> tuple[list[np.ndarray | None], np.ndarray]:
        """Per (table, bucket) its ranked list (None for a bucket no input reached), and the global ranking."""
        lists: list[np.ndarray | None] = []
        for t in range(self.tables):
            for key in range(1 << self.bits):
                sums = self.sums[t].get(key)
                if sums is None or not sums.any():
                    lists.append(None)
                    continue
                ranked = np.argsort(-sums, kind="stable")[: min(max_rank, int(np.count_nonzero(sums)))]
                lists.append(ranked.astype(np.int16))
        return lists, np.argsort(-self.total, kind="stable").astype(np.int16)


def pack_tables(
    bits: int, tables: int, hash_nodes: list[np.ndarray], layers: list[tuple[list[np.ndarray | None], np.ndarray]]
) -> NodeTables:
    """Every layer's finished lists in one CSR array of int16 node ids."""
    bucket_of = np.full((len(layers), tables, 1 << bits), -1, np.int32)
    pieces: list[np.ndarray] = []
    pointers = [0]
    for layer, (lists, _) in enumerate(layers):
        for index, ranked in enumerate(lists):
            if ranked is None:
                continue
            bucket_of[layer, index >> bits, index & ((1 << bits) - 1)] = len(pieces)
            pieces.append(ranked)
            pointers.append(pointers[-1] + len(ranked))
    return NodeTables(
        bits=bits,
        tables=tables,
        hash_nodes=np.stack(hash_nodes).astype(np.int32),
        bucket_of=bucket_of,
        rank_ptr=np.asarray(pointers, np.int64),
        rank_nodes=np.concatenate(pieces).astype(np.int16) if pieces else np.zeros(0, np.int16),
        global_rank=np.concatenate([ranking for _, ranking in layers]).astype(np.int16),
    )
