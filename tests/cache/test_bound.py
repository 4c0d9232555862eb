"""The least load time any eviction schedule can have: exact where the optimum is known, and never above what a
policy achieves in the simulator."""

from __future__ import annotations

import random

import pytest

from adaserve.cache.bound import least_load_seconds
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


def test_when_every_model_fits_only_the_first_loads_count() -> None:
    models = {"a": ModelFigures(3, 2.0, 0.1), "b": ModelFigures(4, 0.5, 0.1)}
    assert least_load_seconds(["a", "b", "a", "a", "b"], models, 7) == pytest.approx(2.5)


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
