"""An activator on disk, in its model's directory: `<model>/activator/<v>/activator.npz` + `activator.json`.

Each build writes the next version. The JSON holds the format version, what the activator is bound to (the model
version, the sha256 of its MLP head's weights and that of the operations and tensors before the head, '' for a
pure MLP), the k grid, the calibration, the latency profile and how it was built; the npz holds the tables (int16
ranked node lists in CSR form, int32 bucket maps, float32 confidence rows) and is read with `allow_pickle=False`.
Format 3 adds what the build timed (`gate`): `dense_at` and `aclo_from`. Formats 1 and 2 are read with every layer
sparse and ACLO at every threshold, as they were calibrated, and format 1 (before MLP heads) as an activator of a
pure MLP. An activator built for other weights is refused with `ActivatorMismatchError`, which names both versions;
the runtime then falls back to dense or fails the load, as the model's config says.
"""

from __future__ import annotations

import itertools
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from adaserve.adaptive.activator.confidence import Calibration, ConfidenceTables
from adaserve.adaptive.activator.latency import LatencyProfile
from adaserve.adaptive.activator.lsh import NodeTables
from adaserve.errors import ConfigError

__all__ = [
    "FORMAT",
    "Activator",
    "ActivatorMismatchError",
    "load_activator",
    "no_dense_layers",
    "save_activator",
    "versions",
]

FORMAT = 3
#: Format 1 has no `prefix_sha256`: it was written for pure MLPs only. Formats 1 and 2 have no `dense_at`.
_READS = (1, 2, FORMAT)
FOLDER = "activator"
_TABLES = "activator.npz"
_META = "activator.json"


class ActivatorMismatchError(ConfigError):
    """The activator was built for another model version or other weights."""


@dataclass(frozen=True)
class Activator:
    """Everything `adaserve activator build` measured for one model version."""

    model_version: int
    weights_sha256: str
    sizes: tuple[int, ...]
    k_grid: np.ndarray  # float64, ascending, last = 1.0
    nodes: NodeTables
    confidence: ConfidenceTables
    calibration: Calibration
    latency: LatencyProfile
    dense_at: np.ndarray  # bool (k grid × layers): where the serving kernel runs a layer densely (`gate`)
    aclo_from: float  # the least threshold at which ACLO is faster than k = 100% (`gate`); inf: never
    built: dict[str, Any] = field(default_factory=dict)  # provenance: when, data, inputs, command
    prefix_sha256: str = ""  # `Prefix.digest()` of the operations before the MLP head; '' for a pure MLP
    version: int = 0  # its folder under <model>/activator/, set when saved or loaded

    def check(self, model_version: int, weights_sha256: str, prefix_sha256: str = "") -> None:
        """Raise ActivatorMismatchError unless this activator was built for exactly these weights (the head's, and
        the prefix's its tables were built on)."""
        if model_version != self.model_version:
            raise ActivatorMismatchError(
                f"activator v{self.version} was built for model version {self.model_version}, not version "
                f"{model_version}; rebuild it with `adaserve activator build`"
            )
        if weights_sha256 != self.weights_sha256:
            raise ActivatorMismatchError(
                f"activator v{self.version} was built for other weights of model version {model_version} "
                f"(sha256 {self.weights_sha256[:12]}…, the model's is {weights_sha256[:12]}…); rebuild it"
            )
        if prefix_sha256 != self.prefix_sha256:
            raise ActivatorMismatchError(
                f"activator v{self.version} was built for other layers before the MLP head of model version "
                f"{model_version} (sha256 {self.prefix_sha256[:12] or 'none'}…, the model's is "
                f"{prefix_sha256[:12] or 'none'}…); rebuild it"
            )


def versions(model_dir: Path) -> list[int]:
    root = model_dir / FOLDER
    if not root.is_dir():
        return []
    return sorted(int(p.name) for p in root.iterdir() if p.name.isdigit() and (p / _META).is_file())


def save_activator(model_dir: Path, activator: Activator) -> Path:
    """Write the activator as the next version; returns its folder. The JSON goes last: a folder without it is
    not a version."""
    version = max(versions(model_dir), default=0) + 1
    folder = model_dir / FOLDER / str(version)
    folder.mkdir(parents=True, exist_ok=True)
    nodes, conf = activator.nodes, activator.confidence
    np.savez(
        folder / _TABLES,
        hash_nodes=nodes.hash_nodes,
        bucket_of=nodes.bucket_of,
        rank_ptr=nodes.rank_ptr,
        rank_nodes=nodes.rank_nodes,
        global_rank=nodes.global_rank,
        conf_bucket_of=conf.bucket_of,
        conf_values=conf.values,
        conf_global=conf.global_mean,
        dense_at=activator.dense_at,
    )
    cal, lat = activator.calibration, activator.latency
    meta = {
        "format": FORMAT,
        "model_version": activator.model_version,
        "weights_sha256": activator.weights_sha256,
        "prefix_sha256": activator.prefix_sha256,
        "sizes": list(activator.sizes),
        "bits": nodes.bits,
        "tables": nodes.tables,
        "k_grid": activator.k_grid.tolist(),
        "calibration": {
            "thresholds": cal.thresholds.tolist(),
            "accuracy": cal.accuracy.tolist(),
            "dense_accuracy": cal.dense_accuracy,
            "samples": cal.samples,
        },
        "latency": {
            "busy": lat.busy.tolist(),
            "cpu_p99_ms": lat.cpu_p99_ms.tolist(),
            "wall_p50_ms": lat.wall_p50_ms.tolist(),
            "wall_p99_ms": lat.wall_p99_ms.tolist(),
            "cpu_model": lat.cpu_model,
        },
        "aclo_from": activator.aclo_from if math.isfinite(activator.aclo_from) else None,
        "built": activator.built,
    }
    (folder / _META).write_text(json.dumps(meta, indent=1) + "\n")
    return folder


def load_activator(model_dir: Path, version: int | None = None) -> Activator:
    """The given (default: newest) version; ConfigError naming the path when it is missing or unreadable."""
    found = versions(model_dir)
    if not found:
        raise ConfigError(f"{model_dir / FOLDER}: no activator; build one with `adaserve activator build`")
    chosen = found[-1] if version is None else version
    folder = model_dir / FOLDER / str(chosen)
    if chosen not in found:
        raise ConfigError(f"{folder}: no such activator version (found {', '.join(map(str, found))})")
    try:
        meta = json.loads((folder / _META).read_text())
        if meta.get("format") not in _READS:
            raise ConfigError(
                f"{folder}: activator format {meta.get('format')}, this server reads {' and '.join(map(str, _READS))}"
            )
        with np.load(folder / _TABLES, allow_pickle=False) as arrays:
            tables = {name: arrays[name] for name in arrays.files}
        activator = _from_parts(meta, tables, chosen)
        _check_tables(activator)
        return activator
    except ConfigError:
        raise
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ConfigError(f"{folder}: unreadable activator: {type(exc).__name__}: {exc}") from exc


def _from_parts(meta: dict[str, Any], tables: dict[str, np.ndarray], version: int) -> Activator:
    cal, lat = meta["calibration"], meta["latency"]
    return Activator(
        model_version=int(meta["model_version"]),
        weights_sha256=str(meta["weights_sha256"]),
        prefix_sha256=str(meta.get("prefix_sha256", "")),
        sizes=tuple(int(s) for s in meta["sizes"]),
        k_grid=np.asarray(meta["k_grid"], np.float64),
        nodes=NodeTables(
            bits=int(meta["bits"]),
            tables=int(meta["tables"]),
            hash_nodes=tables["hash_nodes"].astype(np.int32, copy=False),
            bucket_of=tables["bucket_of"].astype(np.int32, copy=False),
            rank_ptr=tables["rank_ptr"].astype(np.int64, copy=False),
            rank_nodes=tables["rank_nodes"].astype(np.int16, copy=False),
            global_rank=tables["global_rank"].astype(np.int16, copy=False),
        ),
        confidence=ConfidenceTables(
            bucket_of=tables["conf_bucket_of"].astype(np.int32, copy=False),
            values=tables["conf_values"].astype(np.float32, copy=False),
            global_mean=tables["conf_global"].astype(np.float32, copy=False),
        ),
        calibration=Calibration(
            thresholds=np.asarray(cal["thresholds"], np.float64),
            accuracy=np.asarray(cal["accuracy"], np.float64),
            dense_accuracy=float(cal["dense_accuracy"]),
            samples=int(cal["samples"]),
        ),
        latency=LatencyProfile(
            busy=np.asarray(lat["busy"], np.int64),
            cpu_p99_ms=np.asarray(lat["cpu_p99_ms"], np.float64),
            wall_p50_ms=np.asarray(lat["wall_p50_ms"], np.float64),
            wall_p99_ms=np.asarray(lat["wall_p99_ms"], np.float64),
            cpu_model=str(lat["cpu_model"]),
        ),
        dense_at=_dense_at(tables, len(meta["k_grid"]), meta["sizes"]),
        aclo_from=_aclo_from(meta),
        built=dict(meta.get("built", {})),
        version=version,
    )


def no_dense_layers(grid: int, layers: int) -> np.ndarray:
    """A `dense_at` that gates nothing: each of `layers` sparse at every k of a grid of `grid`."""
    return np.zeros((grid, layers), np.bool_)


def _dense_at(tables: dict[str, np.ndarray], grid: int, sizes: list[int]) -> np.ndarray:
    """The measured gate; formats before 3 have none and run every layer sparse, as they were calibrated."""
    if "dense_at" in tables:
        return tables["dense_at"].astype(np.bool_, copy=False)
    return no_dense_layers(grid, len(sizes) - 1)


def _aclo_from(meta: dict[str, Any]) -> float:
    """Formats before 3 run ACLO at every threshold, as they did."""
    if meta["format"] < 3:
        return 0.0
    value = meta["aclo_from"]
    return math.inf if value is None else float(value)


def _check_tables(activator: Activator) -> None:
    """Every index the compiled kernel follows stays in bounds (it does not check them itself)."""
    nodes, conf, sizes = activator.nodes, activator.confidence, activator.sizes
    hidden = np.asarray(sizes[1:-1])
    buckets = 1 << nodes.bits
    lists = len(nodes.rank_ptr) - 1
    problems = []
    if nodes.hash_nodes.shape != (len(hidden), nodes.bits * nodes.tables):
        problems.append("hash_nodes shape")
    elif (nodes.hash_nodes < 0).any() or (nodes.hash_nodes >= hidden[:, None]).any():
        problems.append("hash node ids")
    if nodes.bucket_of.shape != (len(hidden), nodes.tables, buckets) or nodes.bucket_of.max(initial=-1) >= lists:
        problems.append("bucket_of")
    if lists < 0 or nodes.rank_ptr[0] != 0 or (np.diff(nodes.rank_ptr) < 0).any():
        problems.append("rank_ptr")
    elif nodes.rank_ptr[-1] != len(nodes.rank_nodes):
        problems.append("rank_nodes length")
    else:
        layer_of_list = np.zeros(lists, np.int64)
        for layer in range(len(hidden)):
            layer_of_list[nodes.bucket_of[layer][nodes.bucket_of[layer] >= 0]] = layer
        width = np.repeat(hidden[layer_of_list], np.diff(nodes.rank_ptr))
        if ((nodes.rank_nodes < 0) | (nodes.rank_nodes >= width)).any():
            problems.append("ranked node ids")
    starts = np.cumsum([0, *hidden])
    if len(nodes.global_rank) != starts[-1] or any(
        sorted(nodes.global_rank[a:b].tolist()) != list(range(b - a)) for a, b in itertools.pairwise(starts)
    ):
        problems.append("global_rank")
    grid = len(activator.k_grid)
    if conf.bucket_of.shape != (nodes.tables, buckets) or conf.bucket_of.max(initial=-1) >= len(conf.values):
        problems.append("confidence bucket_of")
    if conf.values.shape[1:] != (grid,) or conf.global_mean.shape != (grid,):
        problems.append("confidence values")
    if activator.latency.cpu_p99_ms.shape[1:] != (grid,) or activator.k_grid[-1] != 1.0:
        problems.append("k grid")
    if activator.dense_at.shape != (grid, len(sizes) - 1):
        problems.append("dense_at shape")
    if problems:
        raise ConfigError(f"inconsistent activator tables ({', '.join(problems)})")
