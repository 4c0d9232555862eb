"""The least model-load time any eviction schedule can have on a request sequence: a limit no policy, online or
offline, passes, so a bar above it cannot be met on that sequence by any policy.

It is the linear-programming relaxation of generalized caching (objects of different sizes and load costs; Bar-Noy,
Bar-Yehuda, Freund, Naor and Schieber, "A unified approach to approximating resource allocation and scheduling",
JACM 2001), solved by HiGHS (`scipy.optimize.linprog`). Between two requests for the same model there is one
variable x in [0, 1], the share of it evicted in that interval, and the model is loaded again at its next request
when it was evicted: that costs x × load seconds. At each request the requested model must be resident, and the
models requested before and again after it that stay resident must fit beside it:

    size(requested) + Σ size(q) × (1 − x_q) ≤ budget      over the models q whose interval spans the request

A schedule a policy could follow (x = 1 where it evicted a model at any time in the interval) meets every such
constraint, so the minimum is at most any schedule's load time. Loads are on demand (no prefetch) and every model's
first request loads it, as in the server and `adaserve.cache.simulator`; a model with no later request may be
evicted for nothing. The bound is not always reachable: the relaxation may split a model, which no cache can.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
from scipy.optimize import linprog
from scipy.sparse import coo_matrix

from adaserve.cache.simulator import ModelFigures


def least_load_seconds(sequence: Sequence[str], models: Mapping[str, ModelFigures], budget_bytes: int) -> float:
    """The least total load time, in seconds, of any schedule that serves the models requested in `sequence`, in
    order, within `budget_bytes` (its LP relaxation; see the module docstring). ValueError if a model alone does
    not fit or the LP fails."""
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
        if over > 0:  # Σ size(q) × x_q ≥ over, written as ≤ for linprog
            for variable in spanning:
                rows.append(len(bounds))
                columns.append(variable)
                sizes.append(-models[intervals[variable][0]].size_bytes)
            bounds.append(-over)
        spanning.update(starting.get(index, ()))
    if not bounds:
        return first_loads  # everything fits: only the first loads
    costs = np.array([models[name].load_s for name, _, _ in intervals])
    matrix = coo_matrix((np.array(sizes, float), (rows, columns)), shape=(len(bounds), len(intervals))).tocsr()
    result = linprog(costs, A_ub=matrix, b_ub=np.array(bounds, float), bounds=(0, 1), method="highs")
    if result.status != 0:
        raise ValueError(f"the load-time bound's linear program failed: {result.message}")
    return first_loads + float(result.fun)
