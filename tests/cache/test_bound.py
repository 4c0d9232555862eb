"""The least load time any eviction schedule can have: exact where the optimum is known, and never above what a
policy achieves in the simulator."""

from __future__ import annotations

import itertools
import random

import pytest

from adaserve.cache.bound import least_load_seconds, optimal_load_seconds, schedule_problem
from adaserve.cache.policies import POLICIES
from adaserve.cache.simulator import ModelFigures, simulate
from adaserve.cache.workload import Request


def belady_loads(sequence: list[str], capacity: int) -> int:
    """Loads of Belady's MIN with `capacity` slots: on a miss with a full cache, evict what is used farthest ahead
    (optimal for objects of one size and one cost)."""
    cache: set[str] = set()
    loads = 0
    for index, name in enumerate(sequence):
        if name in cache:
            continue
        loads += 1
        if len(cache) == capacity:
            later = sequence[index + 1 :]
            cache.remove(max(sorted(cache), key=lambda o: later.index(o) if o in later else len(sequence)))
        cache.add(name)
    return loads


@pytest.mark.parametrize("seed", range(8))
def test_with_one_size_and_one_cost_the_bound_is_beladys_optimum(seed: int) -> None:
    """Paging's LP has an interval constraint matrix, so its optimum is integral: Belady's miss count exactly."""
    rng = random.Random(seed)
    names = [f"m{i}" for i in range(rng.randint(3, 7))]
    sequence = [rng.choice(names) for _ in range(rng.randint(20, 60))]
    capacity = rng.randint(1, len(names) - 1)
    models = {name: ModelFigures(size_bytes=1, load_s=1.0, exec_s=0.1) for name in names}
    assert least_load_seconds(sequence, models, capacity) == pytest.approx(belady_loads(sequence, capacity))


def brute_force_load_seconds(sequence: list[str], models: dict[str, ModelFigures], budget: int) -> float:
    """The least load time over every eviction schedule: after each request, keep any subset of the resident models
    and the requested one (which must stay) that fits. Every schedule passes through these states, so the least over
    all of them, step by step, is the optimum."""
    best: dict[frozenset[str], float] = {frozenset(): 0.0}
    for name in sequence:
        following: dict[frozenset[str], float] = {}
        for resident, cost in best.items():
            paid = cost + (0.0 if name in resident else models[name].load_s)
            others = sorted(resident - {name})
            for count in range(len(others) + 1):
                for kept in itertools.combinations(others, count):
                    after = frozenset((*kept, name))
                    if sum(models[m].size_bytes for m in after) <= budget and paid < following.get(after, float("inf")):
                        following[after] = paid
        best = following
    return min(best.values())


@pytest.mark.parametrize("seed", range(30))
def test_the_integer_program_is_the_optimum_over_every_schedule_and_the_lp_is_below_it(seed: int) -> None:
    rng = random.Random(seed)
    models = {
        f"m{i}": ModelFigures(size_bytes=rng.randint(1, 10), load_s=rng.uniform(0.1, 3.0), exec_s=0.01)
        for i in range(rng.randint(3, 4))
    }
    sequence = rng.choices(list(models), k=rng.randint(8, 12))
    budget = rng.randint(max(m.size_bytes for m in models.values()), sum(m.size_bytes for m in models.values()))
    exact = brute_force_load_seconds(sequence, models, budget)
    optimum = optimal_load_seconds(sequence, models, budget)
    assert optimum.optimal and optimum.load_s == pytest.approx(exact) and optimum.bound_s == pytest.approx(exact)
    assert least_load_seconds(sequence, models, budget) <= exact + 1e-9


def test_the_integer_program_does_not_split_a_model_where_the_lp_does() -> None:
    """Three 2-byte models in 3 bytes, asked in turn: the LP evicts half of two, the integer program one whole."""
    models = {name: ModelFigures(2, 1.0, 0.01) for name in "abc"}
    sequence = list("abcabc")
    assert least_load_seconds(sequence, models, 3) == pytest.approx(5.0)
    assert optimal_load_seconds(sequence, models, 3).load_s == pytest.approx(6.0)
    assert brute_force_load_seconds(sequence, models, 3) == pytest.approx(6.0)


def test_the_integer_program_stops_at_its_time_limit_with_a_schedule_and_a_bound() -> None:
    rng = random.Random(7)
    models = {f"m{i}": ModelFigures(rng.randint(10, 100), rng.uniform(0.1, 3.0), 0.01) for i in range(12)}
    sequence = rng.choices(list(models), k=3000)
    budget = sum(m.size_bytes for m in models.values()) // 2
    optimum = optimal_load_seconds(sequence, models, budget, time_limit_s=0.5)
    assert optimum.bound_s <= optimum.load_s + 1e-6
    assert least_load_seconds(sequence, models, budget) <= optimum.load_s + 1e-6


def test_when_every_model_fits_only_the_first_loads_count() -> None:
    models = {"a": ModelFigures(3, 2.0, 0.1), "b": ModelFigures(4, 0.5, 0.1)}
    assert least_load_seconds(["a", "b", "a", "a", "b"], models, 7) == pytest.approx(2.5)
    assert optimal_load_seconds(["a", "b", "a", "a", "b"], models, 7).load_s == pytest.approx(2.5)


def test_a_model_larger_than_the_budget_is_refused() -> None:
    with pytest.raises(ValueError, match="model 'a' alone is larger than the budget of 2 bytes"):
        least_load_seconds(["a"], {"a": ModelFigures(3, 1.0, 0.1)}, 2)


@pytest.mark.parametrize("seed", range(5))
def test_no_policy_loads_for_less_time_than_the_bound(seed: int) -> None:
    """Models of different sizes and load times, every policy the simulator has (the oracle's included)."""
    rng = random.Random(seed)
    models = {
        f"m{i}": ModelFigures(size_bytes=rng.randint(10, 100), load_s=rng.uniform(0.1, 3.0), exec_s=0.01)
        for i in range(6)
    }
    weights = [rng.random() ** 2 for _ in models]
    sequence = rng.choices(list(models), weights=weights, k=200)
    budget = int(sum(m.size_bytes for m in models.values()) * rng.uniform(0.35, 0.75))
    budget = max(budget, max(m.size_bytes for m in models.values()))
    bound = least_load_seconds(sequence, models, budget)
    requests = [Request(float(i), name) for i, name in enumerate(sequence)]
    for policy in POLICIES:
        assert bound <= simulate(requests, models, budget, policy, clients=1).loading_s + 1e-9, policy


def test_a_search_that_finds_no_schedule_in_time_answers_evicting_everywhere_and_the_relaxation() -> None:
    """On a busy machine the search may find no schedule within its limit: the answer is still a schedule and a
    bound, not an error."""
    rng = random.Random(7)
    models = {f"m{i}": ModelFigures(rng.randint(10, 100), rng.uniform(0.1, 3.0), 0.01) for i in range(12)}
    sequence = rng.choices(list(models), k=3000)
    problem = schedule_problem(sequence, models, sum(m.size_bytes for m in models.values()) // 2)
    optimum = problem.optimum(time_limit_s=1e-9)
    assert not optimum.optimal
    assert optimum.load_s == pytest.approx(problem.first_loads_s + problem.costs.sum())
    assert optimum.bound_s == pytest.approx(problem.relaxed_s())
