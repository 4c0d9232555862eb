"""The REST adapter: the whole route table in one place, a thin layer over the data plane.

Routes follow the Open Inference Protocol (KServe V2) and Triton's HTTP extensions that `tritonclient.http`
calls (model configuration, repository, statistics, logging, system shared memory), and KServe's V1 protocol
(TensorFlow Serving's REST predict API) under `/v1`. Errors are answered as
`{"error": "<message>"}` with the status their exception class names; anything unexpected is a 500 and the server
keeps serving.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import functools
import logging
from collections.abc import Callable, Sequence
from typing import Any

from prometheus_client.exposition import CONTENT_TYPE_LATEST

from adaserve.config import Interface
from adaserve.errors import AdaserveError, InvalidInputError, ModelNotReadyError, RequestTooLargeError
from adaserve.server.content_coding import OFFLOAD_BYTES, CodingError, decode_body
from adaserve.server.dataplane import DataPlane
from adaserve.server.http import Application, BodyLimit, Handler, Request, Response, Routes
from adaserve.server.kserve_v1 import decode_predict, encode_predict
from adaserve.server.metrics import exposition, node_families
from adaserve.server.protocol import InferenceRequest, InferenceResponse, request_bytes_limit
from adaserve.server.rest_codec import HEADER_LENGTH, decode_json, decode_request, encode_json, encode_response
from adaserve.server.restrictions import Restrictions
from adaserve.server.shared_memory import RegionKind

log = logging.getLogger("adaserve.rest")

#: An answer's body and headers from an inference response (the V2 codec's, or the V1 protocol's).
Encoder = Callable[[InferenceResponse], tuple[bytes, dict[str, str]]]


def json_response(document: Any, status: int = 200) -> Response:
    return Response(status, encode_json(document))


def error_response(status: int, message: str) -> Response:
    return json_response({"error": message}, status)


def health_response(ok: bool, document: dict[str, Any]) -> Response:
    """A health answer: the status says it (200, or 503 when not live or ready), as Triton's and tritonclient's
    checks read it; the body says it too, as the Open Inference Protocol's REST spec has it (`{"live": true}`,
    `{"ready": true}`, `{"name": ..., "ready": true}`) and KServe's client reads it."""
    return json_response(document, 200 if ok else 503)


def create_app(
    plane: DataPlane,
    max_body_bytes: int,
    restrictions: Restrictions | None = None,
    model_routes: Callable[[str, Handler], Handler] | None = None,
    internal: Sequence[tuple[str, str, Handler]] = (),
) -> tuple[Application, BodyLimit]:
    """The application, which routes a request to its handler and maps every error to a response, and the limit on
    each route's body (`body_limit`). `max_body_bytes`: the most a request body may be once decompressed.
    `restrictions`: the API categories that answer only requests with a given header (`--restricted-api`).
    `model_routes`: wraps the handler of every route that names a model, and of the statistics routes, given the
    route's API category (on a cluster, it forwards the requests for models held elsewhere, and statistics answer
    for every replica: `adaserve.distributed.member`). `internal`: (method, template, handler) of the routes only
    other node servers call (on a cluster, relayed gRPC calls: `adaserve.distributed.forward`), added as they are:
    the handler checks what it needs to."""
    restrictions = restrictions or Restrictions()

    async def body(request: Request, limit: int = max_body_bytes, what: str = "request body") -> bytes:
        """The request's body with its content codings undone, refused (413) past `limit` bytes before it is
        decompressed further or parsed; `what` it is, for the message."""
        if len(request.body) > limit:
            raise RequestTooLargeError(f"{what} of {len(request.body)} bytes exceeds the limit of {limit} bytes")
        return await decode_body(request.headers.get("content-encoding"), request.body, limit, what)

    def model_limit(name: str, config: Interface) -> tuple[int, str]:
        """The most bytes a request body for model `name` may be, and what that is, for a refusal's message."""
        limit = min(request_bytes_limit(config), max_body_bytes)
        return limit, f"request body for model '{name}' (at most {config.max_batch_size} rows of its inputs)"

    async def inference_body(request: Request) -> tuple[Interface, bytes]:
        """What the model asked for takes, and the request's body held to the most that can be (a bomb of JSON
        numbers stops there, not at the server's limit)."""
        name, version = _model(request)
        config = plane.check_model(name, version)
        return config, await body(request, *model_limit(name, config))

    async def infer(request: Request) -> Response:
        config, content = await inference_body(request)
        decode = functools.partial(
            decode_request, config, _model(request)[1], content, request.headers.get(HEADER_LENGTH), plane.shared_memory
        )
        inference = await asyncio.to_thread(decode) if len(content) > OFFLOAD_BYTES else decode()
        return await answer(request, inference, encode_response)

    async def predict(request: Request) -> Response:
        """KServe's V1 protocol (server/kserve_v1.py)."""
        name, version = _model(request)
        _, content = await inference_body(request)
        metadata = plane.model_metadata(name, version)
        inference, columnar = decode_predict(name, version, decode_json(content), metadata)
        return await answer(request, inference, lambda response: (encode_json(encode_predict(response, columnar)), {}))

    async def answer(request: Request, inference: InferenceRequest, encode: Encoder) -> Response:
        """Run `inference` (traced when the tracer samples it) and encode its answer: `encode` gives the body and
        its headers (a `content-type` among them where it is not JSON)."""
        trace = plane.tracer.begin(inference.model_name, inference.id, lambda: request.headers)
        if trace is None:
            content, headers = encode(await plane.infer(inference))
            return Response(200, content, headers.pop("content-type", "application/json"), headers, compressible=True)
        trace.stamp("HTTP_RECV_START", request.received_ns)
        trace.stamp("HTTP_RECV_END", request.complete_ns)
        try:
            content, headers = encode(await plane.infer(inference, trace))
        except BaseException:
            plane.tracer.finish(trace)  # what it stamped before it failed
            raise
        content_type = headers.pop("content-type", "application/json")
        return Response(200, content, content_type, headers, plane.tracer.sent(trace, "HTTP"), compressible=True)

    async def list_models(request: Request) -> Response:
        """The repository's models and DAG queries by name, `{"models": [...]}`: KServe's `GET /v1/models` and
        `GET /v2/models` (its servers answer both; the Open Inference Protocol names neither)."""
        return json_response({"models": [row["name"] for row in plane.repository_index()]})

    async def v1_live(request: Request) -> Response:
        """KServe's V1 liveness, at the root, as its model server and client have it."""
        return json_response({"status": "alive"})

    async def v1_model_ready(request: Request) -> Response:
        name = request.params["model"]
        if not plane.model_ready(name):  # an unknown name raises: a 404
            raise ModelNotReadyError(f"model '{name}' is not ready")
        return json_response({"name": name, "ready": True})

    async def live(request: Request) -> Response:
        live = plane.live()
        return health_response(live, {"live": live})

    async def ready(request: Request) -> Response:
        ready = plane.ready()
        return health_response(ready, {"ready": ready})

    async def server_metadata(request: Request) -> Response:
        return json_response(plane.metadata())

    async def model_metadata(request: Request) -> Response:
        return json_response(plane.model_metadata(*_model(request)))

    async def model_ready(request: Request) -> Response:
        name, version = _model(request)
        ready = plane.model_ready(name, version)
        return health_response(ready, {"name": name, "ready": ready})

    async def model_config(request: Request) -> Response:
        return json_response(plane.model_config(*_model(request)))

    async def model_stats(request: Request) -> Response:
        return json_response(plane.statistics(*_model(request)))

    async def all_stats(request: Request) -> Response:
        return json_response(plane.statistics())

    async def json_body(request: Request) -> dict[str, Any]:
        """The body as a JSON object; empty: an empty one."""
        content = await body(request)
        if not content.strip():
            return {}
        document = decode_json(content)
        if not isinstance(document, dict):
            raise InvalidInputError("request body must be a JSON object")
        return document

    async def repository_index(request: Request) -> Response:
        ready_only = bool((await json_body(request)).get("ready", False))
        return json_response(plane.repository_index(ready_only=ready_only))

    async def load(request: Request) -> Response:
        await plane.load(request.params["model"], _repository_parameters(await json_body(request)))
        return Response(200)

    async def unload(request: Request) -> Response:
        await plane.unload(request.params["model"], _repository_parameters(await json_body(request)))
        return Response(200)

    async def trace_settings(request: Request) -> Response:
        changes = _trace_changes(await json_body(request)) if request.method == "POST" else None
        return json_response(await plane.trace_settings(request.params.get("model", ""), changes))

    async def log_settings(request: Request) -> Response:
        return json_response(plane.log_settings(await json_body(request) if request.method == "POST" else None))

    def shared_memory_kind(request: Request) -> RegionKind:
        return "cuda" if request.path.startswith("/v2/cudasharedmemory") else "system"

    async def shared_memory_status(request: Request) -> Response:
        return json_response(plane.shared_memory.status(request.params.get("region", ""), shared_memory_kind(request)))

    async def shared_memory_register(request: Request) -> Response:
        body = await json_body(request)
        if "key" not in body or "byte_size" not in body:
            raise InvalidInputError("registering a system shared memory region needs 'key' and 'byte_size'")
        plane.shared_memory.register(request.params["region"], body["key"], body.get("offset", 0), body["byte_size"])
        return Response(200)

    async def cuda_shared_memory_register(request: Request) -> Response:
        body = await json_body(request)
        handle = body.get("raw_handle")
        if not isinstance(handle, dict) or not isinstance(handle.get("b64"), str) or "byte_size" not in body:
            raise InvalidInputError(
                "registering a CUDA shared memory region needs 'raw_handle' ({\"b64\": the IPC handle in base64}), "
                "'device_id' and 'byte_size'"
            )
        try:
            raw = base64.b64decode(handle["b64"], validate=True)
        except binascii.Error:
            raise InvalidInputError("raw_handle: 'b64' is not base64") from None
        plane.shared_memory.register_cuda(request.params["region"], raw, body.get("device_id", 0), body["byte_size"])
        return Response(200)

    async def shared_memory_unregister(request: Request) -> Response:
        plane.shared_memory.unregister(request.params.get("region", ""), shared_memory_kind(request))
        return Response(200)

    async def metrics(request: Request) -> Response:  # Prometheus asks for gzip
        return Response(200, exposition(node_families(plane)), CONTENT_TYPE_LATEST, compressible=True)

    async def cluster_metrics(request: Request) -> Response:
        assert plane.cluster is not None
        return Response(200, await plane.cluster.metrics(), CONTENT_TYPE_LATEST, compressible=True)

    routes = Routes()

    inference_handlers: set[Handler] = set()  # as routed (guarded, where restricted), for `body_limit`

    def add(method: str, template: str, category: str, handler: Handler) -> None:
        """A route in one of Triton's API categories, which `restrictions` may guard with a header."""
        if model_routes is not None and ("{model}" in template or category == "statistics"):
            handler = model_routes(category, handler)
        if restrictions.restricts(category):
            handler = _guarded(restrictions, category, handler)
        if category == "inference":
            inference_handlers.add(handler)
        routes.add(method, template, handler)

    for prefix in ("/v2/models/{model}", "/v2/models/{model}/versions/{version}"):
        add("POST", f"{prefix}/infer", "inference", infer)  # first: the hot path matches at once
    for method, template, handler in internal:  # next: on a cluster, the other hot path
        routes.add(method, template, handler)
    add("GET", "/v2/health/live", "health", live)
    add("GET", "/v2/health/ready", "health", ready)
    add("GET", "/v2", "metadata", server_metadata)
    add("GET", "/v2/models", "metadata", list_models)
    add("GET", "/v2/models/stats", "statistics", all_stats)
    for prefix in ("/v2/models/{model}", "/v2/models/{model}/versions/{version}"):
        add("GET", prefix, "metadata", model_metadata)
        add("GET", f"{prefix}/ready", "health", model_ready)
        add("GET", f"{prefix}/config", "model-config", model_config)
        add("GET", f"{prefix}/stats", "statistics", model_stats)
    add("GET", "/", "health", v1_live)
    add("GET", "/v1/models", "metadata", list_models)
    for prefix in ("/v1/models/{model}", "/v1/models/{model}/versions/{version}"):
        add("POST", f"{prefix}:predict", "inference", predict)
    add("GET", "/v1/models/{model}", "health", v1_model_ready)
    add("POST", "/v2/repository/index", "model-repository", repository_index)
    add("POST", "/v2/repository/models/{model}/load", "model-repository", load)
    add("POST", "/v2/repository/models/{model}/unload", "model-repository", unload)
    for prefix in ("/v2", "/v2/models/{model}"):
        add("GET", f"{prefix}/trace/setting", "trace", trace_settings)
        add("POST", f"{prefix}/trace/setting", "trace", trace_settings)
    add("GET", "/v2/logging", "logging", log_settings)
    add("POST", "/v2/logging", "logging", log_settings)
    for kind in ("system", "cuda"):
        for prefix in (f"/v2/{kind}sharedmemory", f"/v2/{kind}sharedmemory/region/{{region}}"):
            add("GET", f"{prefix}/status", "shared-memory", shared_memory_status)
            add("POST", f"{prefix}/unregister", "shared-memory", shared_memory_unregister)
    add("POST", "/v2/systemsharedmemory/region/{region}/register", "shared-memory", shared_memory_register)
    add("POST", "/v2/cudasharedmemory/region/{region}/register", "shared-memory", cuda_shared_memory_register)
    add("GET", "/metrics", "metrics", metrics)  # Prometheus scrapes each node
    if plane.cluster is not None:  # a path of its own: a server without it answers 404, not its node's series
        add("GET", "/metrics/cluster", "metrics", cluster_metrics)

    async def app(request: Request) -> Response:
        resolved = routes.resolve(request.method, request.path)
        if not resolved:
            return error_response(404, f"no such endpoint: {request.path}")
        if isinstance(resolved, list):
            refused = error_response(405, f"method {request.method} is not allowed here: {request.path}")
            refused.headers["allow"] = ", ".join(sorted(set(resolved)))
            return refused
        handler, request.params = resolved
        try:
            return await handler(request)
        except AdaserveError as exc:
            return error_response(exc.http_status, str(exc))
        except CodingError as exc:
            refused = error_response(exc.status, str(exc))
            refused.headers.update(exc.headers)
            return refused
        except Exception as exc:
            log.exception("unexpected error", extra={"path": request.path})
            return error_response(500, f"internal error: {type(exc).__name__}: {exc}")

    def body_limit(method: str, path: str) -> tuple[int, str] | None:
        """The most a body may be for an inference route, and what that is: what its model can take, so the HTTP
        layer refuses a larger body at its headers, before reading it (30 connections sent 60 MiB each to a
        16-row model). None for any other route, and where the handler will refuse the request anyway."""
        resolved = routes.resolve(method, path)
        if not isinstance(resolved, tuple) or resolved[0] not in inference_handlers:
            return None
        name, version = resolved[1]["model"], resolved[1].get("version", "")
        try:
            return model_limit(name, plane.check_model(name, version))
        except AdaserveError:
            return None  # an unknown model, say: its handler answers that, naming it

    return app, body_limit


def _guarded(restrictions: Restrictions, category: str, handler: Handler) -> Handler:
    async def guarded(request: Request) -> Response:
        restrictions.check(category, lambda: request.headers)
        return await handler(request)

    return guarded


def _model(request: Request) -> tuple[str, str]:
    return request.params["model"], request.params.get("version", "")


def _repository_parameters(body: dict[str, Any]) -> list[str]:
    """The names of a repository load's or unload's `parameters`."""
    parameters = body.get("parameters", {})
    if not isinstance(parameters, dict):
        raise InvalidInputError("'parameters' must be an object")
    return list(parameters)


def _trace_changes(body: dict[str, Any]) -> dict[str, list[str] | None]:
    """A trace setting request's JSON (each value a string, a list of strings for the level, or null to clear)
    as the data plane takes it."""
    changes: dict[str, list[str] | None] = {}
    for name, value in body.items():
        values = value if isinstance(value, list) else [value]
        if value is not None and not all(isinstance(v, str | int) and not isinstance(v, bool) for v in values):
            raise InvalidInputError(f"trace setting '{name}' must be a string (or a list of strings), got {value!r}")
        changes[name] = None if value is None else [str(v) for v in values]
    return changes
