"""The data plane: every Open Inference Protocol operation once, for the REST and gRPC adapters to share.

Results are plain dicts in the JSON shapes the protocol (and Triton's extensions) define; the REST adapter sends
them as JSON, the gRPC adapter parses them into the protobuf messages of the same shape.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Collection, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from functools import partial
from typing import Any, Literal, Protocol

import numpy as np

from adaserve import __version__
from adaserve.config import Interface, ModelConfig
from adaserve.engine.engine import EngineResult, EngineState, ModelEngine, RequestTimes
from adaserve.engine.router import ModelRouter
from adaserve.engine.schedule_policy import schedule
from adaserve.errors import InvalidInputError, ModelControlError, ModelNotFoundError, ModelNotReadyError
from adaserve.logs import SWITCHES
from adaserve.planner.catalog import DagCatalog
from adaserve.planner.planner import ModelAnswer
from adaserve.repository import ModelSpec, check_name, check_version
from adaserve.server.classification import check_classifiable, top_classes
from adaserve.server.cuda_ipc import cuda_driver_present
from adaserve.server.documents import dag_config, dag_statistics, model_statistics, triton_config
from adaserve.server.protocol import InferenceRequest, InferenceResponse, RequestedOutput, Tensor, check_input
from adaserve.server.request_parameters import IgnoredParameters, Target
from adaserve.server.response_cache import ResponseCache
from adaserve.server.shared_memory import SharedMemoryRegions
from adaserve.server.trace import Trace, Tracer, TraceSettings

EXTENSIONS = [
    "classification",
    "binary_tensor_data",
    "model_configuration",
    "model_repository",
    "statistics",
    "parameters",
    "schedule_policy",
    "logging",
    "trace",
]

log = logging.getLogger("adaserve.dataplane")

#: The trace of the DAG query being run, if it is traced: its nodes' traces are its children.
_dag_trace: ContextVar[Trace | None] = ContextVar("dag_trace", default=None)

#: Triton's model control modes: who may load and unload models once the server runs.
ModelControlMode = Literal["none", "poll", "explicit"]


@dataclass(frozen=True)
class ClusterState:
    """A cluster as one node server sees it (`/metrics`): the requests it forwarded per (model, node) and sent again
    after a node failed, per model; and its routing table's replicas, nodes, the controller's decisions by kind, and
    the table's version."""

    forwards: Mapping[tuple[str, str], int]
    retries: Mapping[str, int]
    replicas: Mapping[str, Sequence[str]]
    nodes: Sequence[str]
    decisions: Mapping[str, int]
    table_version: int


class ClusterView(Protocol):
    """What a node server on a cluster knows of the other nodes (`adaserve.distributed.member`), for the answers
    that speak for the whole cluster (the repository index, the metrics) and the DAG stages run on other nodes."""

    node: str  # this node's name in the routing table: the label `node` of its series

    async def run_stage(
        self, model: str, inputs: dict[str, np.ndarray], rows: int, parameters: dict[str, Any], query: Trace | None
    ) -> ModelAnswer | None:
        """A DAG query's stage run where `model` is served: its answer; None when that is on this node. A stage of
        a traced `query` run elsewhere is traced as its child, the holder's trace a child of that."""
        ...

    async def metrics(self) -> bytes:
        """The cluster-wide exposition (`GET /metrics/cluster`)."""
        ...

    async def change_trace(self, model: str, changes: dict[str, list[str] | None]) -> None:
        """Apply a trace setting request to every node's settings (`Tracer.update`'s arguments); an error names a
        bad setting, or the nodes that did not confirm the change."""
        ...

    async def trace_left(self, model: str) -> int | None:
        """What is left of the cluster's `trace_count` for `model`'s requests (the server's, for ""); None where
        this server's own count stands."""
        ...

    def held_elsewhere(self) -> dict[str, list[str]]:
        """Each model other nodes hold and this one does not, with those nodes."""
        ...

    def state(self) -> ClusterState: ...


class DataPlane:
    def __init__(
        self,
        router: ModelRouter,
        model_control: ModelControlMode = "explicit",
        allow_client_shm: bool = False,
        tracer: Tracer | None = None,
        response_cache: ResponseCache | None = None,
    ) -> None:
        """`model_control`: explicit lets the repository API load and unload; none and poll refuse it (in poll
        mode the poller follows the repository instead). `allow_client_shm`: clients may register system
        shared-memory regions and name them in requests. `tracer`: which requests are traced, and where to (by
        default none, and tracing cannot be turned on: there is no trace file). `response_cache`: where models
        with `response_cache: {enable: true}` keep their answers (none: they run every request)."""
        self.router = router
        self.response_cache = response_cache
        self._uncached: set[str] = set()  # models that enable the response cache on a server without one (warned)
        self.tracer = tracer or Tracer(TraceSettings(), None)
        self.model_control = model_control
        self.dags = DagCatalog(router, self._run_node)  # DAG queries: names answered by several models in turn
        self.shared_memory = SharedMemoryRegions(allow_client_shm)  # the client's regions inputs and outputs name
        self.started = False  # set once the models named at start have been loaded (or failed)
        self.stopping = False  # set when the server begins to stop: not ready from then on
        self.cluster: ClusterView | None = None  # set on a cluster: the index and metrics then speak for it
        self.ignored = IgnoredParameters()  # says in each response which of its request's parameters went unused

    # -- health and metadata ---------------------------------------------------------------------------------
    def live(self) -> bool:
        return True

    def ready(self) -> bool:
        ready = self.started and not self.stopping
        return ready and all(e.state is EngineState.READY for e in self.router.all_engines())

    def metadata(self) -> dict[str, Any]:
        """`{"name": ..., "version": ..., "extensions": [...]}`."""
        shared_memory = []
        if self.shared_memory.allowed:
            shared_memory = ["system_shared_memory", *(["cuda_shared_memory"] if cuda_driver_present() else [])]
        return {"name": "adaserve", "version": __version__, "extensions": EXTENSIONS + shared_memory}

    def model_ready(self, name: str, version: str = "") -> bool:
        """Ready to answer an inference: loaded and ready, or not resident but loadable by the model cache."""
        try:
            self.check_model(name, version)
        except ModelNotReadyError:
            return False
        return True

    def check_model(self, name: str, version: str = "") -> Interface:
        """Fail fast (400 / 404 / 503) before a request body is decoded; what the model takes, which the codecs
        check each input against before converting its data."""
        _check_names(name, version)
        if self.dags.knows(name):
            return self.dags.planner(name).config
        self.router.check_servable(name, version)
        return self.router.spec(name, version).config

    def model_metadata(self, name: str, version: str = "") -> dict[str, Any]:
        """`{"name", "versions", "platform", "inputs": [{"name", "datatype", "shape"}], "outputs": [...]}`."""
        config: Interface
        _check_names(name, version)
        if self.dags.knows(name):
            config, versions, platform = self.dags.planner(name).config, ["1"], "dag"
        else:
            model = self.router.spec(name, version)
            config, versions, platform = model.config, [str(v) for v in model.served], model.platform
        return {
            "name": name,
            "versions": versions,
            "platform": platform,
            "inputs": [{"name": t.name, "datatype": t.datatype, "shape": list(t.shape)} for t in config.inputs],
            "outputs": [{"name": t.name, "datatype": t.datatype, "shape": list(t.shape)} for t in config.outputs],
        }

    def model_config(self, name: str, version: str = "") -> dict[str, Any]:
        """Triton's model configuration (the `ModelConfig` message as JSON), plus adaserve's worker set."""
        _check_names(name, version)
        if self.dags.knows(name):
            return dag_config(self.dags.planner(name).config)
        engine = self.router.engine(name, version)
        return triton_config(engine)

    def log_settings(self, changes: dict[str, Any] | None = None) -> dict[str, Any]:
        """Triton's logging extension: the server's log switches, after setting those in `changes`."""
        return SWITCHES.update(changes) if changes else SWITCHES.settings()

    async def trace_settings(
        self, name: str = "", changes: dict[str, list[str] | None] | None = None
    ) -> dict[str, Any]:
        """Triton's trace extension: the settings of a model (or the server's), after applying `changes` (on a
        cluster, to every node's: there a model is named as the repository has it, wherever it is held, and the
        `trace_count` is what is left of it in the whole cluster)."""
        if name and self.cluster is None:
            self.check_model(name)
        elif name:
            _check_names(name, "")
            repository = self.router.repository
            if not (self.dags.knows(name) or repository.holds(name) or name in repository.dag_names()):
                raise ModelNotFoundError(f"unknown model '{name}'")
        if self.cluster is None:
            return self.tracer.settings(name) if changes is None else self.tracer.update(name, changes)
        if changes is not None:
            await self.cluster.change_trace(name, changes)
        settings = self.tracer.settings(name)
        if settings["trace_count"] != "-1":  # this server holds its share of the count: the answer is the cluster's
            left = await self.cluster.trace_left(name)
            settings["trace_count"] = settings["trace_count"] if left is None else str(left)
        return settings

    def statistics(self, name: str = "", version: str = "") -> dict[str, Any]:
        """Triton's statistics extension: `{"model_stats": [...]}` for one version of a model, every version it
        serves, or every loaded model."""
        _check_names(name, version)
        if self.dags.knows(name):
            return {"model_stats": [dag_statistics(name, self.dags.planner(name).stats)]}
        dags = self.dags.planners if not name else {}
        if not name:
            engines = self.router.all_engines()
        elif version:
            engines = [self.router.engine(name, version)]
        else:
            engines = self.router.served_engines(name)
        stats = [model_statistics(engine) for engine in engines]
        return {"model_stats": stats + [dag_statistics(dag, planner.stats) for dag, planner in dags.items()]}

    def repository_index(self, ready_only: bool = False) -> list[dict[str, str]]:
        """Triton's repository index; on a cluster, a model another node holds is READY, its reason naming where."""
        rows = [dict(e.__dict__) for e in sorted(self.router.index() + self.dags.index(), key=lambda e: e.name)]
        elsewhere = self.cluster.held_elsewhere() if self.cluster is not None else {}
        for row in rows:
            if row["state"] != "READY" and row["name"] in elsewhere:
                nodes = elsewhere[row["name"]]
                row.update(state="READY", reason=f"held on {len(nodes)} other node(s): {', '.join(nodes)}")
            elif self.cluster is not None and row["reason"] == "unloaded":
                row["reason"] = "held by no node: placed on its first request"
        return [row for row in rows if row["state"] == "READY"] if ready_only else rows

    async def load(self, name: str, parameters: Collection[str] = ()) -> None:
        """Triton's repository load. Its parameters send a config or files with the request (`config`,
        `file:<path>`); they are refused, not ignored: a model loads from its directory in the repository."""
        self._check_model_control()
        check_name(name)
        if parameters:
            raise InvalidInputError(
                f"load of '{name}': parameters {sorted(parameters)} are not supported; a model loads from its "
                "directory in the repository (config.yaml and its version folders)"
            )
        if name in self.router.repository.dag_names():
            await self.dags.load(name)
        else:
            await self.router.load(name)

    async def unload(self, name: str, parameters: Collection[str] = ()) -> None:
        """Triton's repository unload; `unload_dependents` is accepted (no model here has dependents)."""
        self._check_model_control()
        check_name(name)
        unknown = sorted(set(parameters) - {"unload_dependents"})
        if unknown:
            raise InvalidInputError(f"unload of '{name}': parameters {unknown} are not supported")
        if self.dags.knows(name) or name in self.router.repository.dag_names():
            self.dags.unload(name)
        else:
            await self.router.unload(name)

    def _check_model_control(self) -> None:
        if self.model_control == "poll":
            raise ModelControlError(
                "explicit model load / unload is not allowed if polling is enabled (--model-control-mode poll: the "
                "server follows the repository on disk)"
            )
        if self.model_control == "none":
            raise ModelControlError(
                "explicit model load / unload is not allowed in model control mode none (--model-control-mode none: "
                "the models loaded at start are the ones served)"
            )

    # -- inference -------------------------------------------------------------------------------------------
    async def infer(self, request: InferenceRequest, trace: Trace | None = None) -> InferenceResponse:
        """Run a request; a `trace` gets its handling's timestamps (and tensors) on the way, and, for a DAG query,
        each model it runs gets a trace of its own whose parent it is."""
        if trace is not None:
            trace.stamp("REQUEST_START", time.perf_counter_ns())
            for tensor in request.inputs:
                trace.tensor("TENSOR_QUEUE_INPUT", tensor.name, tensor.datatype, tensor.data)
        if self.dags.knows(request.model_name):
            token = _dag_trace.set(trace)  # the query's nodes run in tasks that copy this context
            try:
                response = await self._infer_dag(request)
            finally:
                _dag_trace.reset(token)
        else:
            spec = self.router.spec(request.model_name, request.model_version)
            arrays, rows = validate_inputs(spec.config, request)
            wanted = requested_outputs(spec.config, request)
            version, outputs, parameters, times = await self._answer(request, spec, arrays, rows)
            target = partial(Target.of, spec.name, [spec.config])
            parameters = self.ignored.annotate(parameters, request.parameters, spec.config.parameters, target)
            response = self._response(request, spec.config, wanted, version, outputs, parameters, spec.labels)
            if trace is not None and times is not None:  # None: answered from the response cache
                trace.stamp_times(times)
        if trace is not None:
            trace.model_version = response.model_version
            for tensor in response.outputs:
                trace.tensor("TENSOR_BACKEND_OUTPUT", tensor.name, tensor.datatype, tensor.data)
            trace.stamp("REQUEST_END", time.perf_counter_ns())
        return response

    async def _answer(
        self, request: InferenceRequest, spec: ModelSpec, arrays: list[np.ndarray], rows: int
    ) -> tuple[str, list[np.ndarray], dict[str, Any], RequestTimes | None]:
        """The request's outputs and response parameters, and the version that gave them: from the response cache
        when the model keeps its answers there and an equal request's answer is in it (no times: nothing ran),
        else computed by the model (and kept, when it keeps them)."""
        name, config = request.model_name, spec.config
        cache, source = self._cache_for(spec)
        if cache is None:
            engine, result = await self._compute(name, request.model_version, config, arrays, rows, request.parameters)
            return str(engine.model.version), result.outputs, result.parameters, result.times
        started = time.perf_counter_ns()
        parameters = {**config.parameters, **request.parameters}
        # The key leaves out the parameters that only schedule a request, so a hit checks them as the engine would.
        schedule(parameters, config.batching)
        names, datatypes = [t.name for t in config.inputs], [t.datatype for t in config.inputs]
        key = cache.key(name, spec.version, source, names, datatypes, arrays, parameters)
        cached = cache.get(key)
        if cached is not None:
            self.router.ready_engine(name, str(spec.version)).stats.record_cache_hit(time.perf_counter_ns() - started)
            return str(spec.version), list(cached.outputs), dict(cached.parameters), None
        lookup_ns = time.perf_counter_ns() - started
        engine, result = await self._compute(name, str(spec.version), config, arrays, rows, request.parameters)
        started = time.perf_counter_ns()
        cache.put(key, result.outputs, result.parameters)
        engine.stats.cache_miss.add(lookup_ns + time.perf_counter_ns() - started)
        return str(engine.model.version), result.outputs, result.parameters, result.times

    def _cache_for(self, spec: ModelSpec) -> tuple[ResponseCache | None, object]:
        """The response cache this model version's answers go to, and what its engine was started from (part of
        every key); no cache when the model does not keep answers, or its engine is not running (mCache evicted
        it, or it was not started from files the router fingerprints)."""
        if not spec.config.response_cache.enable:
            return None, None
        if self.response_cache is None:
            if spec.name not in self._uncached:
                self._uncached.add(spec.name)
                log.warning(
                    "model enables response_cache, but this server has no response cache (--cache-config "
                    "local,size=BYTES): every request runs the model",
                    extra={"model": spec.name},
                )
            return None, None
        source = self.router.source(spec.name, spec.version)
        return (self.response_cache, source) if source is not None else (None, None)

    async def _infer_dag(self, request: InferenceRequest) -> InferenceResponse:
        planner = self.dags.planner(request.model_name)
        config = planner.config
        arrays, rows = validate_inputs(config, request)
        wanted = requested_outputs(config, request)
        inputs = {spec.name: array for spec, array in zip(config.inputs, arrays, strict=True)}
        answer = await planner.run(inputs, rows, {**config.parameters, **request.parameters})
        # Its nodes' requests carry its parameters: the query takes what any of its models takes.
        target = partial(Target.of, config.name, self.dags.models.get(config.name, []), dag=True)
        parameters = self.ignored.annotate(answer.parameters, request.parameters, config.parameters, target)
        return self._response(request, config, wanted, "1", answer.outputs, parameters)

    async def _run_node(
        self, name: str, inputs: dict[str, np.ndarray], rows: int, parameters: dict[str, Any]
    ) -> ModelAnswer:
        """A DAG query's node: its model run through the request path a client's request takes (and traced as a
        child when its query is); on a cluster, where its model is served."""
        if (
            self.cluster is not None
            and (stage := await self.cluster.run_stage(name, inputs, rows, parameters, _dag_trace.get())) is not None
        ):
            return stage
        config = self.router.spec(name).config
        arrays = [inputs[spec.name] for spec in config.inputs]
        parent = _dag_trace.get()
        if parent is None:
            _, result = await self._compute(name, "", config, arrays, rows, parameters)
        else:
            trace = self.tracer.child(parent, name)
            trace.stamp("REQUEST_START", time.perf_counter_ns())
            for spec, array in zip(config.inputs, arrays, strict=True):
                trace.tensor("TENSOR_QUEUE_INPUT", spec.name, spec.datatype, array)
            try:
                engine, result = await self._compute(name, "", config, arrays, rows, parameters)
                trace.model_version = str(engine.model.version)
                trace.stamp_times(result.times)
                for spec, array in zip(config.outputs, result.outputs, strict=True):
                    trace.tensor("TENSOR_BACKEND_OUTPUT", spec.name, spec.datatype, array)
                trace.stamp("REQUEST_END", time.perf_counter_ns())
            finally:
                self.tracer.finish(trace)
        return ModelAnswer(
            {spec.name: array for spec, array in zip(config.outputs, result.outputs, strict=True)}, result.parameters
        )

    async def _compute(
        self,
        name: str,
        version: str,
        config: ModelConfig,
        arrays: list[np.ndarray],
        rows: int,
        parameters: dict[str, Any],
    ) -> tuple[ModelEngine, EngineResult]:
        """Run rows on a model's engine, the config's default parameters under the request's."""
        async with self.router.serving(name, version) as engine:
            return engine, await engine.infer(arrays, rows, {**config.parameters, **parameters})

    def _response(
        self,
        request: InferenceRequest,
        config: Interface,
        wanted: dict[str, RequestedOutput],
        version: str,
        arrays: list[np.ndarray],
        parameters: dict[str, Any],
        labels: Mapping[str, Sequence[str]] | None = None,
    ) -> InferenceResponse:
        """The outputs the request asked for, each in the form it asked for (`labels`: the class names the
        classification extension adds, by output); those asked into shared memory are written there now."""
        outputs, forms = [], []
        for spec, array in zip(config.outputs, arrays, strict=True):
            form = wanted.get(spec.name)
            if form is None:
                continue
            if form.class_count:
                classes = top_classes(array, form.class_count, (labels or {}).get(spec.name, ()))
                outputs.append(Tensor(spec.name, "BYTES", classes.shape, classes))
            else:
                if form.shared_memory is not None:
                    self.shared_memory.write(form.shared_memory, array, f"output '{spec.name}'")
                outputs.append(Tensor(spec.name, spec.datatype, tuple(array.shape), array))
            forms.append(form)
        return InferenceResponse(
            model_name=request.model_name,
            model_version=version,
            outputs=outputs,
            forms=forms,
            id=request.id,
            parameters=parameters,
        )


def _check_names(name: str, version: str) -> None:
    """A 400 for a name or version no model can have (`name` empty: every model, where that is asked for)."""
    if name:
        check_name(name)
    check_version(version)


def validate_inputs(config: Interface, request: InferenceRequest) -> tuple[list[np.ndarray], int]:
    """The request's inputs in config order, checked for names, datatypes, shapes and batch size."""
    given: dict[str, Tensor] = {}
    for tensor in request.inputs:
        if tensor.name in given:
            raise InvalidInputError(f"input '{tensor.name}' is given twice")
        given[tensor.name] = tensor
    for tensor in request.inputs:
        check_input(config, tensor.name, tensor.datatype, tensor.shape)
    arrays: list[np.ndarray] = []
    rows: int | None = None
    for spec in config.inputs:
        if spec.name not in given:
            raise InvalidInputError(f"missing input '{spec.name}' for model '{config.name}'")
        tensor = given[spec.name]
        batch = tensor.shape[0]
        if rows is not None and batch != rows:
            raise InvalidInputError(f"inputs have different batch sizes ({rows} and {batch} for '{spec.name}')")
        rows = batch
        arrays.append(tensor.data)
    assert rows is not None  # a config has at least one input
    return arrays, rows


def requested_outputs(config: Interface, request: InferenceRequest) -> dict[str, RequestedOutput]:
    """Output name → the form to send it in, for the outputs the request asks for (all when it names none)."""
    names = [spec.name for spec in config.outputs]
    if request.outputs is None:
        return {name: RequestedOutput(name, request.binary_outputs) for name in names}
    specs = {spec.name: spec for spec in config.outputs}
    wanted = {}
    for output in request.outputs:
        if output.name not in names:
            raise InvalidInputError(
                f"unknown output '{output.name}' for model '{config.name}'; it has: {', '.join(names)}"
            )
        if output.class_count:
            check_classifiable(specs[output.name], f"output '{output.name}'")
            if output.shared_memory is not None:
                raise InvalidInputError(
                    f"output '{output.name}': classification results are strings; ask for them in the response, "
                    "not in shared memory"
                )
        binary = output.binary or request.binary_outputs
        wanted[output.name] = RequestedOutput(output.name, binary, output.shared_memory, output.class_count)
    return wanted
