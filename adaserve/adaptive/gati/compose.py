"""GATI's composition phase (§4, appendix A.1.2): which learned caches to deploy, and at what thresholds.

Two compositions are made for every agreement target, side by side:

`milp` — the paper's relaxed formulation, solved exactly as an integer program (`scipy.optimize.milp`). Each
variant keeps the threshold that reaches the target on its own (set on the calibrate split), which fixes its hit
rate H and agreement A. Variables: b_c ∈ {0, 1} per candidate c = (block i, variant j). Maximize Σ_c S_c·b_c with
S_c = α·H_c + (1 − α)·LG_c and LG_c = Σ_k L_k / (Σ_{k≤i} L_k + T_c) (eq. 1–3), subject to
  - accuracy filter (step 1): b_c = 0 when A_c < A — and when H_c = 0, since a cache that never hits would still
    score (1 − α)·LG_c;
  - one variant per block: Σ_{c at block i} b_c ≤ 1;
  - memory (eq. 8): Σ_c M_c·b_c ≤ M;
  - at most one lookup in flight (eq. 9): a lookup started after block i must finish before the next chosen exit's
    block does, T_c ≤ Σ_{k=i+1..j} L_k; so for every block j after i with Σ_{k=i+1..j} L_k < T_c, the row
    b_c + Σ_{c' at j} b_c' ≤ 1, and b_c = 0 when the lookup outlasts the rest of the model (Σ_{k>i} L_k < T_c).

`overall` — holds the target on the *whole* model rather than per cache, with a stated risk (`certify`: Learn then
Test). The candidate sets are those the integer program picks over α ∈ {0, 0.1, …, 1} and every subset of each. Half
the calibrate rows tune: thresholds are tuned jointly by simulating the chained exits (each row leaves at the first
exit whose selector says hit); the set with the lowest expected latency at the target there gives the exits, and
their thresholds are tuned again for each agreement level of a sequence, strictest first; each such setting then
drops any exit whose removal lowers the expected latency on the tune rows with the agreement still at its level (a
strict level can leave an exit hitting too rarely to pay for its lookup). The other half checks: the
settings are tested in order against "agreement below the target" with an exact binomial test at level `risk`
(default 0.05), stopping at the first that fails, and the fastest accepted setting is deployed (none accepted: no
exit). Its agreement and latency are then measured on the evaluate split, which set nothing. This one is the default:
per-cache thresholds ignore that a later cache only sees the rows earlier ones missed. It replaced a margin of two
standard errors above the target on the rows that also tuned the thresholds, which on one build of the benchmark
ResNet still ended at .9888 on the evaluate rows for a target of .99 (`certify` says why).

Expected latency follows how the runtime will run the lookups (`Manifest.lookups`):
  - `async`, the paper's model (lookups beside the model: `caches.lookup: process`, or `stream` on a GPU): a row
    leaving at block i costs Σ_{k≤i} L_k + T_c, a row that never hits costs Σ_k L_k;
  - `inline` (the default, `auto`): every lookup a row reaches is on its path, so a row leaving at block i costs
    Σ_{k≤i} L_k plus every lookup up to and including that one, and a row that never hits pays them all. Under this
    model an exit whose hits save less than its misses cost slows the model down, so the overall composition also
    tries every subset of each chosen set and keeps the fastest (on the ResNet-style benchmark CNN the async model
    kept a late exit whose lookup cost every row reaching it more than its hits saved).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import combinations
from typing import Literal

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp

from adaserve.adaptive.gati.cacheset import (
    ChainRecord,
    CompositionRecord,
    ExitRecord,
    HitRecord,
    Manifest,
    TargetRecord,
)
from adaserve.adaptive.gati.certify import DEFAULT_RISK, accepted, levels, split
from adaserve.adaptive.gati.selectors import HitRates, choose_threshold
from adaserve.config import ModelConfig
from adaserve.errors import ConfigError

__all__ = [
    "ALPHAS",
    "Candidate",
    "certified_exits",
    "compose",
    "lookup_cost",
    "simulate",
    "solve_milp",
    "tune_thresholds",
]

#: The α values the overall composition tries (the paper sweeps α and picks one, Fig. 25).
ALPHAS = tuple(round(0.1 * i, 1) for i in range(11))
#: The paper's choice for ResNet-50 (Fig. 25), the `milp` composition's default.
DEFAULT_ALPHA = 0.2


def lookup_cost(config: ModelConfig) -> Literal["inline", "async"]:
    """How composition costs lookups for a model as its config runs them (`caches.lookup`): only a model process or
    a side stream takes them off the rows' path (`auto` is inline, and so is a config without `caches`)."""
    if config.caches is None:
        return "inline"
    return "inline" if config.caches.lookup_at == "inline" else "async"


@dataclass(frozen=True)
class Candidate:
    """One (block, variant) as composition sees it."""

    exit: int  # block index the cache reads
    lookup_s: float
    memory_bytes: int
    hit_rate: float = 0.0
    agreement: float = 1.0


def latency_gain(candidate: Candidate, block_latency_s: Sequence[float]) -> float:
    """LG (eq. 1): the whole model's time over the time of a hit at this cache."""
    return sum(block_latency_s) / (sum(block_latency_s[: candidate.exit + 1]) + candidate.lookup_s)


def solve_milp(
    candidates: Sequence[Candidate],
    block_latency_s: Sequence[float],
    *,
    alpha: float,
    min_agreement: float,
    memory_budget_bytes: int | None,
) -> tuple[int, ...]:
    """Indices of the candidates the relaxed formulation chooses (see the module docstring), in block order."""
    count = len(candidates)
    if not count:
        return ()
    latency = np.asarray(block_latency_s, dtype=float)
    after = np.concatenate([np.cumsum(latency[::-1])[::-1][1:], [0.0]])  # after[i] = Σ_{k>i} L_k
    upper = np.ones(count)
    rows: list[np.ndarray] = []
    for c, candidate in enumerate(candidates):
        if candidate.agreement < min_agreement or candidate.hit_rate <= 0 or candidate.lookup_s > after[candidate.exit]:
            upper[c] = 0  # filtered, never hits, or answers after the base model would have
            continue
        # Blocks j > i whose end comes before this lookup's: an exit there would put two lookups in flight.
        overlapped = {
            j for j in range(candidate.exit + 1, len(latency)) if after[candidate.exit] - after[j] < candidate.lookup_s
        }
        row = np.array([1.0 if other.exit in overlapped else 0.0 for other in candidates])
        if row.any():
            row[c] = 1.0
            rows.append(row)
    for block in {candidate.exit for candidate in candidates}:
        rows.append(np.array([1.0 if other.exit == block else 0.0 for other in candidates]))
    bounds = [1.0] * len(rows)
    if memory_budget_bytes is not None:
        rows.append(np.array([float(other.memory_bytes) for other in candidates]))
        bounds.append(float(memory_budget_bytes))
    scores = np.array([alpha * c.hit_rate + (1 - alpha) * latency_gain(c, block_latency_s) for c in candidates])
    result = milp(
        -scores,
        integrality=np.ones(count),
        bounds=Bounds(np.zeros(count), upper),
        constraints=LinearConstraint(np.array(rows), -np.inf, np.array(bounds)),
    )
    if not result.success:  # all-zero is always feasible, so this is the solver failing
        raise RuntimeError(f"scipy.optimize.milp failed: {result.message}")
    chosen = [c for c in range(count) if result.x[c] > 0.5]
    return tuple(sorted(chosen, key=lambda c: candidates[c].exit))


def simulate(
    exits: Sequence[tuple[int, float]],
    candidates: Sequence[Candidate],
    scores: np.ndarray,
    agrees: np.ndarray,
    block_latency_s: Sequence[float],
    *,
    inline: bool,
) -> ChainRecord:
    """Chained exits (candidate index, threshold) over one split's rows (`scores`, `agrees`: [candidate, row]);
    `inline`: lookups on the rows' path (see the module docstring)."""
    ordered = sorted(exits, key=lambda e: candidates[e[0]].exit)
    position, correct, latency = _run_chain(ordered, candidates, scores, agrees, block_latency_s, inline)
    return ChainRecord(
        agreement=float(correct.mean()),
        mean_latency_s=float(latency.mean()),
        exit_rates=tuple(float(np.mean(position == p)) for p in range(len(ordered))),
    )


def _run_chain(
    exits: Sequence[tuple[int, float]],
    candidates: Sequence[Candidate],
    scores: np.ndarray,
    agrees: np.ndarray,
    block_latency_s: Sequence[float],
    inline: bool,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per row, for exits in block order: the position of the exit it leaves at (−1: none), whether its answer
    agrees with the base model, and its latency. An exit that never hits (threshold +inf) is not deployed and costs
    nothing."""
    rows = scores.shape[1]
    prefix = np.cumsum(block_latency_s)
    position = np.full(rows, -1)
    correct = np.ones(rows, dtype=bool)
    latency = np.full(rows, prefix[-1])
    waited = np.zeros(rows)  # inline: the lookups each row has gone through so far
    for p, (index, threshold) in enumerate(exits):
        if not math.isfinite(threshold):
            continue
        lookup_s = candidates[index].lookup_s
        reach = position < 0
        hit = reach & (scores[index] >= threshold)
        waited[reach] += lookup_s
        position[hit] = p
        correct[hit] = agrees[index][hit]
        latency[hit] = prefix[candidates[index].exit] + (waited[hit] if inline else lookup_s)
    if inline:
        latency[position < 0] += waited[position < 0]
    return position, correct, latency


def tune_thresholds(
    chosen: Sequence[int],
    candidates: Sequence[Candidate],
    scores: np.ndarray,
    agrees: np.ndarray,
    block_latency_s: Sequence[float],
    required: float,
    *,
    inline: bool,
) -> tuple[float, ...]:
    """Thresholds for the chained exits `chosen` (in block order) with the lowest expected latency found whose
    simulated agreement on these rows is at least `required` (+inf: the exit never hits).

    For a price λ of one disagreement, each exit in turn takes, among the rows that reach it, the score prefix
    maximizing Σ (latency saved − λ·disagrees); λ is scanned over a log grid from "errors are nearly free" to "no
    error is worth any saving". The prefixes one λ yields skip between the points where errors cluster, so each
    result that holds `required` is then filled: exit by exit, the threshold is lowered as far as the agreement
    still holds. The fastest result is kept."""
    prefix = np.cumsum(block_latency_s)
    lookups = [candidates[c].lookup_s for c in chosen]
    # What a hit saves against running to the end: inline, the lookups after this one (its own is paid either way).
    gains = [
        prefix[-1] - prefix[candidates[c].exit] + (sum(lookups[p + 1 :]) if inline else -lookups[p])
        for p, c in enumerate(chosen)
    ]
    positive = [g for g in gains if g > 0]
    best = tuple(math.inf for _ in chosen)
    if not positive:
        return best
    best_latency = prefix[-1]
    for price in np.geomspace(min(positive) * 1e-3, max(positive) * scores.shape[1] * 2, 64):
        thresholds = _priced_thresholds(price, chosen, gains, scores, agrees)
        thresholds = _fill(thresholds, chosen, gains, candidates, scores, agrees, block_latency_s, required, inline)
        exits = list(zip(chosen, thresholds, strict=True))
        stats = simulate(exits, candidates, scores, agrees, block_latency_s, inline=inline)
        if stats.agreement >= required and stats.mean_latency_s < best_latency:
            best, best_latency = thresholds, stats.mean_latency_s
    return best


def _priced_thresholds(
    price: float, chosen: Sequence[int], gains: Sequence[float], scores: np.ndarray, agrees: np.ndarray
) -> tuple[float, ...]:
    remaining = np.ones(scores.shape[1], dtype=bool)
    thresholds = []
    for index, gain in zip(chosen, gains, strict=True):
        threshold = math.inf
        if gain > 0 and remaining.any():
            order = np.argsort(-scores[index][remaining], kind="stable")
            ranked = scores[index][remaining][order]
            value = np.cumsum(gain - price * (1 - agrees[index][remaining][order]))
            value[:-1][ranked[:-1] <= ranked[1:]] = -np.inf  # cut only where the score drops
            best = int(np.argmax(value))
            if value[best] > 0:
                threshold = float(ranked[best])
        thresholds.append(threshold)
        remaining &= ~(scores[index] >= threshold)
    return tuple(thresholds)


def _fill(
    thresholds: tuple[float, ...],
    chosen: Sequence[int],
    gains: Sequence[float],
    candidates: Sequence[Candidate],
    scores: np.ndarray,
    agrees: np.ndarray,
    block_latency_s: Sequence[float],
    required: float,
    inline: bool,
) -> tuple[float, ...]:
    """Lower each exit's threshold, in block order, to the lowest that keeps the chained agreement ≥ `required`."""
    filled = list(thresholds)
    for p, (index, gain) in enumerate(zip(chosen, gains, strict=True)):
        position, correct, _ = _run_chain(
            list(zip(chosen, filled, strict=True)), candidates, scores, agrees, block_latency_s, inline
        )
        agreement = correct.mean()
        if agreement < required:
            break
        if gain <= 0:
            continue
        waiting = ((position < 0) | (position >= p)) & (scores[index] < filled[p])  # reach it, not yet taken
        order = np.argsort(-scores[index][waiting], kind="stable")
        ranked = scores[index][waiting][order]
        change = agrees[index][waiting][order].astype(int) - correct[waiting][order].astype(int)
        holds = agreement + np.cumsum(change) / scores.shape[1] >= required
        holds[:-1] &= ranked[:-1] > ranked[1:]  # cut only where the score drops
        if holds.any():
            filled[p] = float(ranked[np.flatnonzero(holds)[-1]])
    return tuple(filled)


def compose(
    manifest: Manifest,
    arrays: dict[str, np.ndarray],
    targets: Sequence[float],
    *,
    alpha: float = DEFAULT_ALPHA,
    memory_budget_bytes: int | None = None,
    risk: float = DEFAULT_RISK,
    min_required: float = 0.0,
) -> Manifest:
    """The manifest with per-variant thresholds and both compositions for each target (replacing earlier ones for
    the same targets); `arrays` are the set's per-row scores (`CacheSet.scores()`). The overall compositions also
    agree on at least `min_required` of the tune rows and of the check rows (adaptation passes the deployed caches'
    agreement on the calibrate rows)."""
    variants = manifest.variants
    if memory_budget_bytes is not None:
        smallest = min(variants, key=lambda v: v.memory_bytes)
        if memory_budget_bytes < smallest.memory_bytes:
            raise ConfigError(
                f"memory budget {memory_budget_bytes / 1e6:.6g} MB is below the smallest cache "
                f"({smallest.key}: {smallest.memory_bytes / 1e6:.6g} MB); no cache fits"
            )
    inline = manifest.lookups == "inline"
    cal = arrays["calibrate_scores"], arrays["calibrate_agrees"].astype(bool)
    latency = manifest.block_latency_s
    records = {v.key: dict(v.targets) for v in variants}
    compositions = [c for c in manifest.compositions if c.target not in targets]
    for target in targets:
        candidates, own_thresholds = [], []
        for index, variant in enumerate(variants):
            threshold = choose_threshold(cal[0][index], cal[1][index], target)
            rates = HitRates.at(cal[0][index], cal[1][index], threshold)
            candidates.append(
                Candidate(
                    variant.block_index, variant.lookup_latency_s, variant.memory_bytes, rates.hit_rate, rates.agreement
                )
            )
            own_thresholds.append(threshold)
            records[variant.key][f"{target:g}"] = _target_record(index, threshold, target, arrays)
        chosen = solve_milp(
            candidates,
            latency,
            alpha=alpha,
            min_agreement=target,
            memory_budget_bytes=memory_budget_bytes,
        )
        exits = [(c, own_thresholds[c]) for c in chosen]
        compositions.append(_record("milp", target, alpha, memory_budget_bytes, exits, manifest, candidates, arrays))
        sets = _candidate_sets(candidates, latency, target, memory_budget_bytes)
        found = certified_exits(
            list(sets), candidates, cal, latency, target, risk=risk, inline=inline, floor=min_required
        )
        best_alpha = sets[found.subset] if found.subset is not None else alpha
        compositions.append(
            _record(
                "overall", target, best_alpha, memory_budget_bytes, found.exits, manifest, candidates, arrays, found
            )
        )
    updated = tuple(v.model_copy(update={"targets": records[v.key]}) for v in variants)
    ordered = tuple(sorted(compositions, key=lambda c: (-c.target, c.method)))
    return manifest.model_copy(update={"variants": updated, "compositions": ordered})


def _candidate_sets(
    candidates: Sequence[Candidate], latency: Sequence[float], target: float, memory_budget_bytes: int | None
) -> dict[tuple[int, ...], float]:
    """The sets the overall composition weighs, each with the first α that gave it: the integer program's choice
    for every α, and every subset of each, since with inline lookups a chosen exit can cost more than it saves."""
    sets: dict[tuple[int, ...], float] = {}
    for alpha in ALPHAS:
        chosen = solve_milp(
            candidates,
            latency,
            alpha=alpha,
            min_agreement=target,
            memory_budget_bytes=memory_budget_bytes,
        )
        for size in range(len(chosen), -1, -1):
            for subset in combinations(chosen, size):
                sets.setdefault(subset, alpha)
    return sets


@dataclass(frozen=True)
class Certified:
    """The overall composition's outcome: the exits deployed, the candidate set they came from (None: no setting
    was accepted, so no exit), and the deployed exits on the check rows."""

    exits: list[tuple[int, float]]
    subset: tuple[int, ...] | None
    check: ChainRecord
    risk: float


def certified_exits(
    sets: Sequence[tuple[int, ...]],
    candidates: Sequence[Candidate],
    cal: tuple[np.ndarray, np.ndarray],
    block_latency_s: Sequence[float],
    target: float,
    *,
    risk: float = DEFAULT_RISK,
    inline: bool,
    floor: float = 0.0,
) -> Certified:
    """The fastest setting of chained exits that the check half of the calibrate rows (`cal`: scores and agrees,
    [candidate, row]) certifies for `target` at `risk`. The exits are the set of `sets` fastest on the tune half at
    the target; the settings tested are their thresholds tuned there for each level in turn (see the module
    docstring). A setting must also agree on at least `floor` of the rows of each half."""
    tune, check = split(cal[0].shape[1])
    tune_rows = cal[0][:, tune], cal[1][:, tune]
    check_rows = cal[0][:, check], cal[1][:, check]

    def on_tune(exits: list[tuple[int, float]]) -> ChainRecord:
        return simulate(exits, candidates, *tune_rows, block_latency_s, inline=inline)

    def tuned(subset: tuple[int, ...], level: float) -> list[tuple[int, float]]:
        thresholds = tune_thresholds(subset, candidates, *tune_rows, block_latency_s, level, inline=inline)
        exits = [(c, t) for c, t in zip(subset, thresholds, strict=True) if math.isfinite(t)]
        return _pruned(exits, level, on_tune)

    def tune_latency(exits: list[tuple[int, float]]) -> float:
        return on_tune(exits).mean_latency_s

    subset = min(sets, key=lambda s: tune_latency(tuned(s, max(target, floor))), default=())
    settings = [tuned(subset, level) for level in levels(target, floor)]
    checked = [simulate(exits, candidates, *check_rows, block_latency_s, inline=inline) for exits in settings]
    wrong = [round((1 - stats.agreement) * len(check)) for stats in checked]
    eligible = [i for i in range(accepted(wrong, len(check), target, risk)) if checked[i].agreement >= floor]
    if not eligible:
        return Certified([], None, simulate([], candidates, *check_rows, block_latency_s, inline=inline), risk)
    best = min(eligible, key=lambda i: checked[i].mean_latency_s)
    return Certified(settings[best], subset, checked[best], risk)


def _pruned(
    exits: list[tuple[int, float]], level: float, measure: Callable[[list[tuple[int, float]]], ChainRecord]
) -> list[tuple[int, float]]:
    """`exits` less those whose removal, one at a time and the fastest first, lowers the expected latency with the
    agreement still at `level` (`measure`: on the tune rows). Thresholds tuned for a strict level can leave an
    exit hitting so rarely that its lookup costs the rows reaching it more than its hits save: on the benchmark
    ResNet, a `layer1.0` exit answered 0.4% of rows and cost the 27% that reached it 81 µs each."""
    current = measure(exits)
    while exits:
        fewer = [exits[:p] + exits[p + 1 :] for p in range(len(exits))]
        kept = [(stats, option) for option in fewer if (stats := measure(option)).agreement >= level]
        stats, option = min(kept, key=lambda k: k[0].mean_latency_s, default=(current, exits))
        if stats.mean_latency_s >= current.mean_latency_s:
            break
        current, exits = stats, option
    return exits


def _target_record(index: int, threshold: float, target: float, arrays: dict[str, np.ndarray]) -> TargetRecord:
    agrees_cal = arrays["calibrate_agrees"][index].astype(bool)
    agrees_ev = arrays["evaluate_agrees"][index].astype(bool)
    softmax_threshold = choose_threshold(arrays["calibrate_softmax"][index], agrees_cal, target)
    selector = HitRates.at(arrays["evaluate_scores"][index], agrees_ev, threshold)
    softmax = HitRates.at(arrays["evaluate_softmax"][index], agrees_ev, softmax_threshold)
    return TargetRecord(
        selector=_hit_record(threshold, selector),
        softmax=_hit_record(softmax_threshold, softmax),
        calibrate_hit_rate=HitRates.at(arrays["calibrate_scores"][index], agrees_cal, threshold).hit_rate,
    )


def _hit_record(threshold: float, rates: HitRates) -> HitRecord:
    return HitRecord(
        threshold=threshold if math.isfinite(threshold) else None,
        hit_rate=rates.hit_rate,
        agreement=rates.agreement,
        overall=rates.overall,
    )


def _record(
    method: Literal["milp", "overall"],
    target: float,
    alpha: float,
    memory_budget_bytes: int | None,
    exits: list[tuple[int, float]],
    manifest: Manifest,
    candidates: Sequence[Candidate],
    arrays: dict[str, np.ndarray],
    certified: Certified | None = None,
) -> CompositionRecord:
    exits = [(c, t) for c, t in exits if math.isfinite(t)]
    variants = manifest.variants
    inline = manifest.lookups == "inline"

    def measured(split: str) -> ChainRecord:
        scores, agrees = arrays[f"{split}_scores"], arrays[f"{split}_agrees"].astype(bool)
        return simulate(exits, candidates, scores, agrees, manifest.block_latency_s, inline=inline)

    return CompositionRecord(
        method=method,
        target=target,
        alpha=alpha,
        memory_budget_bytes=memory_budget_bytes,
        exits=tuple(
            ExitRecord(key=variants[c].key, block=variants[c].block, block_index=variants[c].block_index, threshold=t)
            for c, t in exits
        ),
        memory_bytes=sum(variants[c].memory_bytes for c, _ in exits),
        calibrate=measured("calibrate"),
        check=certified.check if certified else None,
        risk=certified.risk if certified else None,
        evaluate=measured("evaluate"),
        default=certified is not None,
    )
