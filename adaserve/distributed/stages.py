"""A DAG query on a cluster: the node it arrives at runs its planner, and each stage runs where its model is served.

A stage whose model is loaded and ready on this node runs on this node's engine, as on one server. Any other is one
Open Inference Protocol request to a node that holds the model, taken as a forwarded client request is
(`ClusterMember.relay`): counted for the model where the query arrived, so the controller learns its rate; placed
by the controller when no node holds it (every stage and request waiting for it waits for that one placement);
sent once more, to another replica or wherever the model is placed then, when its node fails; else a 503 naming
the node. Its tensors are encoded once, as binary tensor data (`adaserve.bench.codec.encode_http`), and go on the
kept-alive connections forwarded requests take; the answer's outputs and parameters come back decoded
(`rest_codec.decode_response`).

A query loads on every node, whichever nodes hold its models: its wiring is checked against the repository's model
configs, and only the options ready on this node are timed at load (`timed_at_load`).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import numpy as np

from adaserve.bench.codec import decode_http_error, encode_http
from adaserve.config import ModelConfig
from adaserve.distributed.forward import HOPS, ForwardFailed
from adaserve.distributed.messages import NodeAddress
from adaserve.errors import (
    AdaserveError,
    InferenceError,
    InvalidInputError,
    ModelNotFoundError,
    NotAllowedError,
    RequestTooLargeError,
)
from adaserve.planner.planner import ModelAnswer
from adaserve.server.protocol import Tensor
from adaserve.server.request_parameters import IGNORED_KEY
from adaserve.server.rest_codec import HEADER_LENGTH, decode_response
from adaserve.server.trace import Trace

if TYPE_CHECKING:
    from adaserve.distributed.member import ClusterMember

#: The error a holder's refusal of a stage is raised as, by its HTTP status (any other: an InferenceError).
_REFUSALS: dict[int, type[AdaserveError]] = {
    error.http_status: error for error in (InvalidInputError, NotAllowedError, ModelNotFoundError, RequestTooLargeError)
}


class ClusterStages:
    """The option models of this node's DAG queries as the cluster has them (the catalog's `OptionModels`), and
    the stages that run on other nodes."""

    def __init__(self, member: ClusterMember) -> None:
        self.member = member
        self.router = member.plane.router
        self._configs: dict[str, ModelConfig] = {}  # each option model's config, as its query was checked against

    def config(self, model: str) -> ModelConfig:
        """The repository's config of `model`, wherever it is held (or none holds it yet)."""
        config = self._configs[model] = self.router.repository.read(model).config
        return config

    def start_delay_s(self, model: str) -> float | None:
        """0 when a node holds `model` (this one, or another: the hop is part of the planning latency its runs
        teach the planner); None when none does: placing it is a load of unknown time, so the planner passes it
        over, as one server passes over a model it cannot load, unless no option of the node is held anywhere."""
        held = self.router.ready(model) or any(node != self.member.node for node in self.member.routes.holders(model))
        return 0.0 if held else None

    def timed_at_load(self, model: str) -> bool:
        """Only a model ready here. Timing a model is a request for it: at a node's start, before any client asked
        for anything, timing every option would have the controller place every option model of every query;
        and the node's own runs, not those of whichever node held a model at load, are what it plans with. The
        others are timed when a request first finds them held (`QueryPlanner.probe`)."""
        return self.router.ready(model)

    async def run(
        self, model: str, inputs: dict[str, np.ndarray], rows: int, parameters: dict[str, Any], query: Trace | None
    ) -> ModelAnswer | None:
        """A stage of `model` on `inputs`, run where the model is served: its answer, or None when that is here. A
        stage of a traced `query` is its child trace here, from when it is first sent until its answer is read, and
        the holder's trace of it is a child of that one's forward."""
        config = self._configs.get(model) or self.config(model)
        path = f"/v2/models/{quote(model)}/infer"
        encoded: tuple[bytes, dict[str, str]] | None = None

        async def send(node: NodeAddress, context: dict[str, str]) -> ModelAnswer:
            nonlocal encoded
            if encoded is None:  # once, and only when the stage leaves this node
                tensors = [  # the catalog checked that what the query passes fits each input's datatype and shape
                    Tensor(spec.name, spec.datatype, (rows, *spec.row_shape), inputs[spec.name])
                    for spec in config.inputs
                ]
                body, length = encode_http(tensors, [spec.name for spec in config.outputs], parameters)
                encoded = body, {"content-type": "application/octet-stream", HEADER_LENGTH: str(length)}
            body, headers = encoded
            status, answered, answer = await self.member.forwarder.http(
                node, "POST", path, headers, body, {HOPS: "1", **context}, "inference"
            )
            if status == 503:  # not ready there (unloaded since the table, or its queue full): another may be
                raise ForwardFailed(f"node {node.http} did not run '{model}': {decode_http_error(answer)}")
            if status != 200:
                refusal = _REFUSALS.get(status, InferenceError)
                raise refusal(f"model '{model}' on node {node.http}: {decode_http_error(answer)}")
            outputs, returned = decode_response(answer, answered.get(HEADER_LENGTH))
            returned.pop(IGNORED_KEY, None)  # the query says itself which of its parameters went unused
            return ModelAnswer(outputs, returned)

        tracer = self.member.plane.tracer

        def begin() -> Trace | None:
            if query is None:
                return None
            trace = tracer.child(query, model)
            trace.stamp("REQUEST_START", time.perf_counter_ns())
            return trace

        relayed = await self.member.relay(model, 0, send, begin)
        if relayed is None:
            return None
        answer, trace = relayed
        if trace is not None:
            trace.stamp("REQUEST_END", time.perf_counter_ns())
            tracer.finish(trace)
        return answer
