"""`adaserve activator build`: train a model's node activator from data and store it beside the model.

Everything below is computed on the MLP head's inputs: for a model with layers before its head (a CNN's
convolutions), the prefix runs over the data first, in chunks of `_CHUNK` rows, so only the sampled rows' head
inputs are held at once.

1. Inputs for the tables, and labelled held-out inputs the model never saw for the calibration (`BuildData`).
2. FreeHash nodes per hidden layer, sampled by activation variance.
3. Node Importance tables (Algorithm 1) over the table inputs, streamed in chunks.
4. The gate (`gate`): at each k, each layer timed sparse and dense on held-out inputs; it runs sparse only where
   that is faster. Everything after is measured on the gated kernel; after the calibration, the least threshold
   from which ACLO beats computing k = 100% outright is timed too.
5. Confidence tables: c(k, x) = −KL(full ‖ top-k) for every k of the grid, computed with the runtime's own kernel
   (so hashing on sparse inputs and the chosen nodes are exactly what serving will do), averaged per bucket.
6. Calibration on the held-out part: the ACLO rule's accuracy at each confidence threshold.
7. Latency profile T(k, β) for β = 0 … N co-located busy processes. T is the head's sparse kernel alone, without
   the prefix: k does not change the prefix's cost, and at run time LCAO measures the time a request has already
   spent (its t0) after its prefix ran, so the prefix is counted exactly rather than predicted. The busy processes
   run the head densely.
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from adaserve.adaptive.activator.artifact import Activator, save_activator
from adaserve.adaptive.activator.confidence import (
    Calibration,
    ConfidenceTables,
    build_confidence,
    calibrate,
    estimate_distance,
    kl_divergence,
)
from adaserve.adaptive.activator.gate import measure_aclo_floor, measure_dense_layers
from adaserve.adaptive.activator.kernel import LSH, SERVE, Kernel, PackedNetwork, node_counts
from adaserve.adaptive.activator.latency import measure_latency
from adaserve.adaptive.activator.layers import NO_PREFIX, MLPLayers, Prefix, extract_head
from adaserve.adaptive.activator.lsh import (
    LayerTableBuilder,
    NodeTables,
    bucket_keys_batch,
    pack_tables,
    sample_hash_nodes,
)
from adaserve.errors import ConfigError
from adaserve.repository import ModelSpec, load_artifact

__all__ = ["DEFAULT_GRID", "BuildData", "BuildOptions", "build_activator", "build_tables"]

#: The k grid (fraction of each hidden layer's nodes); finer where sparse inputs land.
DEFAULT_GRID = (0.02, 0.04, 0.06, 0.08, 0.1, 0.125, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 1.0)
_CHUNK = 4096


@dataclass(frozen=True)
class BuildOptions:
    bits: int = 8  # K: bits per LSH key
    tables: int = 16  # L: tables per layer
    k_grid: tuple[float, ...] = DEFAULT_GRID
    max_confidence_inputs: int = 10_000  # table inputs whose c(k, x) fill the confidence tables
    max_calibration_inputs: int = 10_000  # held-out inputs the threshold is calibrated on
    busy_levels: int | None = None  # N: β = 0 … N; default the CPUs this process may use
    latency_repeats: int = 300
    seed: int = 0
    gate: bool = True  # time layers and ACLO against dense (`gate`); False: sparse everywhere, as the paper

    def __post_init__(self) -> None:
        grid = np.asarray(self.k_grid)
        if grid.size == 0 or grid[-1] != 1.0 or (np.diff(grid) <= 0).any() or grid[0] <= 0:
            raise ValueError(f"the k grid must ascend within (0, 1] and end at 1.0, got {list(self.k_grid)}")


@dataclass(frozen=True)
class BuildData:
    """Inputs for the tables (no labels needed: the model's training inputs are fine) and labelled held-out
    inputs for the calibration (they must be unseen by the model, or a_t is its training accuracy)."""

    table_x: np.ndarray
    held_x: np.ndarray
    held_y: np.ndarray
    description: str

    def flat(self, width: int, model: str) -> BuildData:
        """The inputs as contiguous float32 rows of `width` values (the model's input rows, not its head's);
        ConfigError when they do not fit the model."""
        table_x = np.ascontiguousarray(self.table_x.reshape(len(self.table_x), -1), dtype=np.float32)
        held_x = np.ascontiguousarray(self.held_x.reshape(len(self.held_x), -1), dtype=np.float32)
        if table_x.shape[1] != width or held_x.shape[1] != width:
            raise ConfigError(f"data rows have {table_x.shape[1]} values, model '{model}' takes {width}")
        if len(self.held_y) != len(held_x) or len(held_x) == 0 or len(table_x) == 0:
            raise ConfigError(
                f"data: {len(table_x)} table inputs, {len(held_x)} held-out inputs with {len(self.held_y)} labels"
            )
        return replace(self, table_x=table_x, held_x=held_x, held_y=np.asarray(self.held_y).astype(np.int64))


@dataclass
class _Progress:
    bar: Any

    def step(self, stage: str) -> None:
        self.bar.set_postfix_str(stage, refresh=False)
        self.bar.update()


def build_activator(
    spec: ModelSpec, data: BuildData, options: BuildOptions, *, progress: bool = True
) -> tuple[Path, Activator]:
    """Build the activator of the served version of `spec` and save it as the next version in its directory."""
    model = load_artifact(spec.artifact, spec.config.max_batch_size)
    row_shape = spec.config.inputs[0].row_shape
    head = extract_head(model, row_shape, spec.name)
    data = data.flat(int(np.prod(row_shape)), spec.name)
    began = time.monotonic()
    activator = build_tables(head.layers, data, options, progress=progress, prefix=head.prefix)
    activator = replace(
        activator,
        model_version=spec.version,
        weights_sha256=head.layers.digest(),
        prefix_sha256=head.prefix.digest(),
    )
    activator.built.update(
        {
            "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "data": data.description,
            "options": asdict(options),
            "build_s": round(time.monotonic() - began, 1),
        }
    )
    return save_activator(spec.directory, activator), activator


def build_tables(
    layers: MLPLayers, data: BuildData, options: BuildOptions, *, progress: bool = False, prefix: Prefix = NO_PREFIX
) -> Activator:
    """Steps 2-7 on flat float32 inputs of the model (`prefix` gives the head's); the result is bound to no model
    version yet (0, no digests)."""
    narrowest = min(layers.sizes[1:-1])
    if options.bits * options.tables > narrowest:
        raise ConfigError(
            f"K·L = {options.bits}·{options.tables} hash nodes do not fit the narrowest hidden layer ({narrowest} "
            "nodes); lower the bits or the tables"
        )
    rng = np.random.default_rng(options.seed)
    x = data.table_x
    held_x = _head_inputs(prefix, data.held_x[: options.max_calibration_inputs])
    held_y = data.held_y[: options.max_calibration_inputs]
    grid = np.asarray(options.k_grid, np.float64)
    network = PackedNetwork.from_layers(layers)
    counts = node_counts(grid, network.sizes)
    levels = options.busy_levels if options.busy_levels is not None else len(os.sched_getaffinity(0))
    chunks = -(-len(x) // _CHUNK)
    total = 1 + chunks + 1 + (len(grid) - 1) * 2 + 1 + levels + 1
    with tqdm(total=total, disable=not progress, unit="step", desc="activator") as bar:
        steps = _Progress(bar)
        sample = _head_inputs(prefix, x[rng.permutation(len(x))[:10_000]])
        hash_nodes = [
            sample_hash_nodes(np.maximum(pre, 0).var(axis=0), options.bits, options.tables, rng)
            for pre in layers.pre_activations(sample)[:-1]
        ]
        steps.step("FreeHash nodes")
        builders = [
            LayerTableBuilder(n, hash_nodes[layer], options.bits, options.tables)
            for layer, n in enumerate(layers.sizes[1:-1])
        ]
        for start in range(0, len(x), _CHUNK):
            for layer, pre in enumerate(layers.pre_activations(prefix(x[start : start + _CHUNK]))[:-1]):
                builders[layer].add(pre)
            steps.step("node tables")
        deepest = counts[-2] if len(grid) > 1 else counts[-1]  # lists need not reach k = 100%
        finished = [builder.finish(int(m)) for builder, m in zip(builders, deepest, strict=True)]
        nodes = pack_tables(options.bits, options.tables, hash_nodes, finished)
        unused = ConfidenceTables(
            np.full((options.tables, 1 << options.bits), -1, np.int32),
            np.zeros((0, len(grid)), np.float32),
            np.zeros(len(grid), np.float32),
        )
        sparse = Kernel.sparse(network, nodes, unused, grid)
        dense_at = measure_dense_layers(sparse, held_x[:256]) if options.gate else sparse.dense_at
        steps.step("dense gate")
        conf_x = sample[: options.max_confidence_inputs]
        distances = _distances(sparse.gated(dense_at), layers, conf_x, steps)
        confidence = build_confidence(_first_layer_keys(layers, nodes, conf_x), distances, options.bits)
        kernel = replace(sparse, confidence=confidence).gated(dense_at)
        calibration = _calibrate(kernel, layers, held_x, held_y, steps)
        aclo_from = measure_aclo_floor(kernel, held_x[:256], calibration.thresholds) if options.gate else 0.0
        latency = measure_latency(kernel, held_x[:256], levels, options.latency_repeats, lambda: steps.step("latency"))
        steps.step("done")
    return Activator(
        model_version=0,
        weights_sha256="",
        sizes=layers.sizes,
        k_grid=grid,
        nodes=nodes,
        confidence=confidence,
        calibration=calibration,
        latency=latency,
        dense_at=dense_at,
        aclo_from=aclo_from,
        built={"table_inputs": len(x), "confidence_inputs": len(conf_x), "held_out": len(held_x)},
    )


def _head_inputs(prefix: Prefix, x: np.ndarray) -> np.ndarray:
    """The head's inputs for rows of the model's input, the prefix run `_CHUNK` rows at a time."""
    if prefix.empty:
        return x
    return np.concatenate([prefix(x[start : start + _CHUNK]) for start in range(0, len(x), _CHUNK)])


def _first_layer_keys(layers: MLPLayers, nodes: NodeTables, x: np.ndarray) -> np.ndarray:
    """The L keys of each input in the first hidden layer's tables (those the confidence tables share)."""
    hashed = nodes.hash_nodes[0]
    z = x @ layers.weights[0][hashed].T + layers.biases[0][hashed]
    return bucket_keys_batch(np.ascontiguousarray(z, dtype=np.float32), nodes.bits, nodes.tables)


def _sparse_logits(kernel: Kernel, x: np.ndarray, index: int) -> np.ndarray:
    out = np.empty((len(x), int(kernel.network.sizes[-1])), np.float32)
    kernel.run(x, out, np.full(len(x), index, np.int64), np.full(len(x), -1.0), SERVE, LSH)
    return out


def _distances(kernel: Kernel, layers: MLPLayers, x: np.ndarray, steps: _Progress) -> np.ndarray:
    """KL(full ‖ top-k) for every input and k (0 at k = 100% by definition, not computed)."""
    full = layers.forward(x)
    grid = len(kernel.counts)
    distances = np.zeros((len(x), grid))
    for index in range(grid - 1):
        distances[:, index] = kl_divergence(full, _sparse_logits(kernel, x, index))
        steps.step("confidence tables")
    return distances


def _calibrate(kernel: Kernel, layers: MLPLayers, x: np.ndarray, y: np.ndarray, steps: _Progress) -> Calibration:
    conf = kernel.confidence
    keys = _first_layer_keys(layers, kernel.nodes, x)
    grid = len(kernel.counts)
    estimates = np.empty((len(x), grid))
    for row in range(len(x)):
        estimate_distance(keys[row], conf.bucket_of, conf.values, conf.global_mean, estimates[row])
    dense_correct = layers.forward(x).argmax(axis=1) == y
    correct = np.empty((len(x), grid), np.bool_)
    correct[:, -1] = dense_correct
    for index in range(grid - 1):
        correct[:, index] = _sparse_logits(kernel, x, index).argmax(axis=1) == y
        steps.step("calibration")
    steps.step("calibration")
    return calibrate(estimates, correct, dense_correct)
