"""The least model-load time any eviction schedule can have on a request sequence: a limit no policy, online or
offline, passes, so a bar above it cannot be met on that sequence by any policy. Two answers to one problem:
`least_load_seconds`, its linear-programming relaxation (fast, a lower bound), and `optimal_load_seconds`, the
same program with x integral (`scipy.optimize.milp`): the exact optimum, or within a time limit the best schedule
found and a proven bound.

The relaxation is that of generalized caching (objects of different sizes and load costs; Bar-Noy, Bar-Yehuda,
Freund, Naor and Schieber, "A unified approach to approximating resource allocation and scheduling", JACM 2001),
solved by HiGHS (`scipy.optimize.linprog`). Between two requests for the same model there is one
variable x in [0, 1], the share of it evicted in that interval, and the model is loaded again at its next request
when it was evicted: that costs x × load seconds. At each request the requested model must be resident, and the
models requested before and again after it that stay resident must fit beside it:

    size(requested) + Σ size(q) × (1 − x_q) ≤ budget      over the models q whose interval spans the request

A schedule a policy could follow (x = 1 where it evicted a model at any time in the interval) meets every such
constraint, so the minimum is at most any schedule's load time. Loads are on demand (no prefetch) and every model's
first request loads it, as in the server and `adaserve.cache.simulator`; a model with no later request may be
evicted for nothing. The relaxation is not always reachable: it may split a model, which no cache can. With x in
{0, 1} every solution is a schedule (evict at the interval's start what is evicted at all in it), so the integer
program's optimum is the least load time exactly; generalized caching is NP-hard, hence the time limit.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, linprog, milp
from scipy.sparse import coo_matrix, csr_matrix

from adaserve.cache.simulator import ModelFigures

#: How long `optimal_load_seconds` searches before it settles for the best schedule found.
DEFAULT_TIME_LIMIT_S = 60.0


@dataclass(frozen=True)
class Problem:
    """The schedule problem as a linear program: minimise first_loads_s + costs · x subject to matrix · x ≤ bounds,
    0 ≤ x ≤ 1, one x per interval between two requests for a model (None for matrix when everything fits)."""

    first_loads_s: float
    costs: np.ndarray
    matrix: csr_matrix | None
    bounds: np.ndarray

    def relaxed_s(self) -> float:
        """The LP relaxation's least load time: a lower bound. ValueError if the LP fails."""
        if self.matrix is None:
            return self.first_loads_s  # everything fits: only the first loads
        result = linprog(self.costs, A_ub=self.matrix, b_ub=self.bounds, bounds=(0, 1), method="highs")
        if result.status != 0:
            raise ValueError(f"the load-time bound's linear program failed: {result.message}")
        return self.first_loads_s + float(result.fun)

    def optimum(self, time_limit_s: float = DEFAULT_TIME_LIMIT_S) -> Optimum:
        """The integer program's least load time, searched for at most `time_limit_s`. Where the search found no
        schedule in time (a busy machine), the one that evicts in every interval (x = 1, always feasible) and the
        relaxation's bound."""
        if self.matrix is None:
            return Optimum(self.first_loads_s, self.first_loads_s, optimal=True)
        result = milp(
            self.costs,
            integrality=np.ones(len(self.costs)),
            bounds=Bounds(0, 1),
            constraints=LinearConstraint(self.matrix, -np.inf, self.bounds),
            options={"time_limit": time_limit_s},
        )
        if result.x is None:
            return Optimum(self.first_loads_s + float(self.costs.sum()), self.relaxed_s(), optimal=False)
        best = self.first_loads_s + float(result.fun)
        bound = self.first_loads_s + float(getattr(result, "mip_dual_bound", result.fun))
        return Optimum(best, min(bound, best), optimal=result.status == 0)


@dataclass(frozen=True)
class Optimum:
    """The integer program's answer: the load time of the best schedule found, the least any schedule can have
    (equal to it when `optimal`), and whether the search proved it optimal within its time limit."""

    load_s: float
    bound_s: float
    optimal: bool


def schedule_problem(sequence: Sequence[str], models: Mapping[str, ModelFigures], budget_bytes: int) -> Problem:
    """The constraint matrix of the module docstring for the models requested in `sequence` under `budget_bytes`.
    ValueError if a model alone does not fit."""
    too_large = sorted({name for name in sequence if models[name].size_bytes > budget_bytes})
    if too_large:
        raise ValueError(f"model '{too_large[0]}' alone is larger than the budget of {budget_bytes} bytes")
    intervals: list[tuple[str, int, int]] = []  # (model, request it follows, request it precedes)
    previous: dict[str, int] = {}
    for index, name in enumerate(sequence):
        if name in previous:
            intervals.append((name, previous[name], index))
        previous[name] = index
    first_loads = sum(models[name].load_s for name in previous)
    starting: dict[int, list[int]] = {}
    ending: dict[int, list[int]] = {}
    for variable, (_, start, end) in enumerate(intervals):
        starting.setdefault(start, []).append(variable)
        ending.setdefault(end, []).append(variable)
    rows: list[int] = []
    columns: list[int] = []
    sizes: list[int] = []
    bounds: list[int] = []
    spanning: set[int] = set()
    for index, name in enumerate(sequence):
        spanning.difference_update(ending.get(index, ()))  # the requested model's own interval ends here
        over = models[name].size_bytes + sum(models[intervals[v][0]].size_bytes for v in spanning) - budget_bytes
        if over > 0:  # Σ size(q) × x_q ≥ over, written as ≤
            for variable in spanning:
                rows.append(len(bounds))
                columns.append(variable)
                sizes.append(-models[intervals[variable][0]].size_bytes)
            bounds.append(-over)
        spanning.update(starting.get(index, ()))
    costs = np.array([models[name].load_s for name, _, _ in intervals])
    if not bounds:
        return Problem(first_loads, costs, None, np.zeros(0))
    matrix = coo_matrix((np.array(sizes, float), (rows, columns)), shape=(len(bounds), len(intervals))).tocsr()
    return Problem(first_loads, costs, matrix, np.array(bounds, float))


def least_load_seconds(sequence: Sequence[str], models: Mapping[str, ModelFigures], budget_bytes: int) -> float:
    """A lower bound on the total load time, in seconds, of any schedule that serves the models requested in
    `sequence`, in order, within `budget_bytes` (the LP relaxation; see the module docstring). ValueError if a model
    alone does not fit or the LP fails."""
    return schedule_problem(sequence, models, budget_bytes).relaxed_s()


def optimal_load_seconds(
    sequence: Sequence[str],
    models: Mapping[str, ModelFigures],
    budget_bytes: int,
    time_limit_s: float = DEFAULT_TIME_LIMIT_S,
) -> Optimum:
    """The least total load time of any schedule (the integer program; see the module docstring), searched for at
    most `time_limit_s`. ValueError if a model alone does not fit."""
    return schedule_problem(sequence, models, budget_bytes).optimum(time_limit_s)
