"""The DAG queries a server answers: loaded from the repository's `dag.yaml` files, each checked against the
models it names and given its planner.

A query loads after the models: loading checks that every option is a model of the repository whose inputs are
wired and whose tensors fit what the query passes between nodes, then times each option (`QueryPlanner.probe`).
A query that fails to load is recorded with its reason, as a model is, and the rest keep serving. Where its
option models are, and which are timed at load, is its `OptionModels`': the router's on one server, the cluster's
on a cluster node (`adaserve.distributed.stages`).
"""

from __future__ import annotations

import logging
from typing import Protocol

from adaserve.config import ModelConfig, TensorSpec
from adaserve.engine.router import IndexEntry, ModelRouter
from adaserve.errors import AdaserveError, ConfigError, ModelNotReadyError
from adaserve.planner.planner import QueryPlanner, RunModel
from adaserve.planner.spec import DagConfig, Source

log = logging.getLogger("adaserve.planner")


class OptionModels(Protocol):
    """The models a query's options name, as the catalog sees them."""

    def config(self, model: str) -> ModelConfig:
        """What `model` takes and answers: the query's wiring is checked against it."""
        ...

    def start_delay_s(self, model: str) -> float | None:
        """How long before `model` could start a run (`StartDelay`)."""
        ...

    def timed_at_load(self, model: str) -> bool:
        """Whether loading a query times `model` at once; the others are timed once a request finds them
        servable (`QueryPlanner.probe`)."""
        ...


class RouterModels:
    """One server's option models: the router's, each timed at load (loaded first by the model cache, if one
    manages them)."""

    def __init__(self, router: ModelRouter) -> None:
        self.router = router

    def config(self, model: str) -> ModelConfig:
        return self.router.spec(model).config

    def start_delay_s(self, model: str) -> float | None:
        return self.router.start_delay_s(model)

    def timed_at_load(self, model: str) -> bool:
        return True


class DagCatalog:
    def __init__(self, router: ModelRouter, run_model: RunModel) -> None:
        self.router = router
        self.run_model = run_model
        self.options: OptionModels = RouterModels(router)  # a cluster node's are the cluster's
        self.planners: dict[str, QueryPlanner] = {}
        self.models: dict[str, list[ModelConfig]] = {}  # each loaded query's option models (what its parameters reach)
        self._errors: dict[str, str] = {}
        self._unloaded: set[str] = set()

    def knows(self, name: str) -> bool:
        """A DAG query this server has loaded, failed to load or unloaded (cheap: asked on every request)."""
        return name in self.planners or name in self._errors or name in self._unloaded

    def planner(self, name: str) -> QueryPlanner:
        planner = self.planners.get(name)
        if planner is None:
            reason = self._errors.get(name, "load it through the repository API")
            raise ModelNotReadyError(f"DAG query '{name}' is not loaded: {reason}")
        return planner

    async def load_all(self, names: list[str] | None = None) -> None:
        """Load the named queries (default: every one in the repository); failures are logged, not raised."""
        known = self.router.repository.dag_names()
        for name in known if names is None else [n for n in names if n in known]:
            try:
                await self.load(name)
            except AdaserveError as exc:
                log.error("DAG query failed to load", extra={"model": name, "error": str(exc)})

    async def load(self, name: str) -> None:
        """(Re)load a query; the one serving keeps serving until the new one is ready."""
        try:
            config = self.router.repository.read_dag(name)
            planner = QueryPlanner(config, self.run_model, self.options.start_delay_s)
            models = self._option_models(config)
            timed = [name for name in models if self.options.timed_at_load(name)]
            await planner.probe({name: model.inputs for name, model in models.items()}, timed)
        except AdaserveError as exc:
            if name in self.router.repository.dag_names():
                self._errors[name] = str(exc)
            raise
        replaced = self.planners.get(name)
        if replaced is not None:
            replaced.close()
        self.planners[name] = planner
        self.models[name] = list(models.values())
        self._errors.pop(name, None)
        self._unloaded.discard(name)

    def unload(self, name: str) -> None:
        """Stop answering `name` (a query of the repository); requests under way finish."""
        planner = self.planners.pop(name, None)
        if planner is not None:
            planner.close()
        self.models.pop(name, None)
        self._errors.pop(name, None)
        self._unloaded.add(name)

    def index(self) -> list[IndexEntry]:
        entries = []
        for name in sorted(set(self.router.repository.dag_names()) | set(self.planners)):
            if name in self.planners:
                entries.append(IndexEntry(name, "1", "READY", ""))
            else:
                entries.append(IndexEntry(name, "", "UNAVAILABLE", self._errors.get(name, "unloaded")))
        return entries

    def _option_models(self, config: DagConfig) -> dict[str, ModelConfig]:
        """Each option model's config, after checking the query's wiring against them."""
        models: dict[str, ModelConfig] = {}
        for node in config.nodes:
            for option in node.options:
                try:
                    models[option.model] = self.options.config(option.model)
                except AdaserveError as exc:
                    raise ConfigError(f"DAG query '{config.name}': node '{node.name}': {exc}") from None
        tensors = {spec.name: spec for spec in config.inputs}  # source text → the tensor it carries
        for node in config.nodes:
            where = f"DAG query '{config.name}': node '{node.name}'"
            for option in node.options:
                model = models[option.model]
                expected = sorted(spec.name for spec in model.inputs)
                if sorted(node.inputs) != expected:
                    raise ConfigError(
                        f"{where}: model '{option.model}' takes inputs {expected}, the node wires {sorted(node.inputs)}"
                    )
                if model.max_batch_size < config.max_batch_size:
                    raise ConfigError(
                        f"{where}: model '{option.model}' takes batches of at most "
                        f"{model.max_batch_size}, the query {config.max_batch_size}"
                    )
                for spec in model.inputs:
                    _check_fits(
                        f"{where}: input '{spec.name}' of '{option.model}'", tensors[node.inputs[spec.name]], spec
                    )
            for output in _outputs_read(config, node.name):
                specs = [_output(models[o.model], output, f"{where}: model '{o.model}'") for o in node.options]
                for option, spec in zip(node.options[1:], specs[1:], strict=True):
                    _check_fits(f"{where}: output '{output}' of '{option.model}'", specs[0], spec)
                tensors[f"{node.name}.{output}"] = specs[0]
        for spec in config.outputs:
            for text in config.results[spec.name]:
                _check_fits(f"DAG query '{config.name}': result '{spec.name}' from '{text}'", tensors[text], spec)
        return models


def _outputs_read(config: DagConfig, node: str) -> list[str]:
    """The outputs of `node` that later nodes or the results read."""
    texts = [s.text for n in config.nodes for s in n.sources] + [t for ts in config.results.values() for t in ts]
    return sorted({Source(t).tensor for t in texts if Source(t).node == node})


def _output(model: ModelConfig, name: str, where: str) -> TensorSpec:
    for spec in model.outputs:
        if spec.name == name:
            return spec
    raise ConfigError(f"{where} has no output '{name}' (it has {', '.join(s.name for s in model.outputs)})")


def _check_fits(where: str, given: TensorSpec, taken: TensorSpec) -> None:
    if (given.datatype, given.row_shape) != (taken.datatype, taken.row_shape):
        raise ConfigError(
            f"{where}: gets {given.datatype} rows of {list(given.row_shape)}, takes {taken.datatype} rows of "
            f"{list(taken.row_shape)}"
        )
