"""GATI's query planner (§5.2, Algorithm 1): run a DAG query node by node within its latency SLO.

On arrival the SLO is split into partial budgets, one per node (`budgets.py`). A node's model is the most accurate
of its options whose planning latency (`latency.py`) fits its budget. With `replan` (the default) that choice is
made when the node is about to run, over the budget the query has left then: a node that finished early, because
a learned cache answered its rows, leaves the time it saved to the nodes after it, which may then afford a more
accurate model. Without it every choice is made at arrival, as a static planner does.

Nodes run as soon as the nodes they read from have answered, so the branches of a fork run at once. Each node's
request goes through the same request path as a client's (`RunModel`), with its partial budget as its `latency_ms`.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from adaserve.adaptive.parameters import latency_target_ms
from adaserve.config import TensorSpec
from adaserve.engine.stats import DurationCount, Histogram
from adaserve.errors import AdaserveError
from adaserve.planner.budgets import POLICIES, partial_budgets
from adaserve.planner.latency import LatencyBook
from adaserve.planner.spec import DagConfig, NodeSpec, Source

log = logging.getLogger("adaserve.planner")

#: The latency target a node's request carries once the query's budget is spent: nothing meets it, so the model
#: answers as fast as it can (SLO-NNs' LCAO takes its fastest k).
SPENT_BUDGET_MS = 1e-3


@dataclass(frozen=True)
class ModelAnswer:
    outputs: dict[str, np.ndarray]  # by output name
    parameters: dict[str, Any]


#: Run `model` on named input arrays of `rows` rows with these request parameters.
RunModel = Callable[[str, dict[str, np.ndarray], int, dict[str, Any]], Awaitable[ModelAnswer]]


@dataclass(frozen=True)
class Choice:
    """What a node ran: the model ("" when no row met its condition), its budget and its planning latency."""

    model: str
    budget_ms: float | None
    estimate_ms: float | None


@dataclass(frozen=True)
class QueryAnswer:
    outputs: list[np.ndarray]  # in the config's output order
    parameters: dict[str, Any]
    choices: dict[str, Choice]


@dataclass
class PlannerStats:
    success: DurationCount = field(default_factory=DurationCount)  # queries answered, and their time
    fail: DurationCount = field(default_factory=DurationCount)
    rows: int = 0  # of the queries answered
    last_inference_ms: int = 0  # when the last one was answered, ms since the epoch
    slo_missed: int = 0  # answered after their SLO
    choices: Counter[tuple[str, str]] = field(default_factory=Counter)  # (node, model or "skipped")
    upgraded: int = 0  # nodes that ran a more accurate model than the plan at arrival had for them
    latency_s: Histogram = field(default_factory=Histogram)


#: How long before a model could start a run, in seconds: 0 when it is ready, its load time when it must be loaded
#: first (mCache), None when it cannot be served now.
StartDelay = Callable[[str], float | None]


class QueryPlanner:
    """One DAG query's planner: its latency book and counters live as long as the query is loaded."""

    def __init__(self, config: DagConfig, run_model: RunModel, start_delay_s: StartDelay = lambda model: 0.0) -> None:
        self.config = config
        self.run_model = run_model
        self.start_delay_s = start_delay_s
        self.policy = POLICIES[config.budget_policy]
        self.book = LatencyBook(config.latency_quantile, config.latency_window)
        self.stats = PlannerStats()
        self._untimed: dict[str, tuple[TensorSpec, ...]] = {}  # options left to time once they can serve
        self._timing: set[asyncio.Task[None]] = set()

    async def probe(self, inputs: Mapping[str, tuple[TensorSpec, ...]], now: Collection[str] | None = None) -> None:
        """Time each option `probes` times on a row of zeros with early exit off (a whole run), so the first
        request is planned with latencies of this machine. `inputs`: each option model's input tensors. `now`: the
        options to time at once (default: all). The others are timed in the background when a request first finds
        them servable without a load (`choose`); until then a budget never picks them. A cluster node times at load
        only what it holds: timing an option is a request for it, and at a node's start would have every option
        model placed, on some node, before any client asked for one."""
        self._untimed = {model: specs for model, specs in inputs.items() if now is not None and model not in now}
        for model, specs in inputs.items():
            if model not in self._untimed:
                await self._time(model, specs)

    async def _time(self, model: str, specs: tuple[TensorSpec, ...]) -> None:
        arrays = {spec.name: np.zeros((1, *spec.row_shape), spec.dtype) for spec in specs}
        for _ in range(self.config.probes):
            began = time.perf_counter()
            await self.run_model(model, arrays, 1, {"early_exit": False})
            self.book.observe(model, 1, (time.perf_counter() - began) * 1e3)

    def close(self) -> None:
        """Stop timing options in the background: the query is unloaded or replaced."""
        for task in self._timing:
            task.cancel()

    def _time_later(self, models: Collection[str]) -> None:
        """Time, in the background, each of `models` (servable now without a load) left untimed at load."""
        for model in models:
            specs = self._untimed.pop(model, None)
            if specs is not None:
                # in a context of its own: the query that found the option held is not its parent (its trace,
                # were it traced, would take these runs for its stages)
                task = asyncio.get_running_loop().create_task(
                    self._time_untimed(model, specs), context=contextvars.Context()
                )
                self._timing.add(task)
                task.add_done_callback(self._timing.discard)

    async def _time_untimed(self, model: str, specs: tuple[TensorSpec, ...]) -> None:
        try:
            await self._time(model, specs)
        except AdaserveError as exc:  # its node failed, say: timed when a request next finds it servable
            self._untimed[model] = specs
            log.warning("timing a DAG option failed", extra={"model": model, "error": str(exc)})

    async def run(self, inputs: dict[str, np.ndarray], rows: int, parameters: dict[str, Any]) -> QueryAnswer:
        began = time.perf_counter()
        slo_ms = latency_target_ms(parameters) or self.config.latency_ms
        query = _Query(self, inputs, rows, {k: v for k, v in parameters.items() if k != "latency_ms"}, began, slo_ms)
        try:
            await query.run()
        except BaseException:
            self.stats.fail.add(int((time.perf_counter() - began) * 1e9))
            raise
        elapsed_s = time.perf_counter() - began
        self.stats.success.add(int(elapsed_s * 1e9))
        self.stats.rows += rows
        self.stats.last_inference_ms = int(time.time() * 1e3)
        self.stats.latency_s.observe(elapsed_s)
        if slo_ms is not None and elapsed_s * 1e3 > slo_ms:
            self.stats.slo_missed += 1
        for node, choice in query.choices.items():
            self.stats.choices[node, choice.model or "skipped"] += 1
        self.stats.upgraded += query.upgraded
        return QueryAnswer(query.outputs(), query.response_parameters(), query.choices)

    def plan(self, among: list[str], budget_ms: float | None, rows: int) -> dict[str, Choice]:
        """The model for each node of `among` within its share of `budget_ms` (no budget: the most accurate)."""
        if budget_ms is None:
            return {node: self.choose(self.config.node(node), None, rows) for node in among}
        costs = {node: self.cost_ms(self.config.node(node), rows) for node in among}
        budgets = partial_budgets(self.config, among, costs, budget_ms, self.policy)
        return {node: self.choose(self.config.node(node), budgets[node], rows) for node in among}

    def cost_ms(self, node: NodeSpec, rows: int) -> float:
        """C_i: the planning latency of the node's slowest option (0 for options never run)."""
        return max(self.book.estimate_ms(option.model, rows) or 0.0 for option in node.options)

    def choose(self, node: NodeSpec, budget_ms: float | None, rows: int) -> Choice:
        """The most accurate option whose planning latency fits the budget; when none fits, the fastest. An option
        that cannot be served now is passed over (unless no option can); one the model cache must load first is
        planned with its load time on top; one left untimed at load is timed once it can serve (`probe`)."""
        ranked = sorted(node.options, key=lambda option: -option.accuracy)
        delays = {option.model: self.start_delay_s(option.model) for option in ranked}
        servable = [option for option in ranked if delays[option.model] is not None]
        ranked = servable or ranked
        estimates = {option.model: self._estimate_ms(option.model, rows, delays[option.model]) for option in ranked}
        self._time_later([o.model for o in servable if delays[o.model] == 0.0 and estimates[o.model] is None])
        if budget_ms is None:
            return Choice(ranked[0].model, None, estimates[ranked[0].model])
        for option in ranked:
            estimate = estimates[option.model]
            if estimate is not None and estimate <= budget_ms:
                return Choice(option.model, budget_ms, estimate)
        known = [(estimate, model) for model, estimate in estimates.items() if estimate is not None]
        model = min(known)[1] if known else ranked[0].model
        return Choice(model, budget_ms, estimates[model])

    def _estimate_ms(self, model: str, rows: int, delay_s: float | None) -> float | None:
        run_ms = self.book.estimate_ms(model, rows)
        return None if run_ms is None else run_ms + (delay_s or 0.0) * 1e3

    def accuracy(self, node: NodeSpec, model: str) -> float:
        return next(option.accuracy for option in node.options if option.model == model)


class _Query:
    """One request's walk through the DAG: the tensors so far, the rows each node ran on, the choices made."""

    def __init__(
        self,
        planner: QueryPlanner,
        inputs: dict[str, np.ndarray],
        rows: int,
        parameters: dict[str, Any],
        began: float,
        slo_ms: float | None,
    ) -> None:
        self.planner = planner
        self.config = planner.config
        self.rows = rows
        self.sent = parameters  # what each node's request carries, with its own latency_ms
        self.began = began
        self.slo_ms = slo_ms
        self.values: dict[str, np.ndarray] = dict(inputs)  # by source text: `image`, `classify.logits`
        self.ran: dict[str, np.ndarray] = {}  # node → the rows it ran on
        self.answers: dict[str, dict[str, Any]] = {}  # node → its model's response parameters
        self.choices: dict[str, Choice] = {}
        self.started: set[str] = set()
        self.upgraded = 0
        names = [node.name for node in self.config.nodes]
        self.at_arrival = planner.plan(names, slo_ms, rows)

    async def run(self) -> None:
        tasks: dict[str, asyncio.Task[None]] = {}
        for node in self.config.nodes:
            tasks[node.name] = asyncio.ensure_future(self._node(node, [tasks[p] for p in node.parents]))
        try:
            await asyncio.gather(*tasks.values())
        finally:
            for task in tasks.values():
                task.cancel()

    async def _node(self, node: NodeSpec, parents: list[asyncio.Task[None]]) -> None:
        await asyncio.gather(*parents)
        self.started.add(node.name)
        rows = self._rows(node)
        count = int(rows.sum())
        self.ran[node.name] = rows
        if count == 0:
            self.choices[node.name] = Choice("", None, None)
            return
        choice = self._choose(node, count)
        self.choices[node.name] = choice
        arrays = {name: self.values[source][rows] for name, source in node.inputs.items()}
        parameters = dict(self.sent)
        if choice.budget_ms is not None:
            # A budget spent before the node runs is no client's error: its model is asked for its fastest answer
            # (a latency target nothing meets), and the query is counted as having missed its SLO. The spent,
            # negative budget itself failed such a query with a 400 naming `latency_ms`.
            parameters["latency_ms"] = max(choice.budget_ms, SPENT_BUDGET_MS)
        began = time.perf_counter()
        answer = await self.planner.run_model(choice.model, arrays, count, parameters)
        if not answer.parameters.get("exited_rows"):
            self.planner.book.observe(choice.model, count, (time.perf_counter() - began) * 1e3)
        self.answers[node.name] = answer.parameters
        for name, array in answer.outputs.items():
            full = np.zeros((self.rows, *array.shape[1:]), array.dtype)
            full[rows] = array
            self.values[f"{node.name}.{name}"] = full

    def _rows(self, node: NodeSpec) -> np.ndarray:
        """The rows the node runs on: where every node it reads from ran and its condition holds."""
        rows = np.ones(self.rows, dtype=bool)
        for parent in node.parents:
            rows &= self.ran[parent]
        if node.when is not None:
            classes = self.values[node.when.source].reshape(self.rows, -1).argmax(axis=1).tolist()
            rows &= np.array([c in node.when.argmax_in for c in classes])
        return rows

    def _choose(self, node: NodeSpec, count: int) -> Choice:
        if not self.config.replan or self.slo_ms is None:
            return self.at_arrival[node.name]
        left_ms = self.slo_ms - (time.perf_counter() - self.began) * 1e3
        waiting = [n.name for n in self.config.nodes if n.name not in self.started or n.name == node.name]
        choice = self.planner.plan(waiting, left_ms, count)[node.name]
        planned = self.at_arrival[node.name].model
        if self.planner.accuracy(node, choice.model) > self.planner.accuracy(node, planned):
            self.upgraded += 1
        return choice

    def outputs(self) -> list[np.ndarray]:
        """Each output, row by row from the first of its sources whose node ran on the row."""
        arrays = []
        for spec in self.config.outputs:
            out = np.zeros((self.rows, *spec.row_shape), spec.dtype)
            filled = np.zeros(self.rows, dtype=bool)
            for text in self.config.results[spec.name]:
                node = Source(text).node
                assert node is not None
                take = self.ran[node] & ~filled
                if take.any():
                    out[take] = self.values[text][take]
                filled |= take
            arrays.append(out)
        return arrays

    def response_parameters(self) -> dict[str, Any]:
        """`dag_plan` ("classify=resnet,tops=tops_large"), the SLO, and each node's answer's own parameters."""
        plan = (f"{node.name}={self.choices[node.name].model or 'skipped'}" for node in self.config.nodes)
        out: dict[str, Any] = {"dag_plan": ",".join(plan)}  # in the config's order, whichever branch ran first
        if self.slo_ms is not None:
            out["latency_budget_ms"] = self.slo_ms
        for node, answer in self.answers.items():
            out.update({f"{node}.{key}": value for key, value in answer.items()})
        return out
