"""Composition: the integer program against brute force, the chained-exit simulation (lookups beside the model
and on the rows' path), joint threshold tuning, the overall composition dropping an exit that costs more than it
saves, and its certification on rows that did not tune it."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from adaserve.adaptive.gati.cacheset import DataRecord, Manifest, VariantRecord
from adaserve.adaptive.gati.compose import (
    Candidate,
    certified_exits,
    compose,
    latency_gain,
    simulate,
    solve_milp,
    tune_thresholds,
)


def brute_force(
    candidates: list[Candidate],
    latency: list[float],
    alpha: float,
    min_agreement: float,
    budget: int | None,
) -> float:
    """The best total score over every assignment of at most one variant per block that meets the paper's
    constraints, checked directly: filter, memory, each lookup done before the next chosen exit's block does."""
    blocks = sorted({c.exit for c in candidates})
    options = [[None, *[i for i, c in enumerate(candidates) if c.exit == b]] for b in blocks]
    best = 0.0
    for pick in itertools.product(*options):
        chosen = [candidates[i] for i in pick if i is not None]
        if any(c.agreement < min_agreement or c.hit_rate <= 0 for c in chosen):
            continue
        if budget is not None and sum(c.memory_bytes for c in chosen) > budget:
            continue
        ends = [c.exit for c in chosen[1:]] + [len(latency) - 1] if chosen else []
        if any(c.lookup_s > sum(latency[c.exit + 1 : end + 1]) for c, end in zip(chosen, ends, strict=True)):
            continue
        best = max(best, sum(alpha * c.hit_rate + (1 - alpha) * latency_gain(c, latency) for c in chosen))
    return best


@pytest.mark.parametrize("seed", range(40))
def test_milp_matches_brute_force(seed: int) -> None:
    rng = np.random.default_rng(seed)
    blocks = int(rng.integers(3, 6))
    latency = list(rng.uniform(1.0, 4.0, blocks))
    candidates = [
        Candidate(
            exit=int(rng.integers(0, blocks - 1)),
            lookup_s=float(rng.uniform(0.2, 5.0)),
            memory_bytes=int(rng.integers(1, 100)),
            hit_rate=float(rng.choice([0.0, rng.uniform(0.1, 0.9)], p=[0.1, 0.9])),
            agreement=float(rng.uniform(0.95, 1.0)),
        )
        for _ in range(int(rng.integers(2, 8)))
    ]
    alpha = float(rng.uniform(0, 1))
    budget = None if seed % 4 == 0 else int(rng.integers(20, 200))
    chosen = solve_milp(candidates, latency, alpha=alpha, min_agreement=0.97, memory_budget_bytes=budget)
    score = sum(alpha * candidates[i].hit_rate + (1 - alpha) * latency_gain(candidates[i], latency) for i in chosen)
    assert score == pytest.approx(brute_force(candidates, latency, alpha, 0.97, budget))
    assert [candidates[i].exit for i in chosen] == sorted({candidates[i].exit for i in chosen})  # block order


def test_milp_keeps_one_lookup_in_flight() -> None:
    latency = [1.0, 1.0, 1.0, 1.0]
    slow = Candidate(exit=0, lookup_s=1.5, memory_bytes=1, hit_rate=0.5)  # still running when block 1 ends
    after_one = Candidate(exit=1, lookup_s=0.5, memory_bytes=1, hit_rate=0.5)
    after_two = Candidate(exit=2, lookup_s=0.5, memory_bytes=1, hit_rate=0.5)
    too_slow = Candidate(exit=2, lookup_s=1.5, memory_bytes=1, hit_rate=0.9)  # outlasts the last block
    chosen = solve_milp(
        [slow, after_one, after_two, too_slow], latency, alpha=1.0, min_agreement=0.9, memory_budget_bytes=None
    )
    assert chosen in ((0, 2), (1, 2))  # never 0 with 1, never the lookup longer than the rest of the model
    assert solve_milp([after_one, after_two], latency, alpha=1.0, min_agreement=0.9, memory_budget_bytes=1) in (
        (0,),
        (1,),
    )


def hand_made() -> tuple[list[Candidate], np.ndarray, np.ndarray, list[float]]:
    """Two exits (after blocks 0 and 1 of three, 1 ms each, lookups 0.5 ms) over five rows."""
    candidates = [
        Candidate(exit=0, lookup_s=0.5e-3, memory_bytes=1),
        Candidate(exit=1, lookup_s=0.5e-3, memory_bytes=1),
    ]
    scores = np.array([[0.9, 0.8, 0.2, 0.1, 0.6], [0.1, 0.9, 0.9, 0.3, 0.7]])
    agrees = np.array([[1, 0, 1, 1, 1], [1, 1, 0, 1, 1]], dtype=bool)
    return candidates, scores, agrees, [1e-3, 1e-3, 1e-3]


def test_chained_exits_by_hand() -> None:
    candidates, scores, agrees, latency = hand_made()
    stats = simulate([(1, 0.65), (0, 0.7)], candidates, scores, agrees, latency, inline=False)
    # Exit 0 (τ 0.7) takes rows 0 and 1 (row 1 wrong); exit 1 (τ 0.65) takes rows 2 (wrong) and 4; row 3 runs on.
    assert stats.exit_rates == (0.4, 0.4)
    assert stats.agreement == pytest.approx(3 / 5)
    assert stats.mean_latency_s == pytest.approx((2 * 1.5e-3 + 2 * 2.5e-3 + 3e-3) / 5)
    assert simulate([], candidates, scores, agrees, latency, inline=False).agreement == 1.0
    # Inline, rows 2 and 4 also waited for exit 0's lookup, and row 3 for both.
    inline = simulate([(1, 0.65), (0, 0.7)], candidates, scores, agrees, latency, inline=True)
    assert (inline.exit_rates, inline.agreement) == (stats.exit_rates, stats.agreement)
    assert inline.mean_latency_s == pytest.approx((2 * 1.5e-3 + 2 * 3e-3 + 4e-3) / 5)
    # An exit that never hits is not deployed: it costs no row anything.
    never = simulate([(0, 0.7), (1, math.inf)], candidates, scores, agrees, latency, inline=True)
    assert never.mean_latency_s == pytest.approx((2 * 1.5e-3 + 3 * 3.5e-3) / 5)


def test_tuned_thresholds_hold_the_overall_agreement() -> None:
    candidates, scores, agrees, latency = hand_made()
    # 4/5 overall lets one wrong row exit: exit 0 then takes every row (row 1 wrong), all at 1.5 ms.
    thresholds = tune_thresholds([0, 1], candidates, scores, agrees, latency, 0.8, inline=False)
    stats = simulate(list(zip([0, 1], thresholds, strict=True)), candidates, scores, agrees, latency, inline=False)
    assert (stats.agreement, stats.exit_rates) == (0.8, (1.0, 0.0))
    assert stats.mean_latency_s == pytest.approx(1.5e-3)
    # No wrong row at all: exit 0 stops above row 1 (0.8) and exit 1 cannot split the tie of rows 1 and 2 (0.9).
    perfect = tune_thresholds([0, 1], candidates, scores, agrees, latency, 1.0, inline=False)
    stats = simulate(list(zip([0, 1], perfect, strict=True)), candidates, scores, agrees, latency, inline=False)
    assert (stats.agreement, stats.exit_rates) == (1.0, (0.2, 0.0))
    assert stats.mean_latency_s == pytest.approx((1.5e-3 + 4 * 3e-3) / 5)
    assert tune_thresholds([0], [Candidate(0, 5e-3, 1)], scores, agrees, latency, 0.5, inline=False) == (
        math.inf,
    )  # no gain


def test_inline_lookups_drop_an_exit_whose_misses_cost_more_than_its_hits_save() -> None:
    """Three 1 ms blocks; exit a after block 0 (lookup 0.1 ms) answers half the rows, exit b after block 1 (lookup
    0.5 ms) a tenth. Beside the model, b's hits save 0.5 ms each and cost the others nothing: mean 2.0 ms with b,
    2.05 without. Inline, each of the 50 rows reaching b waits 0.5 ms for it: 2.25 ms with b, 2.1 without."""
    rows = np.arange(1000) % 100  # 500 check rows: enough to certify .99 with no disagreement (p = .99^500)
    scores = np.array([np.where(rows < 50, 0.9, 0.1), np.where((rows >= 50) & (rows < 60), 0.9, 0.1)])
    agrees = scores > 0.5  # every hit agrees, every low score would not
    arrays = {f"{split}_{kind}": scores for split in ("calibrate", "evaluate") for kind in ("scores", "softmax")}
    arrays |= {f"{split}_agrees": agrees for split in ("calibrate", "evaluate")}
    manifest = Manifest(
        model="m",
        model_version=1,
        artifact="1/model.pt2",
        artifact_sha256="0" * 64,
        created="2026-01-01T00:00:00+00:00",
        torch="2.13.0",
        settings={},
        data=DataRecord(source="test", rows=2000, labels=False, splits={"calibrate": 1000, "evaluate": 1000}),
        num_classes=10,
        blocks=("b0", "b1", "b2"),
        block_latency_s=(1e-3, 1e-3, 1e-3),
        base_latency_s=3e-3,
        variants=tuple(
            VariantRecord(
                key=key,
                block=f"b{i}",
                block_index=i,
                variant="FC(8)",
                input_shape=(4,),
                lookup_latency_s=t,
                memory_bytes=1,
            )
            for i, (key, t) in enumerate((("a", 1e-4), ("b", 5e-4)))
        ),
    )
    for lookups, kept, mean_s in (("async", ["a", "b"], 2.0e-3), ("inline", ["a"], 2.1e-3)):
        composed = compose(manifest.model_copy(update={"lookups": lookups}), arrays, [0.99])
        default = composed.default_for(0.99)
        assert default is not None
        assert [e.key for e in default.exits] == kept, lookups
        assert default.evaluate.mean_latency_s == pytest.approx(mean_s)
        assert default.evaluate.agreement == 1.0


def one_exit(check_agrees: np.ndarray) -> tuple[list[Candidate], tuple[np.ndarray, np.ndarray], list[float]]:
    """One exit after block 0 of three (1 ms each, lookup free) over 1,000 calibrate rows whose scores spread
    evenly: every tune row (even positions) agrees, the check rows (odd) as `check_agrees` says."""
    scores = np.tile(np.linspace(0, 1, 500), (2, 1)).T.reshape(1, -1)  # each score once in each half
    agrees = np.ones((1, 1000), dtype=bool)
    agrees[0, 1::2] = check_agrees
    return [Candidate(exit=0, lookup_s=0.0, memory_bytes=1)], (scores, agrees), [1e-3, 1e-3, 1e-3]


def test_a_setting_only_the_tune_rows_support_is_not_deployed() -> None:
    # Tuned on rows that all agree, the exit takes every row; on the check rows the low half disagrees 1 in 10.
    low = np.arange(500) < 250
    candidates, cal, latency = one_exit(~(low & (np.arange(500) % 10 == 0)))
    found = certified_exits([(0,)], candidates, cal, latency, 0.99, inline=False)
    assert found.exits == [] and found.subset is None  # 25 of 500 wrong: p ≈ 1, and testing stops there
    assert found.check.agreement == 1.0


def test_the_fastest_certified_setting_is_deployed() -> None:
    candidates, cal, latency = one_exit(np.ones(500, dtype=bool))
    found = certified_exits([(0,)], candidates, cal, latency, 0.99, inline=False)
    assert found.subset == (0,) and found.exits == [(0, 0.0)]  # every row leaves after block 0
    assert found.check.agreement == 1.0 and found.check.mean_latency_s == pytest.approx(1e-3)
    # Three disagreements among the 500 check rows leave p = 0.26: not certified at 0.05, certified at 0.3.
    three = np.ones(500, dtype=bool)
    three[[0, 1, 2]] = False
    candidates, cal, latency = one_exit(three)
    assert certified_exits([(0,)], candidates, cal, latency, 0.99, inline=False).exits == []
    assert certified_exits([(0,)], candidates, cal, latency, 0.99, risk=0.3, inline=False).exits == [(0, 0.0)]


def test_an_exit_that_costs_more_than_its_hits_save_at_the_tuned_level_is_dropped() -> None:
    """Three 1 ms blocks; exit a after block 0 (lookup 0.1 ms) answers half the rows, exit b after block 1 (lookup
    0.1 ms) one in a hundred. The tuner keeps b, since each hit saves 1 ms; but inline, the 50% of rows reaching it
    wait 0.1 ms each, 0.05 ms a row against the 0.01 its hits save."""
    rows = np.arange(1000) % 100
    scores = np.array([np.where(rows < 50, 0.9, 0.1), np.where(rows == 50, 0.9, 0.1)])
    cal = scores, scores > 0.5  # every hit agrees, every low score would not
    candidates = [Candidate(exit=0, lookup_s=1e-4, memory_bytes=1), Candidate(exit=1, lookup_s=1e-4, memory_bytes=1)]
    latency = [1e-3, 1e-3, 1e-3]
    thresholds = tune_thresholds([0, 1], candidates, scores, cal[1], latency, 0.99, inline=True)
    assert all(math.isfinite(t) for t in thresholds)  # the tuner alone keeps both
    found = certified_exits([(0, 1)], candidates, cal, latency, 0.99, inline=True)
    assert [c for c, _ in found.exits] == [0]
    assert found.check.mean_latency_s == pytest.approx(0.5 * 1.1e-3 + 0.5 * 3.1e-3)
    assert found.check.agreement == 1.0
