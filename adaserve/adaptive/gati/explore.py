"""GATI's exploration phase (§4, §7): train every predictor variant and its selector after every candidate block,
and measure what composition needs — hit rate and agreement at a threshold, lookup latency, memory.

The validation data is split four ways (seeded): predictors are fitted on one part, selectors on a second (a
selector fitted on its own predictor's training data would learn that the predictor is always right), thresholds
are set on a third (calibrate) and everything reported is measured on the fourth (evaluate), which no choice saw.
Fit data (`--fit-data`, e.g. the model's own training set) takes the first part's place: a predictor learns the base
model's outputs, which any input shows, and validation sets are small (benchmarks/README.md §4 measures what many
more rows give). The validation rows then all go to the other three parts, which need inputs the base model never
trained on.

Activations come from running the model's own block chain — the callables the worker will run — so a cache is
trained on exactly what it will read. Memory is bounded: the activations of at most `max_activation_mb` (default
1 GiB, float32) are held at once; beyond it the data is subsampled at random, and the number used is recorded.
"""

from __future__ import annotations

import datetime
import math
import re
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np
import torch
from torch import nn
from tqdm import tqdm

from adaserve.adaptive.gati.blocks import BlockChain, load_chain
from adaserve.adaptive.gati.cacheset import (
    MEASURED_SPLITS,
    CacheSet,
    CacheSetError,
    DataRecord,
    ExitRecord,
    LearnedCache,
    Manifest,
    VariantRecord,
    artifact_sha256,
    write_cache_set,
)
from adaserve.adaptive.gati.certify import DEFAULT_RISK
from adaserve.adaptive.gati.compose import DEFAULT_ALPHA, compose, lookup_cost
from adaserve.adaptive.gati.predictors import (
    DEFAULT_VARIANTS,
    QUICK_VARIANTS,
    TrainSettings,
    VariantSpec,
    build_predictor,
    train_predictor,
)
from adaserve.adaptive.gati.selectors import SELECTOR_STEPS, Selector, train_selector
from adaserve.config import ModelConfig
from adaserve.errors import ConfigError
from adaserve.repository import ModelSpec, weight_bytes

__all__ = [
    "ExploreResult",
    "ExploreSettings",
    "Explored",
    "Fitted",
    "build_cache_set",
    "collect_activations",
    "exit_shapes",
    "explore",
    "fit_cache",
    "load_build_data",
    "load_data",
    "split_rows",
    "time_call",
]

#: Fractions of the data for fitting predictors, fitting selectors, setting thresholds, and evaluating.
SPLITS = {"fit_predictor": 0.5, "fit_selector": 0.15, "calibrate": 0.15, "evaluate": 0.2}
#: The validation data's splits when fit data fits the predictors, in the same proportions to one another.
VALIDATION_SPLITS = {name: share for name, share in SPLITS.items() if name != "fit_predictor"}
#: The data sets `load_data` knows by name: Debian's Fashion-MNIST splits.
FASHION_MNIST: dict[str, Literal["train", "test"]] = {"fashion-mnist": "test", "fashion-mnist-train": "train"}


@dataclass(frozen=True)
class ExploreSettings:
    """What to try and how hard; `for_run(quick=True)` is the minutes-not-tens-of-minutes exploration."""

    variants: tuple[VariantSpec, ...] = DEFAULT_VARIANTS
    train: TrainSettings = field(default_factory=TrainSettings)
    max_samples: int | None = None
    max_activation_mb: float = 1024.0
    selector_steps: int = SELECTOR_STEPS
    latency_repeats: int = 200
    seed: int = 0
    quick: bool = False

    @classmethod
    def for_run(cls, *, quick: bool, seed: int = 0, max_samples: int | None = None) -> ExploreSettings:
        if quick:
            train = TrainSettings(epochs=4, seed=seed)
            return cls(
                QUICK_VARIANTS, train, max_samples, selector_steps=1000, latency_repeats=100, seed=seed, quick=True
            )
        return cls(DEFAULT_VARIANTS, TrainSettings(epochs=10, seed=seed), max_samples, seed=seed)


@dataclass(frozen=True)
class Explored:
    """One trained (block, variant): its networks and measurements; scores are per calibrate / evaluate row."""

    block_index: int
    variant: VariantSpec
    input_shape: tuple[int, ...]
    predictor: nn.Module
    selector: nn.Module
    lookup_latency_s: float
    memory_bytes: int
    scores: dict[str, np.ndarray]  # selector's hit probability
    softmax: dict[str, np.ndarray]  # max softmax of the predictor (the plain-threshold baseline)
    agrees: dict[str, np.ndarray]  # predictor's argmax == base model's

    @property
    def key(self) -> str:
        return f"{self.block_index}:{self.variant.name}"


@dataclass(frozen=True)
class ExploreResult:
    """Everything a cache set stores: the trained variants and the measurements composition reads."""

    blocks: tuple[str, ...]
    block_latency_s: tuple[float, ...]
    base_latency_s: float
    num_classes: int
    split_rows: dict[str, np.ndarray]  # per split, the indices of its rows in the validation data
    has_labels: bool
    variants: list[Explored] = field(default_factory=list)


def load_data(source: str, config: ModelConfig) -> tuple[np.ndarray, np.ndarray | None]:
    """`fashion-mnist` (its test split: 10,000 images the example models never trained on), `fashion-mnist-train`
    (the 60,000 they trained on: fit data only) or an .npz holding `x` and optionally `y`; rows are reshaped to the
    model's input when only the layout differs (784 vs 1×28×28)."""
    if len(config.inputs) != 1:
        raise ConfigError(f"model '{config.name}' takes {len(config.inputs)} inputs; caches need exactly one")
    if source in FASHION_MNIST:
        from adaserve.datasets import load_fashion_mnist

        x, y = load_fashion_mnist(FASHION_MNIST[source])
    else:
        path = Path(source)
        try:
            with np.load(path, allow_pickle=False) as archive:
                if "x" not in archive:
                    raise ConfigError(f"{path}: no array named 'x' (found: {', '.join(archive.files) or 'none'})")
                x = archive["x"]
                y = archive.get("y")
        except (OSError, ValueError) as exc:
            raise ConfigError(f"{path}: not a readable .npz of arrays: {exc}") from None
    spec = config.inputs[0]
    if x.ndim == 0 or math.prod(x.shape[1:]) != math.prod(spec.row_shape):
        raise ConfigError(
            f"validation data {source}: rows shaped {list(x.shape[1:])} do not fit model '{config.name}', whose "
            f"input '{spec.name}' takes rows of {list(spec.row_shape)}"
        )
    if y is not None and y.shape != (len(x),):
        raise ConfigError(f"validation data {source}: 'y' must hold one label per row, got shape {list(y.shape)}")
    if y is not None and len(y) and (y.dtype.kind not in "iuf" or (y < 0).any() or (y != np.trunc(y)).any()):
        raise ConfigError(f"validation data {source}: 'y' must hold class indices (whole numbers from 0)")
    rows = x.reshape(len(x), *spec.row_shape).astype(spec.dtype, copy=False)
    if rows.dtype.kind == "f" and not np.isfinite(rows).all():
        bad = int(np.flatnonzero(~np.isfinite(rows.reshape(len(rows), -1)).all(axis=1))[0])
        raise ConfigError(f"validation data {source}: row {bad} holds NaN or an infinity (the first such row)")
    return rows, y


def load_build_data(
    source: str, fit_source: str | None, config: ModelConfig
) -> tuple[np.ndarray, np.ndarray | None, int]:
    """The validation rows followed by the fit rows, the labels (when both sets have them; else the base model's
    argmax stands in) and how many fit rows: the rows a cache set's split indices refer to."""
    x, y = load_data(source, config)
    if fit_source is None:
        return x, y, 0
    if Path(fit_source).resolve() == Path(source).resolve():
        raise ConfigError(
            f"fit data {fit_source} is the validation data: selectors and thresholds need rows the predictors "
            "were not fitted on"
        )
    fit_x, fit_y = load_data(fit_source, config)
    labels = np.concatenate([y, fit_y]) if y is not None and fit_y is not None else None
    return np.concatenate([x, fit_x]), labels, len(fit_x)


def explore(
    chain: BlockChain,
    x: np.ndarray,
    y: np.ndarray | None,
    settings: ExploreSettings,
    *,
    batch_size: int,
    fit_rows: int = 0,
    progress: bool = True,
) -> ExploreResult:
    """Run the base model over `x`, then train and measure every variant after every exit of `chain`; the last
    `fit_rows` rows of `x` (fit data) only fit predictors."""
    exits = chain.exits
    if not exits:
        raise ConfigError(f"the model has no block after which a cache could exit (blocks: {', '.join(chain.names)})")
    shapes = exit_shapes(chain, x[:1])
    (classes,) = shapes[len(chain.blocks) - 1]
    if y is not None and len(y) and y.max() >= classes:
        raise ConfigError(
            f"the labels go up to {int(y.max())}, but the model scores {classes} classes (0–{classes - 1})"
        )
    validation_rows = len(x) - fit_rows
    validation, fit = _rows_within_budget(validation_rows, fit_rows, shapes, settings)
    rng = np.random.default_rng(settings.seed)
    chosen = np.concatenate([_sample(validation_rows, validation, rng), validation_rows + _sample(fit_rows, fit, rng)])
    activations, probs = collect_activations(chain, x[chosen], shapes, batch_size, progress)
    labels = torch.from_numpy(y[chosen].astype(np.int64)) if y is not None else probs.argmax(1)
    if fit:
        fitting = torch.arange(validation, validation + fit)
        splits = {"fit_predictor": fitting} | split_rows(validation, rng, VALIDATION_SPLITS)
    else:
        splits = split_rows(validation, rng)
    result = ExploreResult(
        blocks=chain.names,
        block_latency_s=_block_latencies(chain, x[:1], settings.latency_repeats),
        base_latency_s=time_call(lambda: chain.run(torch.from_numpy(x[:1])), settings.latency_repeats),
        num_classes=probs.shape[1],
        split_rows={name: chosen[index.numpy()] for name, index in splits.items()},
        has_labels=y is not None,
    )
    jobs = [(i, spec) for i in exits for spec in settings.variants]
    seen: set[tuple[int, str]] = set()
    trained: list[tuple[int, VariantSpec, LearnedCache, Fitted]] = []
    bar = tqdm(jobs, desc="caches", unit="variant", disable=not progress)
    for block_index, spec in bar:
        bar.set_postfix_str(f"{chain.names[block_index]} {spec.name}")
        torch.manual_seed(settings.seed)
        predictor = build_predictor(spec, shapes[block_index], result.num_classes)
        if predictor is None or (block_index, repr(predictor)) in seen:
            continue  # the variant does not apply to this shape, or equals one already trained
        seen.add((block_index, repr(predictor)))
        selector = Selector(result.num_classes)
        steps = settings.selector_steps
        fitted = fit_cache(predictor, selector, activations[block_index], probs, labels, splits, settings.train, steps)
        record = ExitRecord(key="", block="", block_index=block_index, threshold=0.5)
        trained.append((block_index, spec, LearnedCache(record, predictor, selector), fitted))
    lookups_s = _lookup_latencies(chain, x[:1], [(i, cache) for i, _, cache, _ in trained], settings.latency_repeats)
    for (block_index, spec, cache, fitted), lookup_s in zip(trained, lookups_s, strict=True):
        result.variants.append(
            Explored(
                block_index=block_index,
                variant=spec,
                input_shape=shapes[block_index],
                predictor=cache.predictor,
                selector=cache.selector,
                lookup_latency_s=lookup_s,
                memory_bytes=weight_bytes(cache.predictor) + weight_bytes(cache.selector),
                scores=fitted.scores,
                softmax=fitted.softmax,
                agrees=fitted.agrees,
            )
        )
    return result


@dataclass(frozen=True)
class Fitted:
    """A trained cache measured on the calibrate and evaluate rows, per row."""

    scores: dict[str, np.ndarray]  # selector's hit probability
    softmax: dict[str, np.ndarray]  # max softmax of the predictor
    agrees: dict[str, np.ndarray]  # predictor's argmax == base model's


def fit_cache(
    predictor: nn.Module,
    selector: Selector,
    activations: torch.Tensor,
    probs: torch.Tensor,
    labels: torch.Tensor,
    splits: dict[str, torch.Tensor],
    train: TrainSettings,
    selector_steps: int,
) -> Fitted:
    """Train `predictor` on the `fit_predictor` rows, then `selector` on the `fit_selector` rows (which the predictor
    never saw), both in place, and measure them on the calibrate and evaluate rows. Exploration passes fresh
    networks, adaptation may pass the deployed ones' weights (a warm start)."""
    fit = splits["fit_predictor"]
    train_predictor(predictor, activations[fit], probs[fit], labels[fit], train)
    base_class = probs.argmax(1)
    outputs = {
        name: _softmax(predictor, activations[index]) for name, index in splits.items() if name != "fit_predictor"
    }
    agrees = {name: out.argmax(1) == base_class[splits[name]] for name, out in outputs.items()}
    train_selector(selector, outputs["fit_selector"], agrees["fit_selector"], train, selector_steps)
    with torch.no_grad():
        scores = {name: torch.sigmoid(selector(outputs[name])).squeeze(1).numpy() for name in MEASURED_SPLITS}
    return Fitted(
        scores=scores,
        softmax={name: outputs[name].max(1).values.numpy() for name in MEASURED_SPLITS},
        agrees={name: agrees[name].numpy() for name in MEASURED_SPLITS},
    )


def _softmax(predictor: nn.Module, activations: torch.Tensor, batch: int = 1024) -> torch.Tensor:
    with torch.no_grad():
        return torch.cat([torch.softmax(predictor(part), 1) for part in activations.split(batch)])


def exit_shapes(chain: BlockChain, first: np.ndarray) -> dict[int, tuple[int, ...]]:
    """Each block's output shape (no batch dimension), from one row; the last must be class scores."""
    shapes, x = {}, torch.from_numpy(first)
    with torch.no_grad():
        for index, block in enumerate(chain.blocks):
            x = block(x)
            shapes[index] = tuple(x.shape[1:])
    if len(shapes[len(chain.blocks) - 1]) != 1:
        raise ConfigError(f"the model's output is shaped {list(x.shape)}; caches need class scores [batch, classes]")
    return shapes


def _rows_within_budget(
    validation: int, fit: int, shapes: dict[int, tuple[int, ...]], settings: ExploreSettings
) -> tuple[int, int]:
    """How many validation and fit rows to use: their activations at the exits (and final outputs) must fit
    `max_activation_mb` as float32, and validation rows (at most `max_samples`) keep at least half of that."""
    per_row = 4 * sum(math.prod(shape) for shape in shapes.values())
    budget = int(settings.max_activation_mb * 1e6 // per_row)
    kept = min(validation, settings.max_samples or validation, max(budget - fit, budget // 2))
    if kept < 100:
        raise ConfigError(f"only {kept} validation rows fit (of {validation}); caches need at least 100")
    return kept, min(fit, budget - kept)


def _sample(rows: int, wanted: int, rng: np.random.Generator) -> np.ndarray:
    """`wanted` of `rows` row indices at random, in order; all of them without drawing when none need leaving out."""
    return np.sort(rng.choice(rows, wanted, replace=False)) if wanted < rows else np.arange(rows)


def collect_activations(
    chain: BlockChain, x: np.ndarray, shapes: dict[int, tuple[int, ...]], batch_size: int, progress: bool
) -> tuple[dict[int, torch.Tensor], torch.Tensor]:
    """Each exit's activations and the base model's softmax for every row, one batch at a time."""
    last = len(chain.blocks) - 1
    kept = {i: torch.empty((len(x), *shapes[i])) for i in chain.exits}
    logits = torch.empty((len(x), *shapes[last]))
    starts = range(0, len(x), batch_size)
    with torch.no_grad():
        for start in tqdm(starts, desc="base model", unit="batch", disable=not progress):
            out = torch.from_numpy(x[start : start + batch_size])
            for index, block in enumerate(chain.blocks):
                out = block(out)
                if index in kept:
                    kept[index][start : start + len(out)] = out
            logits[start : start + len(out)] = out
    return kept, torch.softmax(logits, 1)


def split_rows(rows: int, rng: np.random.Generator, shares: dict[str, float] = SPLITS) -> dict[str, torch.Tensor]:
    """A random partition of `rows` rows into the named splits, in proportion to their shares."""
    order = torch.from_numpy(rng.permutation(rows))
    total = sum(shares.values())
    bounds = np.cumsum([0, *(round(share / total * rows) for share in shares.values())])
    bounds[-1] = rows
    return {name: order[bounds[i] : bounds[i + 1]] for i, name in enumerate(shares)}


def _block_latencies(chain: BlockChain, first: np.ndarray, repeats: int) -> tuple[float, ...]:
    """Median seconds of each block at batch 1, timed inside runs of the whole chain: a block timed alone, over and
    over on the same input, ran faster than it does between the others (on the ResNet-style benchmark CNN the
    isolated times summed to 2.5 ms, the chain took 3.0–3.7 ms), and composition weighs these."""
    warm_up = _warm_up_runs(repeats)
    times: list[list[float]] = [[] for _ in chain.blocks]
    with torch.no_grad():
        for _ in range(warm_up + repeats):
            x = torch.from_numpy(first)
            for block, spent in zip(chain.blocks, times, strict=True):
                began = time.perf_counter()
                x = block(x)
                spent.append(time.perf_counter() - began)
    return tuple(statistics.median(spent[warm_up:]) for spent in times)


def _lookup_latencies(
    chain: BlockChain, first: np.ndarray, caches: Sequence[tuple[int, LearnedCache]], repeats: int
) -> list[float]:
    """Median seconds of each (exit block, cache)'s lookup at batch 1, timed as the runtime runs it: scripted, right
    after its block, inside runs of the whole chain, one cache per exit in each run (the exit's caches take turns). As
    with the blocks, a lookup timed alone on the same input over and over ran faster than between the blocks, and
    composition weighed lookups as cheaper than they were."""
    at_exit: dict[int, list[int]] = {}
    for index, (block_index, _) in enumerate(caches):
        at_exit.setdefault(block_index, []).append(index)
    turns = max((len(indices) for indices in at_exit.values()), default=0)
    warm_up = _warm_up_runs(repeats)
    times: list[list[float]] = [[] for _ in caches]
    lookups = [cache.scripted() for _, cache in caches]  # the form the runtime runs
    with torch.no_grad():
        for run in range((warm_up + repeats) * turns):
            x = torch.from_numpy(first)
            for block_index, block in enumerate(chain.blocks):
                x = block(x)
                indices = at_exit.get(block_index)
                if indices:
                    index = indices[run % len(indices)]
                    began = time.perf_counter()
                    lookups[index](x)
                    if run >= warm_up * turns:
                        times[index].append(time.perf_counter() - began)
    return [statistics.median(spent) for spent in times]


def _warm_up_runs(repeats: int) -> int:
    """Untimed runs before `repeats` timed ones."""
    return max(3, repeats // 10)


def time_call(call: Callable[[], object], repeats: int) -> float:
    """Median seconds of `call()` at batch 1 on this thread, after a warm-up; the median because other work on a
    shared machine lengthens some runs."""
    with torch.no_grad():
        for _ in range(_warm_up_runs(repeats)):
            call()
        times = []
        for _ in range(repeats):
            began = time.perf_counter()
            call()
            times.append(time.perf_counter() - began)
    return statistics.median(times)


def build_cache_set(
    spec: ModelSpec,
    source: str,
    settings: ExploreSettings,
    *,
    targets: Sequence[float],
    fit_source: str | None = None,
    alpha: float = DEFAULT_ALPHA,
    memory_budget_bytes: int | None = None,
    risk: float = DEFAULT_RISK,
    progress: bool = True,
) -> CacheSet:
    """Explore, compose for `targets`, and save a new cache set version in the model's folder.

    A composition that cannot be made (a memory budget below every cache) still saves the explored set, without
    compositions, and says how to compose it."""
    chain = load_chain(spec)
    x, y, fit_rows = load_build_data(source, fit_source, spec.config)
    result = explore(chain, x, y, settings, batch_size=spec.config.max_batch_size, fit_rows=fit_rows, progress=progress)
    keys = [
        f"{result.blocks[v.block_index]}-{re.sub(r'[^A-Za-z0-9]', '', v.variant.name.replace(',', 'x'))}"
        for v in result.variants
    ]
    manifest = Manifest(
        model=spec.name,
        model_version=spec.version,
        artifact=str(spec.artifact.relative_to(spec.directory)),
        artifact_sha256=artifact_sha256(spec.artifact),
        created=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        torch=torch.__version__,
        settings=_settings_record(settings),
        data=DataRecord(
            source=source,
            fit_source=fit_source,
            rows=sum(len(rows) for rows in result.split_rows.values()),
            labels=result.has_labels,
            splits={name: len(rows) for name, rows in result.split_rows.items()},
        ),
        num_classes=result.num_classes,
        blocks=result.blocks,
        block_latency_s=result.block_latency_s,
        base_latency_s=result.base_latency_s,
        lookups=lookup_cost(spec.config),
        variants=tuple(
            VariantRecord(
                key=key,
                block=result.blocks[v.block_index],
                block_index=v.block_index,
                variant=v.variant.name,
                input_shape=v.input_shape,
                lookup_latency_s=v.lookup_latency_s,
                memory_bytes=v.memory_bytes,
            )
            for key, v in zip(keys, result.variants, strict=True)
        ),
    )
    arrays = {
        f"{split}_{kind}": np.stack([getattr(v, kind)[split] for v in result.variants])
        for split in MEASURED_SPLITS
        for kind in ("scores", "softmax", "agrees")
    }
    arrays |= {f"{split}_rows": rows for split, rows in result.split_rows.items()}
    weights = {
        key: {"predictor": v.predictor.state_dict(), "selector": v.selector.state_dict()}
        for key, v in zip(keys, result.variants, strict=True)
    }
    try:
        composed = compose(manifest, arrays, targets, alpha=alpha, memory_budget_bytes=memory_budget_bytes, risk=risk)
    except ConfigError as exc:
        directory = write_cache_set(spec, manifest, weights, arrays)
        raise CacheSetError(
            f"{exc}; the explored caches are saved in {directory}: compose them with "
            f"`adaserve caches compose {spec.name} --memory-mb M`"
        ) from None
    directory = write_cache_set(spec, composed, weights, arrays)
    return CacheSet(directory, int(directory.name[1:]), composed)


def _settings_record(settings: ExploreSettings) -> dict[str, object]:
    return {
        "variants": [v.name for v in settings.variants],
        "epochs": settings.train.epochs,
        "batch_size": settings.train.batch_size,
        "lr": settings.train.lr,
        "selector_steps": settings.selector_steps,
        "max_samples": settings.max_samples,
        "max_activation_mb": settings.max_activation_mb,
        "latency_repeats": settings.latency_repeats,
        "threads": torch.get_num_threads(),
        "seed": settings.seed,
        "quick": settings.quick,
        "splits": SPLITS,
    }
