"""The query planner on models faked in-process: which model each node runs, on which rows, and how the time an
early node saves moves a later node to a more accurate model (incremental replanning) where a static plan does not."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest

from adaserve.adaptive.parameters import latency_target_ms
from adaserve.errors import InferenceError, InvalidInputError
from adaserve.planner.latency import LatencyBook
from adaserve.planner.planner import SPENT_BUDGET_MS, ModelAnswer, QueryPlanner
from adaserve.planner.spec import DagConfig
from tests.planner.dags import chain, fork


class Models:
    """Fake models: each doubles its input after `sleep_s[model]`; `exits` makes the base answer at once with an
    `exited_rows` parameter, as a learned-cache hit does. Records every call."""

    def __init__(self, sleep_s: dict[str, float], exits: bool = False) -> None:
        self.sleep_s = sleep_s
        self.exits = exits
        self.calls: list[tuple[str, int, dict[str, Any]]] = []

    async def __call__(
        self, model: str, inputs: dict[str, np.ndarray], rows: int, parameters: dict[str, Any]
    ) -> ModelAnswer:
        self.calls.append((model, rows, parameters))
        exited = self.exits and model == "base" and parameters.get("early_exit") is not False
        await asyncio.sleep(0 if exited else self.sleep_s.get(model, 0))
        x = next(iter(inputs.values())) if len(inputs) == 1 else sum(inputs.values())
        return ModelAnswer({"y": x * 2}, {"exited_rows": rows} if exited else {})


def planner_with(config: DagConfig, models: Models, latency_ms: dict[str, float]) -> QueryPlanner:
    """A planner whose book already holds these whole-run latencies (as probes would have measured)."""
    planner = QueryPlanner(config, models)
    for model, ms in latency_ms.items():
        for _ in range(3):
            planner.book.observe(model, 1, ms)
    return planner


ROWS = np.array([[1, 0, 0, 0], [0, 1, 0, 0]], np.float32)  # row 0's class is 0: refine runs on it alone
LATENCY = {"base": 100.0, "small": 50.0, "large": 150.0}


def run(planner: QueryPlanner, x: np.ndarray, parameters: dict[str, Any]):  # type: ignore[no-untyped-def]
    return asyncio.run(planner.run({"x": x}, len(x), parameters))


def test_a_conditional_node_runs_on_its_rows_and_each_row_takes_the_first_source_that_ran() -> None:
    models = Models({})
    answer = run(planner_with(chain(), models, LATENCY), ROWS, {})
    # no SLO: the most accurate option everywhere
    assert [(model, rows) for model, rows, _ in models.calls] == [("base", 2), ("large", 1)]
    assert answer.outputs[0].tolist() == [[4, 0, 0, 0], [0, 2, 0, 0]]  # refine doubled row 0 again
    assert answer.parameters["dag_plan"] == "classify=base,refine=large"

    models.calls.clear()
    answer = run(planner_with(chain(), models, LATENCY), ROWS[1:], {})
    assert [model for model, _, _ in models.calls] == ["base"]
    assert answer.parameters["dag_plan"] == "classify=base,refine=skipped"
    assert answer.outputs[0].tolist() == [[0, 2, 0, 0]]


def test_replanning_gives_the_time_an_early_exit_saved_to_the_next_node() -> None:
    config = chain(budget_policy="equal")
    # SLO 200 ms split equally: 100 each, where large (150) does not fit and small (50) does.
    static = Models({"base": 0.0}, exits=True)
    run(planner_with(chain(budget_policy="equal", replan=False), static, LATENCY), ROWS[:1], {"latency_ms": 200})
    assert [model for model, _, _ in static.calls] == ["base", "small"]

    replanned = Models({"base": 0.0}, exits=True)
    planner = planner_with(config, replanned, LATENCY)
    answer = run(planner, ROWS[:1], {"latency_ms": 200})
    assert [model for model, _, _ in replanned.calls] == ["base", "large"]  # ~195 ms were left for refine
    assert planner.stats.upgraded == 1
    assert answer.choices["refine"].budget_ms is not None and answer.choices["refine"].budget_ms > 150
    assert replanned.calls[1][2]["latency_ms"] == answer.choices["refine"].budget_ms  # its budget travels with it
    assert answer.parameters["latency_budget_ms"] == 200 and answer.parameters["classify.exited_rows"] == 1

    whole = Models({"base": 0.1})  # no exit: base takes its 100 ms and the rest only fits small
    run(planner_with(config, whole, LATENCY), ROWS[:1], {"latency_ms": 200})
    assert [model for model, _, _ in whole.calls] == ["base", "small"]


def test_when_no_option_fits_the_fastest_runs_and_a_late_answer_counts_as_a_missed_slo() -> None:
    models = Models({"base": 0.02})
    planner = planner_with(chain(), models, LATENCY)
    answer = run(planner, ROWS[:1], {"latency_ms": 10})
    assert [model for model, _, _ in models.calls] == ["base", "small"]
    assert answer.choices["refine"].estimate_ms == 50.0
    assert planner.stats.slo_missed == 1 and planner.stats.success.count == 1


def test_a_budget_spent_before_a_node_runs_asks_it_for_its_fastest_answer_not_a_negative_target() -> None:
    """A 0.5 ms SLO over two nodes: the second node's budget was spent (negative) when it ran, and its request
    carried that as `latency_ms`, which the model refused as the client's error (13 of 40 queries failed with a
    400). It now runs the fastest option with a target nothing meets, and the query counts as a missed SLO."""
    models = Models({"base": 0.005})
    planner = planner_with(chain(), models, LATENCY)
    answer = run(planner, ROWS[:1], {"latency_ms": 0.5})
    assert [model for model, _, _ in models.calls] == ["base", "small"]
    assert answer.choices["refine"].budget_ms is not None and answer.choices["refine"].budget_ms < 0
    assert [parameters["latency_ms"] for _, _, parameters in models.calls][1] == SPENT_BUDGET_MS
    assert latency_target_ms(models.calls[1][2]) == SPENT_BUDGET_MS  # what the node's model reads: no 400
    assert planner.stats.slo_missed == 1 and planner.stats.success.count == 1


def test_the_book_keeps_whole_runs_only_and_prices_unseen_batches_per_row() -> None:
    models = Models({}, exits=True)
    planner = planner_with(chain(), models, {"small": 50.0, "large": 150.0})
    run(planner, ROWS, {})
    assert planner.book.estimate_ms("base", 2) is None  # every base row exited: not a whole run
    assert planner.book.estimate_ms("large", 1) is not None  # ran whole on one row
    assert planner.book.estimate_ms("small", 4) == pytest.approx(200.0)


def test_the_branches_of_a_fork_run_at_once() -> None:
    models = Models({"m": 0.2})
    planner = planner_with(fork(), models, {"m": 1.0, "join": 1.0})
    began = asyncio.run(_timed(planner))
    assert began < 0.55  # a, then b and c together, then d: three steps of 0.2 s, not four
    assert sorted(model for model, _, _ in models.calls) == ["join", "m", "m", "m"]


async def _timed(planner: QueryPlanner) -> float:
    loop = asyncio.get_running_loop()
    start = loop.time()
    answer = await planner.run({"x": ROWS}, 2, {})
    assert answer.outputs[0].tolist() == (ROWS * 16).tolist()  # a doubles; b and c double; d sums the two
    assert answer.parameters["dag_plan"] == "a=m,b=m,c=m,d=join"  # the config's order, whichever branch ran first
    return loop.time() - start


def test_a_failing_node_fails_the_query_and_is_counted() -> None:
    async def broken(model: str, inputs: dict[str, np.ndarray], rows: int, parameters: dict[str, Any]) -> ModelAnswer:
        raise InferenceError(f"model '{model}' raised")

    planner = QueryPlanner(chain(), broken)
    with pytest.raises(InferenceError, match="model 'base' raised"):
        run(planner, ROWS, {})
    assert planner.stats.fail.count == 1


@pytest.mark.parametrize("value", [0, -5, "fast", True])
def test_a_bad_latency_target_is_refused(value: object) -> None:
    with pytest.raises(InvalidInputError, match="parameter 'latency_ms' must be a"):
        run(QueryPlanner(chain(), Models({})), ROWS, {"latency_ms": value})


def test_probes_time_every_option_on_whole_runs() -> None:
    models = Models({}, exits=True)
    planner = QueryPlanner(chain(probes=2), models)
    spec = chain().inputs
    asyncio.run(planner.probe({"base": spec, "small": spec}))
    assert [(model, parameters) for model, _, parameters in models.calls] == [
        ("base", {"early_exit": False}),
        ("base", {"early_exit": False}),
        ("small", {"early_exit": False}),
        ("small", {"early_exit": False}),
    ]
    assert planner.book.estimate_ms("base", 1) is not None


def test_an_option_left_untimed_at_load_is_timed_once_a_request_finds_it_servable() -> None:
    """As a cluster node loads a query: only `base` is timed at load; `large`, held nowhere, is passed over and not
    timed (that would place it); once held, the request that finds it so has it timed in the background, and a
    budget picks it only then."""
    models = Models({"large": 0.05})  # timed after the request that found it held has planned its nodes
    planner = QueryPlanner(chain(probes=2), models, lambda model: None if model == "large" else 0.0)
    spec = chain().inputs
    asyncio.run(planner.probe({"base": spec, "small": spec, "large": spec}, now=["base"]))
    assert [model for model, _, _ in models.calls] == ["base", "base"]

    async def query() -> list[str]:
        models.calls.clear()
        await planner.run({"x": ROWS[:1]}, 1, {"latency_ms": 1e6})
        await asyncio.gather(*planner._timing)  # the timing the request started
        return sorted(model for model, _, _ in models.calls)

    assert asyncio.run(query()) == ["base", "small", "small", "small"]  # small, untimed, runs and is timed
    planner.start_delay_s = lambda model: 0.0  # large is placed
    assert asyncio.run(query()) == ["base", "large", "large", "small"]  # large, untimed, not picked by a budget
    assert asyncio.run(query()) == ["base", "large"]


def test_the_planning_latency_is_a_quantile_of_the_recent_whole_runs() -> None:
    book = LatencyBook(quantile=0.5, window=3)
    assert book.estimate_ms("m", 1) is None
    for ms in (1.0, 2.0, 3.0):
        book.observe("m", 1, ms)
    assert book.estimate_ms("m", 1) == 2.0
    book.observe("m", 1, 10.0)  # the window keeps the newest three: 2, 3, 10
    assert book.estimate_ms("m", 1) == 3.0
    assert book.estimate_ms("m", 2) == 6.0  # no run of two rows yet: twice one row's
    book.observe("m", 2, 4.0)
    assert book.estimate_ms("m", 2) == 4.0


def test_the_book_matches_numpys_quantile_as_its_window_slides() -> None:
    rng = np.random.default_rng(0)
    book = LatencyBook(quantile=0.95, window=50)
    seen: list[float] = []
    for value in rng.exponential(2.0, 400).tolist():
        book.observe("m", 1, value)
        seen.append(value)
        assert book.estimate_ms("m", 1) == pytest.approx(float(np.quantile(seen[-50:], 0.95)))


def test_an_option_that_cannot_serve_now_is_passed_over_and_one_to_load_first_pays_its_load() -> None:
    unavailable = Models({})
    planner = planner_with(chain(), unavailable, LATENCY)
    planner.start_delay_s = lambda model: None if model == "large" else 0.0  # large: unloaded, no cache to load it
    run(planner, ROWS[:1], {})
    assert [model for model, _, _ in unavailable.calls] == ["base", "small"]

    to_load = Models({})
    planner = planner_with(chain(), to_load, LATENCY)
    planner.start_delay_s = lambda model: 1.0 if model == "large" else 0.0  # large: evicted, loads in about 1 s
    run(planner, ROWS[:1], {"latency_ms": 600})  # 150 ms of run would fit its share; 1,150 with the load does not
    run(planner, ROWS[:1], {})  # no SLO: the most accurate, loaded on demand
    assert [model for model, _, _ in to_load.calls] == ["base", "small", "base", "large"]

    nothing = Models({})
    planner = planner_with(chain(), nothing, LATENCY)
    planner.start_delay_s = lambda model: None  # nothing can serve: plan as if all could, the engine says why
    run(planner, ROWS[:1], {})
    assert [model for model, _, _ in nothing.calls] == ["base", "large"]
