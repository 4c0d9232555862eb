"""Packrat's DP against brute-force enumeration, the paper's appendix B shapes, and the plan's invariants."""

from __future__ import annotations

import math
import random

import pytest

from adaserve.cpu.optimizer import InfeasiblePlanError, Optimizer, Profile, fat_instance_plan


def random_profile(rng: random.Random, max_threads: int, batches: list[int]) -> Profile:
    """Latencies with diminishing returns in t and noise, so optima are mixed and ties rare but possible."""
    latency = {}
    for t in range(1, max_threads + 1):
        for b in batches:
            latency[t, b] = round(b ** rng.uniform(0.6, 1.0) / t ** rng.uniform(0.3, 0.9) + rng.uniform(0, 0.5), 2)
    return Profile(latency)


def brute_force(profile: Profile, threads: int, batch: int) -> float:
    """Every multiset of profiled cells with Σt ≤ T and Σb = B; the smallest max latency (inf if none)."""
    items = sorted(profile.latency_s.items())
    best = math.inf

    def search(start: int, t_left: int, b_left: int, worst: float) -> None:
        nonlocal best
        if b_left == 0:
            best = min(best, worst)
            return
        for index in range(start, len(items)):
            (t, b), value = items[index]
            if t <= t_left and b <= b_left:
                search(index, t_left - t, b_left - b, max(worst, value))

    search(0, threads, batch, 0.0)
    return best


def check_structure(profile: Profile, threads: int, batch: int) -> None:
    plan = Optimizer(profile).plan(threads, batch)
    assert plan.threads_used <= threads
    assert sum(i.count * i.batch for i in plan.instances) == batch
    assert plan.latency_s == max(i.latency_s for i in plan.instances)
    for instance in plan.instances:
        if instance.source == "profiled":
            assert profile.latency_s[instance.threads, instance.batch] == instance.latency_s
    if (threads, batch) in profile.latency_s:
        assert plan.latency_s <= profile.latency_s[threads, batch]
        assert plan.fat_latency_s == profile.latency_s[threads, batch]
        assert plan.speedup is not None and plan.speedup >= 1.0


@pytest.mark.parametrize("seed", range(60))
def test_matches_brute_force_on_small_random_profiles(seed: int) -> None:
    rng = random.Random(seed)
    max_threads = rng.randint(1, 4)
    batches = sorted(rng.sample([1, 2, 3, 4, 5, 8], rng.randint(1, 4)))
    profile = random_profile(rng, max_threads, batches)
    optimizer = Optimizer(profile)
    for threads in range(1, 5):
        for batch in range(1, 9):
            expected = brute_force(profile, threads, batch)
            if math.isinf(expected):
                continue  # tested below: the plan then relies on interpolated cells or is refused
            plan = optimizer.plan(threads, batch)
            assert plan.latency_s == expected, (threads, batch, plan.triples)
            assert not plan.estimated
            check_structure(profile, threads, batch)


def test_powers_of_two_profile_covers_every_batch_up_to_the_largest_given_enough_threads() -> None:
    rng = random.Random(7)
    profile = random_profile(rng, 4, [1, 2, 4, 8])
    for batch in range(1, 9):
        plan = Optimizer(profile).plan(4, batch)
        assert sum(i.count * i.batch for i in plan.instances) == batch
        assert plan.latency_s == brute_force(profile, 4, batch)


def test_non_uniform_plan_appendix_b_t14() -> None:
    """Appendix B, Table 2 (BERT): on T = 14 the optimizer mixes worker shapes, e.g. B = 16 → ⟨1,6,8⟩ + ⟨2,4,4⟩.

    The paper gives configurations, not the latencies behind them; this profile is built so that the same
    shapes are optimal (a worker with 6 threads on 8 rows takes as long as one with 4 threads on 4 rows).
    """
    latency = {(t, b): b / t**0.8 for t in range(1, 15) for b in (1, 2, 4, 8, 16)}
    latency[6, 8] = latency[4, 4] = 1.0
    for (t, b), value in list(latency.items()):
        if (t, b) not in ((6, 8), (4, 4)):
            latency[t, b] = max(value, 1.0 + 0.01 * (t + b))  # nothing else beats 1.0
    profile = Profile(latency)
    plan = Optimizer(profile).plan(14, 16)
    assert plan.latency_s == 1.0
    assert sorted(plan.triples) == [(1, 6, 8), (2, 4, 4)]
    assert plan.threads_used == 14
    assert plan.speedup is not None and plan.speedup > 1


def test_uniform_plan_when_t_and_b_are_powers_of_two() -> None:
    """Table 2, T = 16: ⟨4, 4, 4⟩ for B = 16 when four 4-thread workers on 4 rows are the fastest split."""
    latency = {(t, b): b / t**0.5 + 0.3 * t for t in range(1, 17) for b in (1, 2, 4, 8, 16)}
    profile = Profile(latency)
    plan = Optimizer(profile).plan(16, 16)
    assert plan.latency_s == brute_force_table(profile, 16, 16)
    check_structure(profile, 16, 16)


def brute_force_table(profile: Profile, threads: int, batch: int) -> float:
    """A plain Python version of the paper's recurrence, as a second opinion where enumeration is too slow."""
    opt = [[0.0] + [math.inf] * batch for _ in range(threads + 1)]
    for t in range(1, threads + 1):
        for b in range(1, batch + 1):
            for (tp, bp), value in profile.latency_s.items():
                if tp <= t and bp <= b:
                    opt[t][b] = min(opt[t][b], max(opt[t - tp][b - bp], value))
    return opt[threads][batch]


@pytest.mark.parametrize("seed", range(5))
def test_matches_the_recurrence_on_larger_tables(seed: int) -> None:
    rng = random.Random(100 + seed)
    profile = random_profile(rng, 8, [1, 2, 4, 8, 16])
    optimizer = Optimizer(profile)
    for batch in (3, 16, 24, 40):
        assert optimizer.plan(8, batch).latency_s == brute_force_table(profile, 8, batch)
        check_structure(profile, 8, batch)


def test_batch_not_profiled_is_built_from_profiled_pieces() -> None:
    profile = Profile({(t, b): b / t + 0.1 for t in (1, 2, 3, 4) for b in (1, 2, 4, 8)})
    plan = Optimizer(profile).plan(4, 12)
    assert sum(i.count * i.batch for i in plan.instances) == 12
    assert not plan.estimated and not plan.notes
    assert plan.fat_latency_s is not None
    assert "extrapolated" in plan.fat_source  # ⟨1, 4, 12⟩ lies beyond the largest profiled b = 8


def test_fat_instance_interpolated_between_profiled_batches() -> None:
    profile = Profile({(2, 4): 1.0, (2, 8): 2.0, (1, 4): 1.5, (1, 8): 3.0})
    plan = Optimizer(profile).plan(2, 6)
    assert plan.fat_latency_s == pytest.approx(1.5)
    assert plan.fat_source == "interpolated between b=4 and b=8 at t=2"


def test_interpolated_cells_only_when_profiled_ones_cannot_make_b() -> None:
    """B = 7 on two threads from b ∈ {1, 2, 4, 8} needs three workers; interpolated b = 7 or 3 + 4 fit."""
    profile = Profile({(t, b): b / t + 0.1 for t in (1, 2) for b in (1, 2, 4, 8)})
    plan = Optimizer(profile).plan(2, 7)
    assert plan.estimated
    assert plan.notes and "interpolated" in plan.notes[0]
    assert sum(i.count * i.batch for i in plan.instances) == 7
    assert plan.threads_used <= 2


def test_too_many_rows_for_the_threads_is_refused() -> None:
    profile = Profile({(1, 1): 1.0, (1, 2): 1.5, (2, 2): 1.0})
    with pytest.raises(InfeasiblePlanError, match="at most 4 rows"):
        Optimizer(profile).plan(2, 5)
    with pytest.raises(InfeasiblePlanError, match="≥ 1"):
        Optimizer(profile).plan(0, 1)


def test_more_threads_than_profiled_uses_several_workers_and_has_no_fat_latency() -> None:
    profile = Profile({(1, 1): 1.0, (1, 2): 1.8, (2, 2): 1.0, (2, 4): 1.9})
    plan = Optimizer(profile).plan(4, 4)
    assert plan.latency_s == 1.0
    assert plan.triples == [(2, 2, 2)]
    assert plan.fat_latency_s is None and "not profiled" in plan.fat_source
    assert plan.speedup is None


def test_ties_use_every_thread_then_the_fastest_workers() -> None:
    """Every plan below takes 2.0 (the ⟨3, 4⟩ worker or a ⟨1, 2⟩ sets the pace); the one chosen uses all five
    threads and gives the spare two to the b = 2 worker instead of two slower single-thread workers."""
    profile = Profile({(3, 4): 2.0, (1, 1): 1.0, (2, 2): 0.5, (1, 2): 2.0})
    plan = Optimizer(profile).plan(5, 6)
    assert plan.latency_s == 2.0 == brute_force(profile, 5, 6)
    assert sorted(plan.triples) == [(1, 2, 2), (1, 3, 4)]


def test_plans_are_cached_and_tables_grow() -> None:
    rng = random.Random(3)
    profile = random_profile(rng, 4, [1, 2, 4])
    optimizer = Optimizer(profile)
    first = optimizer.plan(4, 8)
    assert optimizer.plan(4, 8) is first
    assert optimizer.cached == 1
    assert optimizer.plan(4, 16).latency_s == brute_force_table(profile, 4, 16)
    assert optimizer.plan(4, 3).latency_s == brute_force(profile, 4, 3)


def test_a_large_table_plans_within_its_threads_and_batch() -> None:
    """T = 64, B = 256 over a 64 × 9 profile (576 items, 16k states); how long it takes is no test's business on
    a machine that may be busy (it took 63 s once beside a full suite on 2 cores)."""
    rng = random.Random(11)
    profile = random_profile(rng, 64, [1 << k for k in range(9)])
    plan = Optimizer(profile).plan(64, 256)
    assert plan.threads_used <= 64
    assert sum(i.count * i.batch for i in plan.instances) == 256


def test_instances_grouped_and_ordered() -> None:
    profile = Profile({(1, 1): 1.0})
    plan = Optimizer(profile).plan(3, 3)
    assert plan.triples == [(3, 1, 1)]
    assert plan.workers == 3


def test_fat_instance_plan_without_profile() -> None:
    plan = fat_instance_plan(None, 4, 8, "no profile")
    assert plan.triples == [(1, 4, 8)]
    assert math.isnan(plan.latency_s)
    assert plan.fat_latency_s is None and plan.speedup is None
    assert plan.notes == ("no profile",)


@pytest.mark.parametrize(
    ("latency", "message"),
    [
        ({}, "at least one"),
        ({(0, 1): 1.0}, "must be ≥ 1"),
        ({(1, 1): -1.0}, "positive"),
        ({(1, 1): math.nan}, "positive"),
    ],
)
def test_bad_profiles_are_refused(latency: dict[tuple[int, int], float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Profile(latency)
