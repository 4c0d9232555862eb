"""A versioned cache set in the model's folder, `<model>/caches/v<N>/`, and its loading for serving.

    manifest.json     everything measured (pydantic-validated, so a corrupt or hand-broken file is named)
    <key>.pt          one variant's predictor and selector state_dicts (`torch.save`; loaded with weights_only)
    scores.npz        per-row selector scores, max-softmax and agreement on the calibrate and evaluate splits,
                      so `adaserve caches compose` can recompose for a new target or budget without retraining;
                      and `<split>_rows`, which validation rows each split holds (held-out data for adaptation)

A set is bound to the model version and the SHA-256 of the artifact it was built from; loading it for another
artifact raises `CacheSetError` saying so. A new version is written beside the old ones under a temporary name and
renamed into place, so a reader never sees half a set.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from torch import nn

from adaserve.adaptive.gati.predictors import VariantSpec, build_predictor
from adaserve.adaptive.gati.selectors import Selector
from adaserve.errors import ConfigError
from adaserve.repository import ModelSpec

__all__ = [
    "CacheSet",
    "CacheSetError",
    "ChainRecord",
    "CompositionRecord",
    "ExitRecord",
    "LearnedCache",
    "Manifest",
    "VariantRecord",
    "artifact_sha256",
    "load_cache_set",
    "prune_adapted",
    "read_manifest",
    "versions",
    "write_cache_set",
]

FORMAT = 1
MANIFEST = "manifest.json"
SCORES = "scores.npz"
MEASURED_SPLITS = ("calibrate", "evaluate")


class CacheSetError(ConfigError):
    """A cache set that cannot serve this model: missing, corrupt, or built for another artifact."""


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class HitRecord(_Record):
    """One cache alone at one threshold (None: it never hits), measured on the evaluate split."""

    threshold: float | None
    hit_rate: float
    agreement: float = Field(description="among hits")
    overall: float = Field(description="of the model with this cache alone in front")


class TargetRecord(_Record):
    """A variant at one target: the selector's threshold and the plain max-softmax threshold beside it."""

    selector: HitRecord
    softmax: HitRecord
    calibrate_hit_rate: float = Field(description="hit rate where the threshold was set (composition's H)")


class VariantRecord(_Record):
    key: str = Field(description="file-safe id, e.g. 'stage2-Pool4096'")
    block: str
    block_index: int
    variant: str = Field(description="FC(h), Pool(h) or Conv(k,s)")
    input_shape: tuple[int, ...]
    lookup_latency_s: float = Field(description="predictor + selector, batch 1, one thread, median")
    memory_bytes: int = Field(description="parameters of predictor + selector")
    targets: dict[str, TargetRecord] = Field(default_factory=dict, description="keyed by the target, e.g. '0.99'")


class ExitRecord(_Record):
    key: str
    block: str
    block_index: int
    threshold: float


class ChainRecord(_Record):
    """The chained exits simulated on one split: each row leaves at the first exit whose selector says hit."""

    agreement: float
    mean_latency_s: float = Field(description="expected, with the lookups where the manifest's `lookups` puts them")
    exit_rates: tuple[float, ...] = Field(description="fraction of all rows leaving at each exit, in order")


class CompositionRecord(_Record):
    method: Literal["milp", "overall"]
    target: float
    alpha: float
    memory_budget_bytes: int | None
    exits: tuple[ExitRecord, ...]
    memory_bytes: int
    calibrate: ChainRecord
    check: ChainRecord | None = Field(
        default=None, description="overall: on the calibrate rows that tested the tuned settings (`certify`)"
    )
    risk: float | None = Field(default=None, description="overall: the test's level (chance of missing the target)")
    evaluate: ChainRecord
    default: bool = Field(description="the one a request for this target gets")
    window: ChainRecord | None = Field(
        default=None,
        description="an adapted default composition: on the held-out rows of the window it was retrained on (the "
        "traffic then), what the retraining trigger expects of it",
    )

    @property
    def meets_target(self) -> bool:
        return self.evaluate.agreement >= self.target


class DataRecord(_Record):
    source: str
    fit_source: str | None = Field(
        default=None, description="data that only fitted predictors; its rows follow the source's in the split indices"
    )
    rows: int = Field(description="rows used, validation and fit (after the memory bound)")
    labels: bool = Field(description="true labels were given (else the base model's argmax stands in)")
    splits: dict[str, int]


class Manifest(_Record):
    format: int = FORMAT
    model: str
    model_version: int
    artifact: str
    artifact_sha256: str
    created: str
    torch: str
    settings: dict[str, object]
    data: DataRecord
    num_classes: int
    blocks: tuple[str, ...]
    block_latency_s: tuple[float, ...] = Field(description="each block at batch 1, one thread, median")
    base_latency_s: float = Field(description="all blocks in one run (the model, no exit), batch 1, one thread, median")
    lookups: Literal["inline", "async"] = Field(
        default="inline",
        description="how composition costs the lookups: on the rows' path (the runtime's CPU default) or beside the "
        "model (the paper's model; `caches.lookup: process`, or `stream` on a GPU)",
    )
    variants: tuple[VariantRecord, ...]
    compositions: tuple[CompositionRecord, ...] = ()

    def default_for(self, target: float) -> CompositionRecord | None:
        return next((c for c in self.compositions if c.default and c.target == target), None)


class LearnedCache(nn.Module):
    """A predictor and its selector after block `block_index`; call it on that block's output for, per row, whether
    it hits (bool [B]), the predictor's logits ([B, classes]: the answer a hit gives, argmax-equal to the base
    model's on `agreement` of hits) and the selector's score ([B], in [0, 1])."""

    def __init__(self, exit: ExitRecord, predictor: nn.Module, selector: Selector) -> None:
        super().__init__()
        self.exit = exit
        self.threshold = exit.threshold
        self.predictor = predictor
        self.selector = selector

    def forward(self, activation: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        logits = self.predictor(activation)
        score = torch.sigmoid(self.selector(torch.softmax(logits, 1))).squeeze(1)
        return score >= self.threshold, logits, score

    def scripted(self) -> torch.jit.ScriptModule:
        """This cache as one TorchScript graph (sharing its weights), the form a worker runs and exploration times.
        A lookup is a dozen small operators, each paying Python's call overhead, and more so right after a block
        has run: on the ResNet-style benchmark CNN, one graph answered a hit after the stem in 0.27 ms at the
        median against 0.34 ms as modules (torch.export's graph module: 0.55 ms)."""
        with warnings.catch_warnings():  # torch.jit warns that it is deprecated on every call
            warnings.filterwarnings("ignore", message=r"`torch\.jit\.", category=DeprecationWarning)
            return torch.jit.script(self)


@dataclass(frozen=True)
class CacheSet:
    """One version of a model's cache set, checked against the artifact it serves."""

    directory: Path
    version: int
    manifest: Manifest

    def composition(self, accuracy: float) -> CompositionRecord:
        """The default composition for the least target at or above `accuracy`, or for the highest target when
        none is that high (a request without `accuracy` asks for the config's first target)."""
        defaults = sorted((c for c in self.manifest.compositions if c.default), key=lambda c: c.target)
        if not defaults:
            raise CacheSetError(f"{self.directory}: no composition; run `adaserve caches compose`")
        return next((c for c in defaults if c.target >= accuracy), defaults[-1])

    def caches(self, composition: CompositionRecord) -> tuple[LearnedCache, ...]:
        """The composition's learned caches in block order, weights loaded."""
        variants = {v.key: v for v in self.manifest.variants}
        unknown = [e.key for e in composition.exits if e.key not in variants]
        if unknown:
            raise CacheSetError(f"{self.directory / MANIFEST}: a composition names unknown caches: {unknown}")
        return tuple(self._load(variants[e.key], e) for e in composition.exits)

    def scores(self) -> dict[str, np.ndarray]:
        """Per-row arrays [variant, row] of `<split>_scores`, `<split>_softmax`, `<split>_agrees` for the calibrate
        and evaluate splits, and `<split>_rows` for every split: its rows' indices in the validation data."""
        path = self.directory / SCORES
        try:
            with np.load(path, allow_pickle=False) as archive:
                arrays = {name: archive[name] for name in archive.files}
        except (OSError, ValueError) as exc:
            raise CacheSetError(f"{path}: cannot read the per-row scores: {exc}") from None
        rows = len(self.manifest.variants)
        for split in MEASURED_SPLITS:
            for kind in ("scores", "softmax", "agrees"):
                array = arrays.get(f"{split}_{kind}")
                if array is None or array.ndim != 2 or len(array) != rows:
                    raise CacheSetError(f"{path}: '{split}_{kind}' is missing or not shaped [{rows}, rows]")
        return arrays

    def _load(self, variant: VariantRecord, exit: ExitRecord) -> LearnedCache:
        path = self.directory / f"{variant.key}.pt"
        try:
            spec = VariantSpec.parse(variant.variant)
        except ValueError as exc:
            raise CacheSetError(f"{self.directory / MANIFEST}: {exc}") from None
        predictor = build_predictor(spec, variant.input_shape, self.manifest.num_classes)
        selector = Selector(self.manifest.num_classes)
        if predictor is None:
            raise CacheSetError(f"{path}: {variant.variant} does not apply to shape {list(variant.input_shape)}")
        try:
            state = torch.load(path, map_location="cpu", weights_only=True)
            predictor.load_state_dict(state["predictor"])
            selector.load_state_dict(state["selector"])
        except Exception as exc:
            raise CacheSetError(f"{path}: cannot load the cache's weights: {type(exc).__name__}: {exc}") from None
        return LearnedCache(exit, predictor.eval(), selector.eval()).eval()


def artifact_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as stream:
        for chunk in iter(lambda: stream.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def versions(model_dir: Path) -> list[int]:
    root = model_dir / "caches"
    if not root.is_dir():
        return []
    return sorted(int(p.name[1:]) for p in root.iterdir() if p.is_dir() and re.fullmatch(r"v\d+", p.name))


def read_manifest(directory: Path) -> Manifest:
    """A cache set's manifest, validated, but not checked against any artifact (`load_cache_set` does that)."""
    path = directory / MANIFEST
    try:
        manifest = Manifest.model_validate_json(path.read_bytes())
    except OSError as exc:
        raise CacheSetError(f"{path}: cannot read: {exc.strerror}") from None
    except ValidationError as exc:
        raise CacheSetError(
            f"{path}: not a valid cache manifest: {exc.errors()[0]['msg']} at "
            f"{'.'.join(map(str, exc.errors()[0]['loc']))}"
        ) from None
    if manifest.format != FORMAT:
        raise CacheSetError(f"{path}: manifest format {manifest.format}; this adaserve reads format {FORMAT}")
    return manifest


def load_cache_set(spec: ModelSpec, version: int | Literal["latest"] = "latest") -> CacheSet:
    """The cache set `version` of a model, checked against the artifact the model serves now."""
    found = versions(spec.directory)
    if not found:
        raise CacheSetError(f"model '{spec.name}' has no cache set; build one with `adaserve caches build {spec.name}`")
    number = found[-1] if version == "latest" else version
    directory = spec.directory / "caches" / f"v{number}"
    if number not in found:
        raise CacheSetError(f"{directory}: no such cache set (versions: {', '.join(f'v{v}' for v in found)})")
    manifest = read_manifest(directory)
    digest = artifact_sha256(spec.artifact)
    if (manifest.model, manifest.model_version, manifest.artifact_sha256) != (spec.name, spec.version, digest):
        raise CacheSetError(
            f"{directory}: stale cache set: built for {manifest.model} version {manifest.model_version} "
            f"(artifact sha256 {manifest.artifact_sha256[:12]}…), but {spec.name} now serves version {spec.version} "
            f"(sha256 {digest[:12]}…); rebuild it with `adaserve caches build {spec.name}`"
        )
    return CacheSet(directory, number, manifest)


def write_cache_set(
    spec: ModelSpec,
    manifest: Manifest,
    weights: dict[str, dict[str, dict[str, torch.Tensor]]],
    scores: dict[str, np.ndarray],
) -> Path:
    """Write a new version (one past the newest) and return its folder; `weights` maps variant keys to
    `{"predictor": state_dict, "selector": state_dict}`."""
    root = spec.directory / "caches"
    root.mkdir(exist_ok=True)
    number = (versions(spec.directory) or [0])[-1] + 1
    staging = root / f".v{number}.tmp"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    for key, state in weights.items():
        torch.save(state, staging / f"{key}.pt")
    np.savez(staging / SCORES, **scores)
    (staging / MANIFEST).write_text(manifest.model_dump_json(indent=1) + "\n")
    final = root / f"v{number}"
    staging.rename(final)
    return final


def rewrite_manifest(directory: Path, manifest: Manifest) -> None:
    """Replace a set's manifest atomically (after recomposition)."""
    temporary = directory / f".{MANIFEST}.tmp"
    temporary.write_text(manifest.model_dump_json(indent=1) + "\n")
    os.replace(temporary, directory / MANIFEST)


def prune_adapted(model_dir: Path, keep: int) -> list[int]:
    """Remove all but the newest `keep` versions that adaptation wrote (their manifests name the version they were
    `adapted_from`), and return the removed numbers. The adaptation service writes a version at every accepted
    retraining, so without this the model's folder grows for as long as it serves (about 0.5 MB a version on the
    benchmark ResNet). A built version is never removed: it holds every variant, and only a rebuild makes another;
    nor is one whose manifest cannot be read, as what wrote it is unknown. A removed version is first renamed out
    of `versions`' sight, so a reader never sees half of one."""
    adapted = []
    for number in versions(model_dir):
        try:
            manifest = read_manifest(model_dir / "caches" / f"v{number}")
        except CacheSetError:
            continue
        if "adapted_from" in manifest.settings:
            adapted.append(number)
    removed = adapted[: max(0, len(adapted) - keep)]
    for number in removed:
        doomed = model_dir / "caches" / f".v{number}.removing"
        (model_dir / "caches" / f"v{number}").rename(doomed)
        shutil.rmtree(doomed)
    return removed
