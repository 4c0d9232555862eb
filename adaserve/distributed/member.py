"""A node server's part in the cluster, inside `adaserve serve --cluster-control FD`.

It carries out what the node actor sends on the control channel (load and unload models, take a new routing
table, report what is resident) and decides, for each request that names a model (and each stage of a DAG query,
`stages.py`), where it is served: here when this node has the model loaded and ready, else on a node the table says
holds it (forwarded, its bytes unchanged), else wherever the controller places it. Requests are counted per model
where they arrive and reported every second: the controller's eviction policy learns request rates from them. A
trace setting request made here goes up to the controller, which changes the cluster's settings and sends them to
every node (`change_trace`).

The engine does not know it is in a cluster: a request served here takes the single-node path unchanged.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import os
import re
import socket
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar
from urllib.parse import quote, unquote

import grpc
import numpy as np
from prometheus_client.core import Metric
from prometheus_client.parser import text_string_to_metric_families

from adaserve.distributed.control import Channel
from adaserve.distributed.forward import HOPS, Forwarder, ForwardFailed, relayed
from adaserve.distributed.load import LoadMeter
from adaserve.distributed.messages import (
    Drain,
    Drained,
    FromNode,
    Load,
    Loaded,
    NodeAddress,
    Place,
    Refused,
    Report,
    Requests,
    Resident,
    Routes,
    ToNode,
    TraceChange,
    TraceChanged,
    TraceCountLeft,
    TraceCountRead,
    Traced,
    TraceGive,
    TraceShare,
    TraceShareLeft,
    Tracing,
    Unload,
    Unloaded,
)
from adaserve.distributed.routes import ClusterRoutes
from adaserve.distributed.stages import ClusterStages
from adaserve.engine.engine import EngineState
from adaserve.errors import AdaserveError, ClusterChangeError, ModelNotReadyError
from adaserve.planner.planner import ModelAnswer
from adaserve.server.dataplane import ClusterState, DataPlane
from adaserve.server.documents import merge_statistics
from adaserve.server.http import Handler, Request, Response
from adaserve.server.http_client import Response as HolderAnswer
from adaserve.server.http_client import StaleConnection
from adaserve.server.metrics import cluster_families, exposition, node_families
from adaserve.server.rest import json_response
from adaserve.server.trace import Trace

log = logging.getLogger("adaserve.cluster")

#: A request forwarded this often (`HOPS`) is served where it lands, so a table that changes under a request cannot
#: send it round.
MAX_HOPS = 2
#: How often request counts go up to the controller.
REPORT_EVERY_S = 1.0
#: How long a node waits for another's own statistics or metrics before it answers without them.
PEER_TIMEOUT_S = 5.0
#: How long a trace setting request waits for the controller: to say every node has the new settings, or what is left
#: of the cluster's trace count.
TRACE_CHANGE_TIMEOUT_S = 30.0

Answer = TypeVar("Answer")
#: The path of a V2 inference request (`shortcut`): its model's name, quoted.
_INFER_PATH = re.compile(r"^/v2/models/([^/]+)(?:/versions/[^/]+)?/infer$")


class ClusterMember:
    """This node server (named `node`, as the controller calls it) in the cluster, over `plane`'s models."""

    def __init__(self, node: str, plane: DataPlane, forwarder: Forwarder) -> None:
        self.node = node
        self.plane = plane
        plane.cluster = self  # the repository index and /metrics speak for the cluster, DAG stages run where held
        self.forwarder = forwarder
        self.routes = ClusterRoutes(node, self._ask_to_place)
        self.stages = ClusterStages(self)
        plane.dags.options = self.stages  # DAG queries load whichever nodes hold their models
        self.forwards: Counter[tuple[str, str]] = Counter()  # (model, node) → requests forwarded there
        self.retries: Counter[str] = Counter()  # model → forwarded requests sent again after a node failed
        self._channel: Channel[ToNode] | None = None
        self._counts: Counter[str] = Counter()
        self._gone: set[str] = set()  # models the table places here that this node no longer holds (reported)
        self._tasks: set[asyncio.Task[None]] = set()
        self._tracing = 0  # the version of the cluster's trace settings this server traces under
        self._asks = itertools.count(1)
        self._asked: dict[int, asyncio.Future[Any]] = {}  # a question to the controller (its `ask`) → its answer

    async def start(self, control_fd: int, on_end: Callable[[], None]) -> None:
        """Take the control channel inherited as `control_fd` and follow it; `on_end` is called when it closes (the
        node actor is gone, so this server stops: no orphan keeps serving)."""
        sock = socket.socket(fileno=control_fd)
        os.set_inheritable(sock.fileno(), False)  # workers and hosts must not hold the node actor's channel open
        self._channel = await Channel[ToNode].open(sock, ToNode)
        self._spawn(self._follow(on_end))
        self._spawn(self._report_counts())

    def _spawn(self, work: Awaitable[None]) -> None:
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._channel is not None:
            self._channel.close()
        await self.forwarder.close()

    # -- the control channel ------------------------------------------------------------------------------------
    def _send(self, message: FromNode) -> None:
        assert self._channel is not None
        self._channel.send(message)

    async def _follow(self, on_end: Callable[[], None]) -> None:
        assert self._channel is not None
        while (message := await self._channel.receive()) is not None:
            match message:
                case Routes():
                    self.routes.update(message)
                    self._gone = {model for model in self._gone if self.node in self.routes.holders(model)}
                case Load(model):
                    self._spawn(self._load(model))
                case Unload(model):
                    self._spawn(self._unload(model))
                case Report():
                    self._send(Resident(self.resident()))
                case Refused(model, reason):
                    self.routes.refused(model, reason)
                case Drain(timeout_s):
                    self._spawn(self._drain(timeout_s))
                case Tracing():
                    self._adopt_tracing(message)
                case TraceShare(ask, scope, serial, take):
                    self._send(TraceShareLeft(ask, self.plane.tracer.left(scope, serial, take)))
                case TraceGive(scope, serial, count):
                    self.plane.tracer.give(scope, serial, count)
                case TraceChanged(ask) | TraceCountLeft(ask):
                    waiting = self._asked.pop(ask, None)
                    if waiting is not None and not waiting.done():
                        waiting.set_result(message)
        log.warning("the node actor is gone: stopping")
        on_end()

    async def _load(self, model: str) -> None:
        started = time.perf_counter()
        try:
            await self.plane.router.load(model)
            size = self.plane.router.memory_bytes(model)
        except AdaserveError as exc:
            self._send(Loaded(model, error=str(exc)))
            return
        self._send(Loaded(model, size_bytes=size, load_s=time.perf_counter() - started))

    async def _unload(self, model: str) -> None:
        try:
            await self.plane.router.unload(model)
        except AdaserveError as exc:
            log.warning("unload failed", extra={"model": model, "error": str(exc)})
        self._send(Unloaded(model))

    async def _drain(self, timeout_s: float) -> None:
        """Wait up to `timeout_s` for the requests this server's engines accepted to be answered (the table it has
        sends it no more: `leaving`), then say which models still had some. From now on it is not ready: health
        checks tell load balancers to send it no more either."""
        self.plane.stopping = True
        engines = self.plane.router.all_engines()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.gather(*(engine.wait_idle() for engine in engines)), timeout_s)
        self._send(Drained(sorted({engine.model.name for engine in engines if not engine.idle})))

    # -- the cluster's trace settings ------------------------------------------------------------------------------
    def _adopt_tracing(self, tracing: Tracing) -> None:
        """Trace under the cluster's settings `tracing` (unless this server has newer ones), and say so."""
        error = ""
        if tracing.version > self._tracing:
            try:
                self.plane.tracer.adopt(tracing.state, tracing.shares)
                self._tracing = tracing.version
            except AdaserveError as exc:  # this node cannot trace so (its --trace-config differs): it says why
                error = str(exc)
                log.error("cannot take the cluster's trace settings", extra={"error": error})
        self._send(Traced(tracing.version, error))

    async def change_trace(self, model: str, changes: dict[str, list[str] | None]) -> None:
        """A trace setting request made here, for the whole cluster: checked here (a bad one is refused before any
        node has it), then applied by the controller to the cluster's settings and sent to every node, this one
        too. A ClusterChangeError names the nodes that did not confirm them (those that did trace so now)."""
        tracer = self.plane.tracer
        tracer.check(tracer.state.changed(tracer.initial, model, changes))
        answer: TraceChanged = await self._ask_controller(
            lambda ask: TraceChange(ask, model, changes, tracer.initial, tracer.state),
            "the trace settings may have reached some nodes only; read them on each node, or send the request again",
        )
        if answer.error:
            raise ClusterChangeError(f"the trace settings were not changed: {answer.error}")
        if answer.missing:
            nodes = "; ".join(f"{node}: {why}" for node, why in sorted(answer.missing.items()))
            raise ClusterChangeError(
                f"trace settings changed, but {len(answer.missing)} node(s) did not confirm them ({nodes}); every "
                "other node traces so now, and the controller sends them again to a node that did not answer until it "
                "does"
            )

    async def trace_left(self, model: str) -> int | None:
        """What is left of the `trace_count` model `model`'s requests draw on (the server's, for ""), in the whole
        cluster (`ClusterTracing.left`); None where this server's own count stands (no change was made for the
        cluster). A ClusterChangeError when the controller cannot tell."""
        scope = self.plane.tracer.scope_of(model)
        answer: TraceCountLeft = await self._ask_controller(
            lambda ask: TraceCountRead(ask, scope), "read the trace settings again"
        )
        if answer.error:
            raise ClusterChangeError(f"the cluster's trace count cannot be read: {answer.error}")
        return answer.left

    async def _ask_controller(self, question: Callable[[int], FromNode], otherwise: str) -> Any:
        """The controller's answer to `question` (made with its `ask`), sent up through the node actor; a
        ClusterChangeError, saying `otherwise`, when it does not answer within TRACE_CHANGE_TIMEOUT_S."""
        ask = next(self._asks)
        waiting = self._asked[ask] = asyncio.get_running_loop().create_future()
        self._send(question(ask))
        try:
            return await asyncio.wait_for(waiting, TRACE_CHANGE_TIMEOUT_S)
        except TimeoutError:
            raise ClusterChangeError(
                f"the cluster's controller did not answer within {TRACE_CHANGE_TIMEOUT_S:g} s: {otherwise}"
            ) from None
        finally:
            self._asked.pop(ask, None)

    def resident(self) -> dict[str, int]:
        """The models loaded and ready here, with their bytes."""
        router = self.plane.router
        return {
            name: router.memory_bytes(name)
            for name, engine in router.engines.items()
            if engine.state is EngineState.READY
        }

    async def _report_counts(self) -> None:
        meter = LoadMeter()
        while True:
            await asyncio.sleep(REPORT_EVERY_S)
            queued, capacity = meter.sample(self.plane.router.engines)
            wanted = self.plane.tracer.wanting()  # scopes whose share of the count ran out: the controller gives more
            if self._counts or capacity or any(queued.values()) or wanted:
                counts, self._counts = dict(self._counts), Counter()
                self._send(Requests(counts, queued, capacity, wanted))

    def _ask_to_place(self, model: str, avoid: list[str]) -> None:
        try:
            size = self.plane.router.repository.read(model).artifact.stat().st_size
        except (AdaserveError, OSError):
            size = 0  # a model the repository cannot read: the node it is placed on says why
        self._send(Place(model, size, avoid))

    # -- where a request goes -------------------------------------------------------------------------------------
    @property
    def leaving(self) -> bool:
        """The table has this node no more (it is being drained, or its server restarted and holds nothing yet):
        requests that arrive here are forwarded to the nodes the table names, not served by the engines here."""
        table = self.routes.table
        return table.version > 0 and self.node not in table.nodes

    def _here(self, model: str, hops: int) -> bool:
        """Serve it here: the model is loaded and ready on this node, which the table still has; or it was
        forwarded as often as a request may be; or the repository has no such model (this node's answer names the
        problem: a 404, or a 400 for a name no model can have)."""
        if self.plane.router.ready(model) and not self.leaving:
            return True
        return hops >= MAX_HOPS or (not self.routes.holders(model) and not self.plane.router.repository.holds(model))

    async def relay(
        self,
        model: str,
        hops: int,
        send: Callable[[NodeAddress, dict[str, str]], Awaitable[Answer]],
        begin: Callable[[], Trace | None] = lambda: None,
        failed: str | None = None,
    ) -> tuple[Answer, Trace | None] | None:
        """Send a request for `model` to where it is served, with `send` (which forwards it to a node, with the
        headers of its trace context), and return its answer; None when it is to be served here. A node that does
        not answer (its server died, or its machine) is avoided and the request is sent once more, to another
        replica or wherever the controller places the model then (inference is idempotent); a second failure is a
        503 naming both nodes. `begin` begins its trace here when it is first sent (None: not traced), as the node
        serving it would have: each send is a forward of the trace, which comes back with the answer for the
        caller to finish once it is answered (and is finished here when it fails). `failed`: the node its first
        send (`shortcut`'s) did not answer on, for a request sent once already, and counted."""
        if hops == 0 and failed is None:
            self._counts[model] += 1
        if self._here(model, hops):
            return None
        avoid: list[str] = []
        failures = 0
        if failed is not None:
            self._failed_once(model, failed, avoid)
            failures = 1
        if self.node in self.routes.holders(model):  # the table says here, but it is gone (unloaded by hand, failed)
            avoid.append(self.node)
            if model not in self._gone:
                self._gone.add(model)
                self._send(Unloaded(model))  # the controller takes it off its books and places it again
        trace: Trace | None = None
        try:
            while True:
                node, address = await self.routes.target(model, avoid)
                if node == self.node:
                    self.plane.tracer.finish(trace)  # what the forwards that failed stamped; served here now
                    return None
                self.forwards[(model, node)] += 1
                if failures == 0:  # sampled once, at its first send
                    trace = begin()
                forward, context = trace.forward(node) if trace is not None else (None, {})
                try:
                    return await send(address, context), trace
                except ForwardFailed:
                    failures += 1
                    if failures > 1:
                        raise
                    self._failed_once(model, node, avoid)
                finally:
                    if forward is not None:
                        forward.end()
        except BaseException:
            self.plane.tracer.finish(trace)
            raise

    def _failed_once(self, model: str, node: str, avoid: list[str]) -> None:
        """A request's first send, to `node`, was not answered: it is sent once more, elsewhere."""
        avoid.append(node)
        self.retries[model] += 1
        log.warning("forwarded request failed: sending it again", extra={"model": model, "node": node})

    def shortcut(self, request: Request, answer: Callable[[Response | None], None]) -> Callable[[], None] | None:
        """The HTTP server's shortcut (`HttpServer`): an inference request (V2, POST) for a model held elsewhere,
        that nothing here would trace, sent on a connection to its holder already open and idle, with no task and
        none of the app's layers, which cost about as much CPU as the forward's own reads and writes
        (`benchmarks.cluster.forwarding`). `answer` gets the holder's answer, or None when the holder did not
        answer: the request then takes the app's path (`relay`, told which node failed) as if it had come so.
        Returns what to call when its client goes away; None when it does not take the request (the app's path
        serves it)."""
        match = _INFER_PATH.match(request.path) if request.method == "POST" else None
        if match is None or self.forwarder.credentials.required.get("inference") is not None:
            return None
        model = unquote(match[1])
        hops = _hops(request.headers.get(HOPS))
        holders = self.routes.holders(model)
        if not holders or self.node in holders or self._here(model, hops) or not self.plane.tracer.off(model):
            return None
        node, address = self.routes.turn(model, holders)

        def answered(outcome: HolderAnswer | Exception) -> None:
            if isinstance(outcome, HolderAnswer):
                status, headers, body = relayed(outcome)
                answer(Response(status, body, headers.pop("content-type"), headers))
                return
            if not isinstance(outcome, StaleConnection):  # a connection the holder had closed: not its failure
                request.state["failed"] = node
            answer(None)

        cancel = self.forwarder.http_now(address, request, {HOPS: str(hops + 1)}, answered)
        if cancel is not None:
            if hops == 0:
                self._counts[model] += 1
            self.forwards[(model, node)] += 1
        return cancel

    async def run_stage(
        self, model: str, inputs: dict[str, np.ndarray], rows: int, parameters: dict[str, Any], query: Trace | None
    ) -> ModelAnswer | None:
        """A DAG query's stage, run where `model` is served (`stages.py`): its answer; None when that is here. A
        stage of a traced `query` sent to another node is traced as the query's child."""
        return await self.stages.run(model, inputs, rows, parameters, query)

    # -- the frontends' hooks ---------------------------------------------------------------------------------
    def rest_route(self, category: str, handler: Handler) -> Handler:
        """`handler` behind the cluster (`create_app`'s `model_routes`): the statistics routes answer for every
        replica (`statistics`); a model's trace settings are the cluster's, answered (and changed) on any node; on
        any other route, which names a model, a request for a model held elsewhere is forwarded and answered with
        what comes back."""
        if category == "trace":
            return handler
        return self._rest_statistics(handler) if category == "statistics" else self._rest_relay(category, handler)

    def _rest_relay(self, category: str, handler: Handler) -> Handler:
        async def routed(request: Request) -> Response:
            if request.method == "HEAD":  # an answer without its body: nothing to forward
                return await handler(request)
            hops = _hops(request.headers.get(HOPS))

            async def send(node: NodeAddress, context: dict[str, str]) -> tuple[int, dict[str, str], bytes]:
                extra = {HOPS: str(hops + 1), **context}
                return await self.forwarder.http(
                    node, request.method, request.path, request.headers, request.body, extra, category
                )

            def begin() -> Trace | None:  # an inference request, traced as the handler would trace it here
                if category != "inference":
                    return None
                trace = self.plane.tracer.begin(request.params["model"], "", lambda: request.headers)
                if trace is not None:
                    trace.stamp("HTTP_RECV_START", request.received_ns)
                    trace.stamp("HTTP_RECV_END", request.complete_ns)
                return trace

            failed = request.state.get("failed")  # the node the shortcut sent it to did not answer
            result = await self.relay(request.params["model"], hops, send, begin, failed)
            if result is None:
                return await handler(request)
            (status, headers, body), trace = result
            sent = self.plane.tracer.sent(trace, "HTTP") if trace is not None else None
            return Response(status, body, headers.pop("content-type"), headers, sent)

        return routed

    def _rest_statistics(self, handler: Handler) -> Handler:
        async def statistics(request: Request) -> Response:
            if _hops(request.headers.get(HOPS)):  # another node asking for this one's own
                return await handler(request)
            return json_response(
                await self.statistics(request.params.get("model", ""), request.params.get("version", ""))
            )

        return statistics

    async def grpc_relay(self, rpc: str, model: str, raw: bytes, context: grpc.aio.ServicerContext) -> bytes | None:
        """The gRPC servicer's `relay`: a call for a model held elsewhere, sent there as its bytes (a ModelInfer
        traced as the servicer would trace it here)."""
        metadata = tuple(context.invocation_metadata() or ())
        hops = _hops(next((str(v) for k, v in metadata if k == HOPS), None))
        arrived_ns = time.perf_counter_ns()

        def begin() -> Trace | None:
            trace = self.plane.tracer.begin(model, "", lambda: dict(metadata)) if rpc == "ModelInfer" else None
            if trace is not None:
                trace.stamp("GRPC_WAITREAD_START", arrived_ns)
                trace.stamp("GRPC_WAITREAD_END", arrived_ns)
            return trace

        async def send(node: NodeAddress, trace_context: dict[str, str]) -> bytes:
            return await self.forwarder.grpc(node, rpc, raw, metadata, {HOPS: str(hops + 1), **trace_context})

        relayed = await self.relay(model, hops, send, begin)
        if relayed is None:
            return None
        answer, trace = relayed
        if trace is not None:
            sent_ns = time.perf_counter_ns()
            self.plane.tracer.sent(trace, "GRPC")(sent_ns, sent_ns)
        return answer

    # -- what the node server says of the cluster ---------------------------------------------------------------
    async def statistics(self, name: str = "", version: str = "") -> dict[str, Any]:
        """Triton's statistics of model `name` (of every model, if empty) for the whole cluster: this server's own
        and what each other node holding it (every other node) says of its own, merged (`merge_statistics`). A node
        that does not answer within PEER_TIMEOUT_S is left out, and logged; a 503 names them when none answers."""
        peers = [n for n in (self.routes.holders(name) if name else self.routes.table.nodes) if n != self.node]
        try:
            rows = self.plane.statistics(name, version)["model_stats"]
        except ModelNotReadyError:  # not held here
            if not peers:
                raise ModelNotReadyError(
                    f"model '{name}' is held by no node: it has statistics once a request places it"
                ) from None
            rows = []
        path = "/v2/models/stats"
        if name:
            path = f"/v2/models/{quote(name)}{f'/versions/{quote(version)}' if version else ''}/stats"
        answers, missing = await self._ask_peers(
            peers, path, "statistics", lambda body: json.loads(body)["model_stats"]
        )
        if missing and not rows and not answers:
            raise ModelNotReadyError(f"no node answered for the statistics: {'; '.join(missing.values())}")
        if missing:
            log.warning("statistics without some nodes", extra={"model": name, "missing": missing})
        return {"model_stats": merge_statistics([*rows, *(row for own in answers.values() for row in own)])}

    async def metrics(self) -> bytes:
        """The cluster-wide exposition (`GET /metrics/cluster`): this server's own series and each other node's
        (its `/metrics`), each with its `node` label, one family per name; a node that does not answer within
        PEER_TIMEOUT_S is left out, logged, and shown by `adaserve_cluster_node_up` 0."""
        peers = [node for node in self.routes.table.nodes if node != self.node]
        answers, missing = await self._ask_peers(peers, "/metrics", "metrics", _families)
        if missing:
            log.warning("metrics without some nodes", extra={"missing": missing})
        return exposition(cluster_families(self.node, node_families(self.plane), answers, missing))

    async def _ask_peers(
        self, nodes: list[str], path: str, category: str, read: Callable[[bytes], Answer]
    ) -> tuple[dict[str, Answer], dict[str, str]]:
        """GET `path` (of API `category`) of each node in `nodes` at once, asked as a forwarded request (it asks no
        further), each answer's body read by `read`: what the nodes answered, and why each other one is left out
        (no answer within PEER_TIMEOUT_S, a refusal, an answer `read` cannot read)."""
        asking = (self._ask(node, path, category, read) for node in nodes)
        answers = await asyncio.gather(*asking, return_exceptions=True)
        got: dict[str, Answer] = {}
        missing: dict[str, str] = {}
        for node, answer in zip(nodes, answers, strict=True):
            if isinstance(answer, BaseException):
                missing[node] = str(answer)
            else:
                got[node] = answer
        return got, missing

    async def _ask(self, node: str, path: str, category: str, read: Callable[[bytes], Answer]) -> Answer:
        address = self.routes.table.nodes[node]
        asking = self.forwarder.http(address, "GET", path, {}, b"", {HOPS: "1"}, category)
        try:
            status, _, body = await asyncio.wait_for(asking, PEER_TIMEOUT_S)
        except TimeoutError:
            raise ForwardFailed(f"node {node} did not answer within {PEER_TIMEOUT_S:g} s") from None
        if status != 200:
            raise ForwardFailed(f"node {node} answered {status}: {body[:300].decode(errors='replace')}")
        return read(body)

    def held_elsewhere(self) -> dict[str, list[str]]:
        return {
            model: [node for node in nodes if node != self.node]
            for model, nodes in self.routes.table.replicas.items()
            if any(node != self.node for node in nodes)
        }

    def state(self) -> ClusterState:
        table = self.routes.table
        return ClusterState(
            dict(self.forwards), dict(self.retries), table.replicas, list(table.nodes), table.decisions, table.version
        )


def _families(body: bytes) -> list[Metric]:
    """A node's exposition (its `/metrics`) as metric families."""
    return list(text_string_to_metric_families(body.decode()))


def _hops(value: str | None) -> int:
    """A forwarded request's hop count (0 for a client's)."""
    return int(value) if value is not None and value.isdigit() else 0
