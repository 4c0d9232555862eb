"""GATI's cache adaptation (§5.3, §6 "Retraining Learned Caches", §7.2): keep a sample of recent requests, and
when the caches hit less often than composition expected (or a period has passed), retrain the composition's
predictors and selectors on that sample mixed with the validation data, re-tune their thresholds, and deploy the
result as a new cache set version only if it does not lower agreement on rows no part of it was trained on.

The pieces are kept apart from the server so they can be driven in one process: `SampleWindow` (what the inference
service samples), `HitRateMonitor` (the retraining trigger), `adapt` (the retraining, pure: it writes nothing) and
`deploy` (a new `caches/v<N>/` through `write_cache_set`, which `load_cache_set(spec, "latest")` then serves).

Choices, and why:

- **Recency.** The window keeps the newest `capacity` sampled rows; a training sample is drawn from it without
  replacement with weights 2^(−age / (half_life · capacity)), age counted in sampled rows (newest: 0). The paper
  "weigh[s] recent samples more heavily" without saying how; an exponential in age keeps the newest rows likelier
  than the oldest by a fixed factor (4× at the default half-life of half the window) while an old row still shows up.
- **Data.** The window sample is split like the validation data (fit predictors / fit selectors / calibrate /
  evaluate, 50/15/15/20); each training split is mixed with `validation_per_window_row` (8) times as many rows drawn
  from the same split of the validation data, and the calibrate and evaluate splits with all of theirs (measuring
  costs only a forward pass, and a few hundred rows cannot tell 0.99 from 0.995): predictors and selectors never see
  the rows their thresholds are set on or the rows they are judged on. Labels are the base model's argmax (stream
  rows have no true labels).
- **Training.** The networks start from the deployed caches' weights (`warm_start`). The paper's 5 epochs over a
  first window of about a hundred rows mixed one to one were 5 optimizer steps, which barely moved a predictor, and
  500 selector steps fitted 32 rows: the versions it accepted agreed more only by stricter thresholds, at fewer
  hits. Defaults: 20 epochs, 100 selector steps, 8 validation rows per window row. Served on 1,000 fresh rows of
  the drift their window held (`benchmarks/gati/retraining.py`, 15 windows of 100–1,000 rows), caches retrained
  with them hit .730 of rows at .982 agreement on average, with the paper's settings .564 at .989, the deployed
  caches .808 at .910; the defaults hit more than the paper's in 14 of the 15 windows, and take longer (3.6–16 s
  against 2.6–3.6 s on one core). `benchmarks/gati/adaptation.py` measures the warm start against training from
  scratch.
- **Thresholds.** The adapted composition keeps the same exits (one may drop out when it can no longer hit at the
  target) and is re-composed with `compose` on the mixed calibrate split, for the same target, certified at the
  deployed composition's risk, and tuned to at least the deployed caches' agreement on those rows
  (`hold_agreement`). Without that floor the adaptation benchmark accepted 14 of 18 retrainings, hit less than with
  it and fell below the static caches on one chunk; with it, a retraining certifies no exit once the deployed
  caches agree .997 or more, the strictest setting then failing the test.
- **Acceptance** (`acceptance`). On the window's held-out rows, today's traffic, the new caches must not lower the
  deployed caches' agreement, nor their hit rate unless those miss the target there and the new ones agree more
  (fewer hits for nothing are no adaptation); on all held-out rows (validation and window alike) they must hold the
  target. Judged on all held-out rows alone, as before, the drift hardly counted (a window's held-out rows were
  21–77 of about 3,250), and a version was refused if its agreement there fell by a row: on the adaptation
  benchmark, one whose agreement on the window's rows rose from .957 to .979 went from .9985 to .9978 on all of
  them. Where the window's rows cannot tell the two apart (the same agreement and hits: on a class-skewed stream
  both agreed on and hit all 21 of them) and the deployed caches meet the target there, today's traffic has nothing
  to fix, and the hits rule is judged on all held-out rows instead: otherwise a version that hit .928 of them where
  the deployed caches hit .966, at agreement beyond the target, was deployed and served slower than static caches
  from then on. Where the deployed caches miss the target on the window, a tie there still accepts: its few rows
  may not show what the retraining learned of the drift (applied there too, the rule refused the adaptation
  benchmark's first retraining, on brightened images the deployed caches agreed on at about .8). A retraining
  that certifies no exit is refused whatever it agrees: a set without exits would serve whole for good, as
  adaptation retrains only the exits a composition deploys. The retraining time is wall time in this process.
"""

from __future__ import annotations

import datetime
import itertools
import math
import time
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from adaserve.adaptive.gati.blocks import BlockChain
from adaserve.adaptive.gati.cacheset import (
    MEASURED_SPLITS,
    CacheSet,
    CacheSetError,
    ChainRecord,
    CompositionRecord,
    LearnedCache,
    Manifest,
    VariantRecord,
    write_cache_set,
)
from adaserve.adaptive.gati.certify import DEFAULT_RISK
from adaserve.adaptive.gati.compose import Candidate, compose, simulate
from adaserve.adaptive.gati.explore import SPLITS, Fitted, collect_activations, exit_shapes, fit_cache, split_rows
from adaserve.adaptive.gati.predictors import TrainSettings, VariantSpec, build_predictor
from adaserve.adaptive.gati.selectors import Selector
from adaserve.config import ADAPT_EPOCHS, ADAPT_SELECTOR_STEPS, Expectation
from adaserve.engine.messages import ExitCounts
from adaserve.errors import InvalidInputError
from adaserve.repository import ModelSpec

__all__ = ["AdaptResult", "AdaptSettings", "HitRateMonitor", "SampleWindow", "acceptance", "adapt", "deploy"]

#: Fewer window rows than this leave some split empty.
MIN_WINDOW_ROWS = 20


class SampleWindow:
    """A bounded sample of recent input rows: `offer` keeps about `fraction` of the rows it is given (seeded), the
    newest `capacity` kept rows stay, and `draw` samples them weighted by recency (see the module docstring).

    With `max_bytes`, the first offer (which shows a row's size) lowers the capacity to what fits in it, but not
    below the rows a retraining needs (`MIN_WINDOW_ROWS`): 2,000 rows of a 3×224×224 float32 image take 1.2 GB."""

    def __init__(
        self,
        capacity: int,
        *,
        fraction: float = 0.2,
        half_life: float = 0.5,
        seed: int = 0,
        max_bytes: int | None = None,
    ) -> None:
        if capacity < 1:
            raise ValueError(f"window capacity must be at least 1 row, got {capacity}")
        if not 0 < fraction <= 1:
            raise ValueError(f"window sampling fraction must be in (0, 1], got {fraction}")
        if half_life <= 0:
            raise ValueError(f"window half-life must be positive, got {half_life}")
        self.capacity = capacity
        self.max_bytes = max_bytes
        self.fraction = fraction
        self.half_life = half_life
        self._rng = np.random.default_rng(seed)
        self._rows: np.ndarray | None = None  # ring buffer, allocated at the first offer (its row shape)
        self._kept = 0  # rows ever kept; the newest sits at (kept − 1) % capacity

    def __len__(self) -> int:
        return min(self._kept, self.capacity)

    def offer(self, rows: np.ndarray) -> int:
        """Keep about `fraction` of `rows` (a batch of inputs); returns how many were kept. Rows holding NaN or an
        infinity are never kept: `adapt` refuses a window with one, so a single such request would fail every
        retraining until newer rows pushed it out."""
        if self._rows is None:
            if self.max_bytes is not None:
                row_bytes = max(1, math.prod(rows.shape[1:]) * rows.dtype.itemsize)
                self.capacity = min(self.capacity, max(MIN_WINDOW_ROWS, self.max_bytes // row_bytes))
            self._rows = np.empty((self.capacity, *rows.shape[1:]), dtype=rows.dtype)
        if rows.shape[1:] != self._rows.shape[1:]:
            raise InvalidInputError(
                f"window rows are shaped {list(self._rows.shape[1:])}, offered rows {list(rows.shape[1:])}"
            )
        sampled = rows[self._rng.random(len(rows)) < self.fraction]
        kept = sampled[np.isfinite(sampled.reshape(len(sampled), -1)).all(axis=1)][-self.capacity :]
        slots = (self._kept + np.arange(len(kept))) % self.capacity
        self._rows[slots] = kept
        self._kept += len(kept)
        return len(kept)

    def draw(self, count: int) -> np.ndarray:
        """`count` rows (all, when it holds fewer) without replacement, newer rows likelier; oldest first."""
        held = len(self)
        if self._rows is None or held == 0:
            raise InvalidInputError("the sample window is empty: offer it rows first")
        age = (self._kept - 1 - np.arange(self._kept - held, self._kept)).astype(float)  # oldest first
        weights = np.exp2(-age / (self.half_life * self.capacity))
        chosen = self._rng.choice(held, min(count, held), replace=False, p=weights / weights.sum())
        slots = (self._kept - held + np.sort(chosen)) % self.capacity
        return self._rows[slots].copy()


class HitRateMonitor:
    """The retraining trigger: live hit rates against the rates the composition expected.

    Counts from the runtime (`EarlyExit.take_counts`) are judged in windows of at least `min_rows` rows: when the
    share of rows that leave by an exit (at it or at an earlier one) falls more than `margin` below its expected
    share, or `period_s` has passed since the last retraining, `check` says why. Shares by an exit, not at it: rows
    that move to an earlier exit are faster, yet lower the later exit's own share; on a class-skewed stream
    (`benchmarks/gati/locality.py`) the first exit came to take nearly every row, the trigger fired on the later
    exits' shares, and the retraining it started was the one that left the adapted caches slower than static ones.

    The paper's trigger alone misses a drift on which the caches keep hitting but answer wrongly (brightened images
    in `benchmarks/gati/adaptation.py`), so the verified hits (`verify_fraction`) are judged too, once
    `min_verified` are in: their agreement must not fall more than `margin` below the agreement among hits the
    composition expected, 1 − (1 − agreement) / hit rate (on its held-out rows, `evaluate`).

    The expected shares (`expect`): `composition`, the paper's, are the deployed composition's on its held-out rows
    (`evaluate`), which are mostly validation rows, even for an adapted version. On a drift that lasts they are out
    of reach, so the trigger fired again at every judged window after each retraining, and each accepted one
    reloaded the model: a server given a brightened, low-contrast stream for the example CNN retrained 9 times in
    100 s, 3 of them accepted (with `traffic`, 4 times, 2 accepted). `traffic`, the default, expects an adapted
    version's rates on the held-out rows of the window it was retrained on (`CompositionRecord.window`), and once a
    retraining is refused, no more than the live rates last judged (`reset(settle=True)`): the refusal showed that
    retraining could not do better on that traffic, so the trigger waits for it to move again (or for the period).
    The window alone was not enough: it holds older traffic too, on which the caches hit more: expecting its rates
    after a refusal too, a run of `benchmarks/gati/trigger.py` retrained 15 times in the 20 drifted chunks of its
    lasting stream, against 18 with the paper's; settling on the live rates, fewer (`gati_trigger.json` has the
    counts)."""

    def __init__(
        self,
        composition: CompositionRecord,
        *,
        now: float,
        period_s: float = 900.0,
        margin: float = 0.05,
        min_rows: int = 500,
        min_verified: int = 50,
        expect: Expectation = "traffic",
    ) -> None:
        self.period_s = period_s
        self.margin = margin
        self.min_rows = min_rows
        self.min_verified = min_verified
        self.expect = expect
        self.judged: dict[str, float] = {}  # the live rates per exit of the last judged window
        self.reset(composition, now)

    def reset(self, composition: CompositionRecord, now: float, *, settle: bool = False) -> None:
        """Start over for the composition now deployed (after a retraining, accepted or not). `settle`: a retraining
        of it was just refused, so with `expect="traffic"` expect no more than the rates last judged."""
        measured = composition.window if self.expect == "traffic" else None
        rates = itertools.accumulate((measured or composition.evaluate).exit_rates)
        self.expected = {e.block: rate for e, rate in zip(composition.exits, rates, strict=True)}
        if settle and self.expect == "traffic":
            self.expected = {b: min(rate, self.judged.get(b, rate)) for b, rate in self.expected.items()}
        hit_rate = sum(composition.evaluate.exit_rates)
        self.hit_agreement = 1 - (1 - composition.evaluate.agreement) / hit_rate if hit_rate else 1.0
        self.since = now
        self.rows = self.verified = self.agreed = 0
        self.hits = dict.fromkeys(self.expected, 0)

    def observe(self, counts: ExitCounts) -> None:
        self.verified += counts.verified
        self.agreed += counts.agreed
        self.rows += counts.whole + sum(counts.hits.values())
        for block, hits in counts.hits.items():
            self.hits[block] = self.hits.get(block, 0) + hits

    def check(self, now: float) -> str | None:
        """Why to retrain now, or None; a judged window of rows is then forgotten."""
        if now - self.since >= self.period_s:
            return f"period of {self.period_s:g} s passed"
        if self.verified >= self.min_verified:
            agreement, self.verified, self.agreed = self.agreed / self.verified, 0, 0
            if agreement < self.hit_agreement - self.margin:
                return f"verified hits agree {agreement:.3f} < expected {self.hit_agreement:.3f} − {self.margin:g}"
        if self.rows < self.min_rows:
            return None
        left = itertools.accumulate(self.hits.get(block, 0) for block in self.expected)
        rates = {block: hits / self.rows for block, hits in zip(self.expected, left, strict=True)}
        self.rows, self.hits, self.judged = 0, dict.fromkeys(self.expected, 0), rates
        low = [b for b, rate in rates.items() if rate < self.expected[b] - self.margin]
        if not low:
            return None
        return "rows leaving " + ", ".join(
            f"by {b} {rates[b]:.3f} < expected {self.expected[b]:.3f} − {self.margin:g}" for b in low
        )


@dataclass(frozen=True)
class AdaptSettings:
    """How to retrain: the paper's learning rate (§7.2.1: 0.002); more epochs than its 5, fewer selector steps, and
    more validation rows per window row than one (see the module docstring)."""

    train: TrainSettings = field(default_factory=lambda: TrainSettings(epochs=ADAPT_EPOCHS))
    selector_steps: int = ADAPT_SELECTOR_STEPS
    warm_start: bool = True
    hold_agreement: bool = True
    validation_per_window_row: float = 8.0
    batch_size: int = 256
    seed: int = 0

    def record(self) -> dict[str, object]:
        """The settings as a version's manifest (and a benchmark's result) records them."""
        return {
            "warm_start": self.warm_start,
            "hold_agreement": self.hold_agreement,
            "epochs": self.train.epochs,
            "batch_size": self.train.batch_size,
            "lr": self.train.lr,
            "selector_steps": self.selector_steps,
            "validation_per_window_row": self.validation_per_window_row,
            "seed": self.seed,
        }


@dataclass(frozen=True)
class AdaptResult:
    """A retraining's outcome: the candidate version (deployable with `deploy` when accepted) and its evidence."""

    accepted: bool
    reason: str  # why it was refused, or what it gained
    source_version: int
    before: ChainRecord  # the deployed caches on the held-out rows
    after: ChainRecord  # the retrained caches on the same rows
    before_window: ChainRecord  # the deployed caches on the window's held-out rows alone (today's traffic)
    after_window: ChainRecord  # the retrained caches on the same rows
    composition: CompositionRecord  # the retrained caches' default composition
    manifest: Manifest
    weights: dict[str, dict[str, dict[str, torch.Tensor]]]
    scores: dict[str, np.ndarray]
    rows: dict[str, dict[str, int]]  # per split: validation and window rows used
    forward_s: float  # the base model over every row used (activations and softmax)
    retrain_s: float  # predictors, selectors and thresholds


def adapt(
    chain: BlockChain,
    cache_set: CacheSet,
    composition: CompositionRecord,
    window_rows: np.ndarray,
    validation_x: np.ndarray,
    settings: AdaptSettings | None = None,
) -> AdaptResult:
    """Retrain `composition`'s caches on `window_rows` mixed with `validation_x` (the data `cache_set` was built
    from, fit rows included: `load_build_data`) and judge the result against the deployed caches; writes nothing
    (see `deploy`)."""
    settings = settings or AdaptSettings()
    began = time.perf_counter()
    manifest = cache_set.manifest
    window_rows = _checked_window(window_rows, validation_x)
    variants = _variants(manifest, composition)
    validation_splits = _validation_splits(cache_set, len(validation_x))
    rng = np.random.default_rng(settings.seed)
    x, splits, counts = _mixed_rows(validation_splits, validation_x, window_rows, settings, rng)
    activations, probs = collect_activations(chain, x, exit_shapes(chain, x[:1]), settings.batch_size, False)
    forward_s = time.perf_counter() - began

    began = time.perf_counter()
    deployed = cache_set.caches(composition)
    networks = [
        _retrain(variant, cache, activations[variant.block_index], probs, splits, manifest.num_classes, settings)
        for variant, cache in zip(variants, deployed, strict=True)
    ]
    arrays = _stack([fitted for _, _, fitted in networks]) | {
        f"{s}_rows": rows for s, rows in validation_splits.items()
    }
    current = _stack([_measure(cache, activations[cache.exit.block_index], probs, splits) for cache in deployed])
    candidates = [Candidate(v.block_index, v.lookup_latency_s, v.memory_bytes) for v in variants]
    window_held_out = slice(counts["evaluate"]["validation"], None)  # the evaluate split's rows after validation's

    def chained(
        exits: list[tuple[int, float]], measured: dict[str, np.ndarray], split: str, rows: slice = slice(None)
    ) -> ChainRecord:
        scores, agrees = measured[f"{split}_scores"][:, rows], measured[f"{split}_agrees"][:, rows]
        return simulate(
            exits, candidates, scores, agrees, manifest.block_latency_s, inline=manifest.lookups == "inline"
        )

    exits = [(i, cache.exit.threshold) for i, cache in enumerate(deployed)]
    before = {split: chained(exits, current, split) for split in MEASURED_SPLITS}
    before_window = chained(exits, current, "evaluate", window_held_out)
    composed = compose(
        manifest.model_copy(
            update={"variants": tuple(v.model_copy(update={"targets": {}}) for v in variants), "compositions": ()}
        ),
        arrays,
        # Every target the set serves, so that a stricter one is not served by this target's caches afterwards;
        # the others are composed afresh from the retrained caches, certified as this one is.
        sorted({c.target for c in manifest.compositions if c.default} | {composition.target}),
        alpha=composition.alpha,
        memory_budget_bytes=composition.memory_budget_bytes,
        risk=DEFAULT_RISK if composition.risk is None else composition.risk,  # as the deployed set was certified
        min_required=before["calibrate"].agreement if settings.hold_agreement else 0.0,
    )
    retrain_s = time.perf_counter() - began

    composed_new = composed.default_for(composition.target)
    assert composed_new is not None  # compose makes a default composition for every target
    position = {v.key: i for i, v in enumerate(variants)}
    exits_new = [(position[e.key], e.threshold) for e in composed_new.exits]
    after_window = chained(exits_new, arrays, "evaluate", window_held_out)
    new = composed_new.model_copy(update={"window": after_window})
    composed = composed.model_copy(
        update={"compositions": tuple(new if c is composed_new else c for c in composed.compositions)}
    )
    refused = acceptance(before["evaluate"], new.evaluate, composition.target, before_window, after_window)
    record = _settings_record(settings, cache_set.version, counts, retrain_s)
    return AdaptResult(
        accepted=refused is None,
        reason=refused or _gain(before["evaluate"], new.evaluate, before_window, after_window),
        source_version=cache_set.version,
        before=before["evaluate"],
        after=new.evaluate,
        before_window=before_window,
        after_window=after_window,
        composition=new,
        manifest=composed.model_copy(
            update={
                "settings": record,
                "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
                "torch": torch.__version__,
            }
        ),
        weights={
            v.key: {"predictor": predictor.state_dict(), "selector": selector.state_dict()}
            for v, (predictor, selector, _) in zip(variants, networks, strict=True)
        },
        scores=arrays,
        rows=counts,
        forward_s=forward_s,
        retrain_s=retrain_s,
    )


def acceptance(
    before: ChainRecord, after: ChainRecord, target: float, before_window: ChainRecord, after_window: ChainRecord
) -> str | None:
    """Why retrained caches (`after`) must not replace the deployed ones (`before`), both measured on the same
    held-out rows, validation and window alike; None when they may. `before_window`, `after_window`: the two on the
    window's share of those rows, today's traffic, where agreement must not fall, nor hits, unless the deployed
    caches miss the target there and the new ones agree more. On all held-out rows the new caches must hold the
    target (or, where the deployed ones do not, their agreement), and where the window's rows show the two alike
    while the deployed caches meet the target there, the hits rule holds on all held-out rows instead."""
    if not after.exit_rates:
        return (
            f"the retrained caches certify no exit at the target {target:g}: a set without exits would serve whole "
            "from then on, with no cache left to adapt"
        )
    if after_window.agreement < before_window.agreement:
        return (
            f"agreement on the window's held-out rows would fall from {before_window.agreement:.4f} to "
            f"{after_window.agreement:.4f}"
        )
    if after.agreement < min(target, before.agreement):
        return (
            f"held-out agreement would fall from {before.agreement:.4f} to {after.agreement:.4f}, below the target "
            f"{target:g}"
        )
    on_window = _fewer_hits(before_window, after_window, target, "the window's held-out rows")
    if on_window is not None:
        return on_window
    if _same(before_window, after_window) and before_window.agreement >= target:  # nothing to fix, no difference
        return _fewer_hits(before, after, target, "all held-out rows (the window's cannot tell the two apart)")
    return None


def _fewer_hits(before: ChainRecord, after: ChainRecord, target: float, where: str) -> str | None:
    """Why `after` hits fewer rows than `before` for nothing: where `before` meets the target, or where `after`
    agrees no more; None otherwise."""
    hits_before, hits_after = _hits(before), _hits(after)
    if hits_after >= hits_before:
        return None
    if before.agreement >= target:
        return (
            f"the hit rate on {where} would fall from {hits_before:.3f} to {hits_after:.3f} while the deployed "
            f"caches meet the target {target:g} there ({before.agreement:.4f})"
        )
    if after.agreement == before.agreement:
        return (
            f"the hit rate on {where} would fall from {hits_before:.3f} to {hits_after:.3f} for no gain in "
            f"agreement there ({before.agreement:.4f})"
        )
    return None


def _same(before: ChainRecord, after: ChainRecord) -> bool:
    """As many hits at the same agreement: rows a few dozen strong often cannot tell two versions apart."""
    return after.agreement == before.agreement and _hits(after) == _hits(before)


def _hits(record: ChainRecord) -> float:
    """The share of rows leaving at any exit. Rates are counts over one number of rows, but summed per exit as
    floats the same count of hits differs in the last bits (0.1 + 0.2 > 0.3): rounded, so it counts as equal."""
    return round(sum(record.exit_rates), 9)


def deploy(spec: ModelSpec, result: AdaptResult) -> CacheSet:
    """Write an accepted adaptation as the model's newest cache set version (atomically, beside the others)."""
    if not result.accepted:
        raise CacheSetError(f"a refused adaptation of v{result.source_version} cannot be deployed: {result.reason}")
    directory = write_cache_set(spec, result.manifest, result.weights, result.scores)
    return CacheSet(directory, int(directory.name[1:]), result.manifest)


def _gain(before: ChainRecord, after: ChainRecord, before_window: ChainRecord, after_window: ChainRecord) -> str:
    def change(old: ChainRecord, new: ChainRecord) -> str:
        return (
            f"agreement {old.agreement:.4f} → {new.agreement:.4f}, "
            f"hit rate {sum(old.exit_rates):.3f} → {sum(new.exit_rates):.3f}"
        )

    return f"on the window's held-out rows {change(before_window, after_window)}; on all {change(before, after)}"


def _checked_window(window_rows: np.ndarray, validation_x: np.ndarray) -> np.ndarray:
    if window_rows.ndim != validation_x.ndim or window_rows.shape[1:] != validation_x.shape[1:]:
        raise InvalidInputError(
            f"window rows are shaped {list(window_rows.shape[1:])}, but the validation data's rows (the model's "
            f"input) are {list(validation_x.shape[1:])}"
        )
    if len(window_rows) < MIN_WINDOW_ROWS:
        raise InvalidInputError(
            f"the window holds {len(window_rows)} rows; adaptation needs at least {MIN_WINDOW_ROWS}"
        )
    if not np.isfinite(window_rows).all():
        raise InvalidInputError("window rows hold NaN or infinite values")
    return window_rows.astype(validation_x.dtype, copy=False)


def _variants(manifest: Manifest, composition: CompositionRecord) -> list[VariantRecord]:
    """The composition's variants, in its exits' (block) order."""
    variants = {v.key: v for v in manifest.variants}
    missing = [e.key for e in composition.exits if e.key not in variants]
    if missing or not composition.exits:
        raise CacheSetError(
            f"cannot adapt a composition of target {composition.target:g} "
            + (f"naming unknown caches {missing}" if missing else "without exits: there is no cache to retrain")
        )
    return [variants[e.key] for e in composition.exits]


def _validation_splits(cache_set: CacheSet, rows: int) -> dict[str, np.ndarray]:
    """Which validation rows each split of the set holds, checked against the validation data given."""
    arrays = cache_set.scores()
    missing = [split for split in SPLITS if f"{split}_rows" not in arrays]
    if missing:
        raise CacheSetError(f"{cache_set.directory}: no split rows for {missing}; rebuild the set to adapt it")
    splits = {split: arrays[f"{split}_rows"] for split in SPLITS}
    highest = max(int(r.max(initial=-1)) for r in splits.values())
    if highest >= rows:
        raise InvalidInputError(
            f"the validation data has {rows} rows, but {cache_set.directory} was built from at least {highest + 1}: "
            "pass the data the set was built from"
        )
    return splits


def _mixed_rows(
    validation_splits: dict[str, np.ndarray],
    validation_x: np.ndarray,
    window_rows: np.ndarray,
    settings: AdaptSettings,
    rng: np.random.Generator,
) -> tuple[np.ndarray, dict[str, torch.Tensor], dict[str, dict[str, int]]]:
    """All rows in one array, each split's indices into it, and per split how many validation and window rows."""
    window_splits = split_rows(len(window_rows), rng)
    parts, splits, counts, start = [], {}, {}, 0
    for split, window_index in window_splits.items():
        available = validation_splits[split]
        wanted = len(available)  # measuring rows costs a forward pass; more of them steady thresholds and verdicts
        if split not in MEASURED_SPLITS:
            wanted = min(wanted, math.ceil(settings.validation_per_window_row * len(window_index)))
        chosen = np.sort(rng.choice(available, wanted, replace=False))
        rows = np.concatenate([validation_x[chosen], window_rows[window_index.numpy()]])
        parts.append(rows)
        splits[split] = torch.arange(start, start + len(rows))
        counts[split] = {"validation": wanted, "window": len(window_index)}
        start += len(rows)
    return np.concatenate(parts), splits, counts


def _retrain(
    variant: VariantRecord,
    deployed: LearnedCache,
    activations: torch.Tensor,
    probs: torch.Tensor,
    splits: dict[str, torch.Tensor],
    num_classes: int,
    settings: AdaptSettings,
) -> tuple[nn.Module, Selector, Fitted]:
    """A copy of the deployed cache's networks (or fresh ones) trained on the mixed rows."""
    torch.manual_seed(settings.seed)
    predictor = build_predictor(VariantSpec.parse(variant.variant), variant.input_shape, num_classes)
    assert predictor is not None  # the deployed cache was built from the same record
    selector = Selector(num_classes)
    if settings.warm_start:
        predictor.load_state_dict(deployed.predictor.state_dict())
        selector.load_state_dict(deployed.selector.state_dict())
    fitted = fit_cache(
        predictor, selector, activations, probs, probs.argmax(1), splits, settings.train, settings.selector_steps
    )
    return predictor, selector, fitted


def _measure(
    cache: LearnedCache, activations: torch.Tensor, probs: torch.Tensor, splits: dict[str, torch.Tensor]
) -> Fitted:
    """The deployed cache on the calibrate and evaluate rows, as `fit_cache` measures a trained one."""
    measured: dict[str, dict[str, np.ndarray]] = {"scores": {}, "softmax": {}, "agrees": {}}
    with torch.no_grad():
        for split in MEASURED_SPLITS:
            index = splits[split]
            _, logits, score = cache(activations[index])
            measured["scores"][split] = score.numpy()
            measured["softmax"][split] = torch.softmax(logits, 1).max(1).values.numpy()
            measured["agrees"][split] = (logits.argmax(1) == probs[index].argmax(1)).numpy()
    return Fitted(**measured)


def _stack(fitted: list[Fitted]) -> dict[str, np.ndarray]:
    """Per-row arrays [cache, row] as `scores.npz` holds them."""
    return {
        f"{split}_{kind}": np.stack([getattr(f, kind)[split] for f in fitted])
        for split in MEASURED_SPLITS
        for kind in ("scores", "softmax", "agrees")
    }


def _settings_record(
    settings: AdaptSettings, source: int, counts: dict[str, dict[str, int]], retrain_s: float
) -> dict[str, object]:
    return {
        "adapted_from": f"v{source}",
        "rows": counts,
        **settings.record(),
        "retrain_s": retrain_s,
        "threads": torch.get_num_threads(),
    }
