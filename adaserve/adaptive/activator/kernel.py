"""The compiled forward of one row: only the chosen nodes of each hidden layer, reading only the active inputs.

One kernel, three plans (`plan`):

* `DENSE` — the tuned dense kernel: every node of every layer is a contiguous dot product over the whole input,
  four output rows at a time sharing each input load. The benchmarks' dense baseline.
* `ROWS` — the paper's forward, at every hidden layer: FreeHash the layer's input with its K·L hash nodes, choose
  the top ⌈k·n⌉ nodes from the Node Importance tables (or, for the baselines, a static global ranking or a random
  draw), and compute only those rows. A row reads only the active (chosen and non-zero) inputs — gathered while
  they are few, else through a zero-filled contiguous input, whichever costs less. Hash nodes that are also chosen
  are not computed twice. Used to compare rankings at equal node counts.
* `SERVE` — what serving runs: per layer, the cheaper of the `ROWS` step and the *column form*, which computes
  every node of the layer from the active inputs only (a contiguous pass over the transposed weights per active
  input, no dropout and no ranking needed). When few inputs are active the column form is cheaper than even a
  small top-k, so the layer keeps all its nodes at no extra cost. At k = 100% this is the exact forward that skips
  zero activations: never more work than `DENSE`.

  Where the build measured that a layer's dense step is faster than its sparse one at a k (`dense_at`, see
  `adaserve.adaptive.activator.gate`), `SERVE` runs that layer as `DENSE` does: every node, a contiguous dot
  product over the whole input (hash nodes ACLO already computed are not computed twice). A small layer with
  dense inputs gains nothing from choosing nodes, and hashing and gathering would make it slower.

Weights are flat float32 buffers: layer l at `w_off[l]`, out × in row-major in `w` (a chosen node's weights are one
contiguous row) and in × out in `wt` (an active input's weights are one contiguous row). `parallel=False`: a
worker owns its cores, and the kernel runs one request row on one core.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
from numba import njit

from adaserve.adaptive.activator.artifact import Activator, no_dense_layers
from adaserve.adaptive.activator.confidence import ConfidenceTables, estimate_distance, first_within
from adaserve.adaptive.activator.layers import MLPLayers
from adaserve.adaptive.activator.lsh import NodeTables, bucket_keys, select_lsh

__all__ = ["DENSE", "GLOBAL", "LSH", "RANDOM", "ROWS", "SERVE", "Kernel", "PackedNetwork", "node_counts"]

Array = np.ndarray

#: Plans (see the module docstring).
SERVE, ROWS, DENSE = 0, 1, 2
#: How a hidden layer's nodes are ranked: the activator's LSH tables, or the baselines.
LSH, GLOBAL, RANDOM = 0, 1, 2
#: Cost of one multiply-add relative to a row's contiguous one, measured on this machine's AVX-512 cores (a
#: gathered one costs 0.3-2 ns against 0.07-0.14 ns; the column form's 0.07-0.14 ns): they steer the plan only.
GATHER_COST = 5.0
COLUMN_COST = 0.8


@dataclass(frozen=True)
class PackedNetwork:
    """An MLP's weights in the kernel's layout."""

    sizes: np.ndarray  # int64 (layers + 1,)
    w: np.ndarray  # float32 flat: each layer out × in
    wt: np.ndarray  # float32 flat: each layer in × out (the transpose, for the column form)
    w_off: np.ndarray  # int64 (layers,): where each layer starts in w and in wt
    b: np.ndarray  # float32 flat
    b_off: np.ndarray  # int64 (layers,)

    @classmethod
    def from_layers(cls, layers: MLPLayers) -> PackedNetwork:
        w_sizes = [w.size for w in layers.weights]
        b_sizes = [b.size for b in layers.biases]
        return cls(
            sizes=np.asarray(layers.sizes, np.int64),
            w=np.concatenate([w.ravel() for w in layers.weights]).astype(np.float32),
            wt=np.concatenate([w.T.ravel() for w in layers.weights]).astype(np.float32),
            w_off=np.cumsum([0, *w_sizes[:-1]]).astype(np.int64),
            b=np.concatenate(layers.biases).astype(np.float32),
            b_off=np.cumsum([0, *b_sizes[:-1]]).astype(np.int64),
        )


def node_counts(k_grid: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """(k grid × hidden layers): nodes computed per hidden layer at each k, ⌈k·n⌉ and at least one."""
    hidden = np.asarray(sizes[1:-1], np.float64)
    return np.clip(np.ceil(np.round(np.outer(k_grid, hidden), 6)), 1, hidden).astype(np.int64)


@dataclass(frozen=True)
class Kernel:
    """Everything the compiled forward reads, bound once; `run` computes rows of a batch."""

    network: PackedNetwork
    nodes: NodeTables
    confidence: ConfidenceTables
    counts: np.ndarray  # int64 (k grid × hidden layers)
    dense_at: np.ndarray  # bool (k grid × layers): where `SERVE` runs a layer densely

    @classmethod
    def build(cls, network: PackedNetwork, activator: Activator) -> Kernel:
        if tuple(network.sizes) != activator.sizes:
            raise ValueError(f"activator for layers {activator.sizes}, network has {tuple(network.sizes)}")
        counts = node_counts(activator.k_grid, network.sizes)
        return cls(network, activator.nodes, activator.confidence, counts, activator.dense_at)

    @classmethod
    def sparse(cls, network: PackedNetwork, nodes: NodeTables, confidence: ConfidenceTables, k_grid: Array) -> Kernel:
        """Sparse at every layer and k (no `dense_at` measured yet): what the build measures and gates."""
        counts = node_counts(k_grid, network.sizes)
        return cls(network, nodes, confidence, counts, no_dense_layers(len(k_grid), len(network.sizes) - 1))

    def gated(self, dense_at: Array) -> Kernel:
        """This kernel with `SERVE` running the layers `dense_at` names densely."""
        if dense_at.shape != self.dense_at.shape:
            raise ValueError(f"dense_at has shape {dense_at.shape}, the kernel's is {self.dense_at.shape}")
        return replace(self, dense_at=dense_at.astype(np.bool_))

    @classmethod
    def dense(cls, network: PackedNetwork) -> Kernel:
        """Only k = 100% (grid index 0) and no tables: the forward without an activator."""
        hidden = [int(n) for n in network.sizes[1:-1]]
        nodes = NodeTables(
            bits=1,
            tables=1,
            hash_nodes=np.zeros((len(hidden), 1), np.int32),
            bucket_of=np.full((len(hidden), 1, 2), -1, np.int32),
            rank_ptr=np.zeros(1, np.int64),
            rank_nodes=np.zeros(0, np.int16),
            global_rank=np.concatenate([np.arange(n) for n in hidden]).astype(np.int16),
        )
        confidence = ConfidenceTables(
            np.full((1, 2), -1, np.int32), np.zeros((0, 1), np.float32), np.zeros(1, np.float32)
        )
        counts = node_counts(np.ones(1), network.sizes)
        return cls(network, nodes, confidence, counts, no_dense_layers(1, len(network.sizes) - 1))

    def run(
        self,
        x: np.ndarray,
        out: np.ndarray,
        k_index: np.ndarray,
        threshold: np.ndarray,
        plan: int = SERVE,
        ranking: int = LSH,
        seed: int = 0,
    ) -> None:
        """Rows of `x` (rows × inputs, float32) into `out` (rows × outputs). Per row: a grid index in `k_index`,
        or, where `threshold[row]` ≥ 0, ACLO picks it from the confidence tables (written back to `k_index`)."""
        net, nodes, conf = self.network, self.nodes, self.confidence
        forward_rows(
            x, out, k_index, threshold, plan, ranking, seed,
            net.sizes, net.w, net.wt, net.w_off, net.b, net.b_off, self.counts, self.dense_at,
            nodes.bits, nodes.hash_nodes, nodes.bucket_of, nodes.rank_ptr, nodes.rank_nodes, nodes.global_rank,
            conf.bucket_of, conf.values, conf.global_mean,
        )  # fmt: skip


@njit(cache=True, fastmath=True)
def forward_rows(
    x: Array, out: Array, k_index: Array, threshold: Array, plan: int, ranking: int, seed: int,
    sizes: Array, w: Array, wt: Array, w_off: Array, b: Array, b_off: Array, counts: Array, dense_at: Array,
    bits: int, hash_nodes: Array, bucket_of: Array, rank_ptr: Array, rank_nodes: Array, global_rank: Array,
    conf_bucket_of: Array, conf_values: Array, conf_global: Array,
) -> None:  # fmt: skip
    """Rows of x into out; see `Kernel.run`."""
    if ranking == RANDOM:
        np.random.seed(seed)
    widest = 0
    for size in sizes:
        widest = max(widest, size)
    buffers = _buffers(widest, hash_nodes.shape[1], hash_nodes.shape[1] // bits, counts.shape[0])
    for row in range(x.shape[0]):
        k_index[row] = _forward_row(
            x[row], out[row], k_index[row], threshold[row], plan, ranking, buffers,
            sizes, w, wt, w_off, b, b_off, counts, dense_at,
            bits, hash_nodes, bucket_of, rank_ptr, rank_nodes, global_rank,
            conf_bucket_of, conf_values, conf_global,
        )  # fmt: skip


@njit(cache=True)
def _buffers(widest: int, hashed: int, tables: int, grid: int) -> tuple[Array, ...]:
    """Scratch of one call, allocated once for all its rows."""
    return (
        np.empty(widest, np.float32),  # dense: the layer's input, zero-filled where inactive
        np.empty(widest, np.uint32),  # active: ids of the active (non-zero) inputs
        np.empty(widest, np.float32),  # values: their values
        np.empty(widest, np.float32),  # pre: the layer's computed pre-activations (without bias)
        np.zeros(widest, np.bool_),  # known: nodes already computed (hash nodes)
        np.zeros(widest, np.bool_),  # selected: nodes chosen for this layer
        np.empty(widest, np.int64),  # todo: nodes left to compute
        np.empty(hashed, np.float32),  # hashed: the hash nodes' pre-activations
        np.empty(tables, np.int64),  # keys of the L tables
        np.empty(grid, np.float64),  # estimate: d̂ over the k grid
    )


@njit(cache=True, fastmath=True)
def _forward_row(
    x: Array, out: Array, k: int, threshold: float, plan: int, ranking: int, buffers: tuple[Array, ...],
    sizes: Array, w: Array, wt: Array, w_off: Array, b: Array, b_off: Array, counts: Array, dense_at: Array,
    bits: int, hash_nodes: Array, bucket_of: Array, rank_ptr: Array, rank_nodes: Array, global_rank: Array,
    conf_bucket_of: Array, conf_values: Array, conf_global: Array,
) -> int:  # fmt: skip
    """One row through every layer; returns the grid index of k it used."""
    dense, active, values, pre, known, selected, todo, hashed, keys, estimate = buffers
    layers = sizes.shape[0] - 1
    dense[: sizes[0]] = x
    dense_valid = True  # `dense` holds the layer's input (else only active/values do)
    n_active = 0
    if plan != DENSE:
        for i in range(sizes[0]):
            if x[i] != 0:
                active[n_active] = i
                values[n_active] = x[i]
                n_active += 1
    rank_at = 0
    for layer in range(layers):
        n_in, n_out, base = sizes[layer], sizes[layer + 1], w_off[layer]
        bias = b[b_off[layer] : b_off[layer] + n_out]
        is_hidden = layer < layers - 1
        gather = plan != DENSE and GATHER_COST * n_active < n_in
        hashing = is_hidden and plan != DENSE and ranking == LSH
        hashed_now = False
        if hashing and layer == 0 and threshold >= 0:  # ACLO: k comes from the first layer's keys
            _hash(w, base, n_in, hash_nodes[layer], gather, dense, active, values, n_active, pre, bias,
                  known, hashed, bits, keys)  # fmt: skip
            hashed_now = True
            estimate_distance(keys, conf_bucket_of, conf_values, conf_global, estimate)
            k = first_within(estimate, threshold)
        layer_dense = plan == DENSE or (plan == SERVE and dense_at[k, layer])
        gather = gather and not layer_dense
        if not gather and not dense_valid:
            dense[:n_in] = 0.0
            for i in range(n_active):
                dense[active[i]] = values[i]
            dense_valid = True
        per_row = GATHER_COST * n_active if gather else n_in
        count = counts[k, layer] if is_hidden and not layer_dense else n_out
        column = False
        if plan == SERVE and not layer_dense:  # one choice whether ACLO hashed already or not: one plan per input
            extra_hash = hash_nodes.shape[1] if hashing and count < n_out else 0
            column = COLUMN_COST * n_active * n_out < (count + extra_hash) * per_row
        if column:
            _columns(wt, base, n_out, active, values, n_active, pre)
            count = n_out
        else:
            if count < n_out:
                if ranking == LSH:
                    if not hashed_now:
                        _hash(w, base, n_in, hash_nodes[layer], gather, dense, active, values, n_active, pre,
                              bias, known, hashed, bits, keys)  # fmt: skip
                    layer_rank = global_rank[rank_at : rank_at + n_out]
                    select_lsh(layer, count, keys, bucket_of, rank_ptr, rank_nodes, layer_rank, selected)
                elif ranking == GLOBAL:
                    for i in range(count):
                        selected[global_rank[rank_at + i]] = True
                else:
                    _select_random(count, n_out, todo, selected)
            else:
                selected[:n_out] = True
            n_todo = 0
            for node in range(n_out):
                if selected[node] and not known[node]:
                    todo[n_todo] = node
                    n_todo += 1
            _rows(w, base, n_in, todo, n_todo, gather, dense, active, values, n_active, pre)
        if not is_hidden:
            for node in range(n_out):
                out[node] = pre[node] + bias[node]
        elif plan == DENSE or (plan == SERVE and dense_at[k, layer + 1]):  # the next layer reads `dense`
            for node in range(n_out):
                computed = count == n_out or selected[node]
                dense[node] = max(pre[node] + bias[node], 0.0) if computed else 0.0
            dense_valid = True
        else:
            n_active = 0
            for node in range(n_out):
                if count == n_out or selected[node]:
                    value = pre[node] + bias[node]
                    if value > 0:
                        active[n_active] = node
                        values[n_active] = value
                        n_active += 1
            dense_valid = False
        known[:n_out] = False
        selected[:n_out] = False
        rank_at += n_out
    return k


@njit(cache=True, fastmath=True)
def _hash(
    w: Array, base: int, n_in: int, nodes: Array, gather: bool, dense: Array, active: Array, values: Array,
    n_active: int, pre: Array, bias: Array, known: Array, hashed: Array, bits: int, keys: Array,
) -> None:  # fmt: skip
    """FreeHash: the hash nodes' pre-activations sign(w_i·x + b_i) give the L keys; the nodes count as computed."""
    _rows(w, base, n_in, nodes, nodes.shape[0], gather, dense, active, values, n_active, pre)
    for i in range(nodes.shape[0]):
        known[nodes[i]] = True
        hashed[i] = pre[nodes[i]] + bias[nodes[i]]
    bucket_keys(hashed, bits, keys.shape[0], keys)


@njit(cache=True)
def _select_random(count: int, n_out: int, scratch: Array, selected: Array) -> None:
    """`count` distinct nodes drawn uniformly (a partial Fisher-Yates shuffle): the random-dropout baseline."""
    for i in range(n_out):
        scratch[i] = i
    for i in range(count):
        j = np.random.randint(i, n_out)
        scratch[i], scratch[j] = scratch[j], scratch[i]
        selected[scratch[i]] = True


@njit(cache=True, fastmath=True)
def _rows(
    w: Array, base: int, n_in: int, rows: Array, n_rows: int, gather: bool, dense: Array, active: Array,
    values: Array, n_active: int, pre: Array,
) -> None:  # fmt: skip
    """pre[r] = W[r] · input for each r in rows[:n_rows], reading `dense` or gathering the (active, values) pairs.
    Four rows at a time share each input load."""
    j = 0
    while j + 4 <= n_rows:
        r0, r1, r2, r3 = rows[j], rows[j + 1], rows[j + 2], rows[j + 3]
        w0 = w[base + r0 * n_in : base + (r0 + 1) * n_in]
        w1 = w[base + r1 * n_in : base + (r1 + 1) * n_in]
        w2 = w[base + r2 * n_in : base + (r2 + 1) * n_in]
        w3 = w[base + r3 * n_in : base + (r3 + 1) * n_in]
        a0 = a1 = a2 = a3 = np.float32(0.0)
        if gather:
            for i in range(n_active):
                c, v = active[i], values[i]
                a0 += w0[c] * v
                a1 += w1[c] * v
                a2 += w2[c] * v
                a3 += w3[c] * v
        else:
            for i in range(n_in):
                v = dense[i]
                a0 += w0[i] * v
                a1 += w1[i] * v
                a2 += w2[i] * v
                a3 += w3[i] * v
        pre[r0], pre[r1], pre[r2], pre[r3] = a0, a1, a2, a3
        j += 4
    while j < n_rows:
        r = rows[j]
        wr = w[base + r * n_in : base + (r + 1) * n_in]
        a = np.float32(0.0)
        if gather:
            for i in range(n_active):
                a += wr[active[i]] * values[i]
        else:
            for i in range(n_in):
                a += wr[i] * dense[i]
        pre[r] = a
        j += 1


@njit(cache=True, fastmath=True)
def _columns(wt: Array, base: int, n_out: int, active: Array, values: Array, n_active: int, pre: Array) -> None:
    """pre[:n_out] = Σ over active inputs of value · Wᵀ[input]: every node, reading only the active inputs'
    weight rows (contiguous), two at a time."""
    acc = pre[:n_out]
    acc[:] = 0.0
    i = 0
    while i + 2 <= n_active:
        c0, c1 = active[i], active[i + 1]
        v0, v1 = values[i], values[i + 1]
        t0 = wt[base + c0 * n_out : base + (c0 + 1) * n_out]
        t1 = wt[base + c1 * n_out : base + (c1 + 1) * n_out]
        for o in range(n_out):
            acc[o] += t0[o] * v0 + t1[o] * v1
        i += 2
    if i < n_active:
        c0, v0 = active[i], values[i]
        t0 = wt[base + c0 * n_out : base + (c0 + 1) * n_out]
        for o in range(n_out):
            acc[o] += t0[o] * v0
