"""A DAG query's definition: the typed, validated contents of `models/<name>/dag.yaml`.

A DAG query is a name clients send requests to, like a model's, whose answer comes from several models of the
repository run in turn (Triton calls this an ensemble; GATI §5 a query's dataflow DAG). Each node lists the models
that can do its job, each with the accuracy its owner measured; the planner picks one per node and per request.
Nodes read the query's inputs or earlier nodes' outputs, so the order they are written in is an order they can run
in, and a cycle cannot be written. What needs the repository (do the models exist, do their tensors fit) is checked
when the query loads (`adaserve.planner.catalog`).
"""

from __future__ import annotations

from functools import cached_property
from typing import Literal

from pydantic import Field, field_validator, model_validator

from adaserve.config import Interface, Strict

BudgetPolicyName = Literal["equal", "proportional"]


class Source:
    """Where a tensor comes from: `image` (an input of the query) or `classify.logits` (an output of a node)."""

    def __init__(self, text: str) -> None:
        self.text = text
        node, dot, tensor = text.partition(".")
        self.node: str | None = node if dot else None
        self.tensor = tensor if dot else text


class OptionSpec(Strict):
    """One model that can run a node: `{model: tops_large, accuracy: 0.83}`."""

    model: str = Field(min_length=1, description="a model of the repository")
    accuracy: float = Field(gt=0, le=1, description="its accuracy at this node's job, as its owner measured it")


class ConditionSpec(Strict):
    """Run a node only on the rows whose class, as an earlier node's output says (its argmax), is one of these:
    GATI's traffic query sends a detected face to face recognition and a vehicle to vehicle recognition."""

    source: str = Field(description="an earlier node's output, `node.output`")
    argmax_in: tuple[int, ...] = Field(min_length=1, description="the classes that send a row to this node")


class NodeSpec(Strict):
    name: str = Field(pattern=r"^[A-Za-z_][A-Za-z0-9_-]*$", description="unique in the query; no dots")
    options: tuple[OptionSpec, ...] = Field(min_length=1, description="the models that can run it")
    inputs: dict[str, str] = Field(
        min_length=1, description="each input of its models ← a query input or an earlier node's `node.output`"
    )
    when: ConditionSpec | None = Field(default=None, description="run only on some rows (absent: on every row)")

    @field_validator("options")
    @classmethod
    def _distinct(cls, options: tuple[OptionSpec, ...]) -> tuple[OptionSpec, ...]:
        models = [option.model for option in options]
        if len(set(models)) != len(models):
            raise ValueError(f"a model is listed twice: {models}")
        return options

    @cached_property
    def sources(self) -> list[Source]:
        """Every tensor the node reads: its inputs, and its condition's."""
        texts = [*self.inputs.values(), *([self.when.source] if self.when else [])]
        return [Source(text) for text in texts]

    @cached_property
    def parents(self) -> list[str]:
        """The nodes it waits for."""
        return sorted({s.node for s in self.sources if s.node is not None})


class DagConfig(Interface):
    """The whole `dag.yaml` of one DAG query."""

    latency_ms: float | None = Field(
        default=None, gt=0, description="the latency SLO of a request that sets no `latency_ms` parameter"
    )
    budget_policy: BudgetPolicyName = Field(
        default="proportional",
        description="how a latency SLO is split into nodes' partial budgets (GATI §5.2.1): equal, or in "
        "proportion to each node's slowest option",
    )
    replan: bool = Field(
        default=True,
        description="choose each node's model when it is about to run, with the time earlier nodes left (GATI's "
        "incremental replanning); false: choose all at arrival (a static planner)",
    )
    latency_quantile: float = Field(
        default=0.95, gt=0, le=1, description="a model's latency, for planning: this quantile of its recent runs"
    )
    latency_window: int = Field(default=200, ge=1, description="the recent runs of a model the quantile is of")
    probes: int = Field(default=5, ge=1, description="runs of each model when the query loads, before any request")
    nodes: tuple[NodeSpec, ...] = Field(min_length=1, description="in an order they can run in")
    results: dict[str, tuple[str, ...]] = Field(
        description="each output of the query ← `node.output` sources, the first one whose node ran on a row"
    )

    @model_validator(mode="after")
    def _wired(self) -> DagConfig:
        """Every source names a query input or an earlier node, every output has a source, and every row gets
        every output: each output's last source is a node that runs on every row."""
        inputs = {t.name for t in self.inputs}
        seen: dict[str, NodeSpec] = {}
        for node in self.nodes:
            if node.name in seen or node.name in inputs:
                raise ValueError(f"node '{node.name}': the name is taken (by a node or a query input)")
            for source in node.sources:
                if source.node is None and source.tensor not in inputs:
                    raise ValueError(f"node '{node.name}': '{source.text}' is neither an input nor `node.output`")
                if source.node is not None and source.node not in seen:
                    raise ValueError(f"node '{node.name}': '{source.text}' does not name a node above it")
            if node.when is not None and Source(node.when.source).node is None:
                raise ValueError(f"node '{node.name}': its condition must read a node's output, not an input")
            seen[node.name] = node
        outputs = [t.name for t in self.outputs]
        if sorted(self.results) != sorted(outputs):
            raise ValueError(f"results must name each output once: outputs {outputs}, results {sorted(self.results)}")
        for output, sources in self.results.items():
            if not sources:
                raise ValueError(f"results '{output}': no source")
            for text in sources:
                if Source(text).node not in seen:
                    raise ValueError(f"results '{output}': '{text}' is not `node.output` of a node of the query")
            last = Source(sources[-1]).node
            assert last is not None
            if not self.runs_on_every_row(last):
                raise ValueError(
                    f"results '{output}': its last source '{sources[-1]}' may skip rows (its node, or one it reads "
                    "from, has a `when`): end the list with a node that runs on every row"
                )
        return self

    def node(self, name: str) -> NodeSpec:
        return self._by_name[name]

    @cached_property
    def _by_name(self) -> dict[str, NodeSpec]:
        return {node.name: node for node in self.nodes}

    @cached_property
    def _children(self) -> dict[str, list[str]]:
        return {name: [node.name for node in self.nodes if name in node.parents] for name in self._by_name}

    def runs_on_every_row(self, name: str) -> bool:
        """A node runs on a row when its condition holds there and every node it reads from ran there."""
        node = self.node(name)
        return node.when is None and all(self.runs_on_every_row(parent) for parent in node.parents)

    def children(self, name: str) -> list[str]:
        return self._children[name]
