"""The REST adapter: the whole `/v2` route table in one place, a thin layer over the data plane.

Routes follow the Open Inference Protocol (KServe V2) and Triton's HTTP extensions that `tritonclient.http`
calls (model configuration, repository, statistics). Errors are answered as `{"error": "<message>"}` with the
status their exception class names; anything unexpected is a 500 and the server keeps serving.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from adaserve.errors import AdaserveError, InvalidInputError, PayloadTooLargeError
from adaserve.server.dataplane import DataPlane
from adaserve.server.metrics import render_metrics
from adaserve.server.rest_codec import HEADER_LENGTH, decode_request, encode_json, encode_response

log = logging.getLogger("adaserve.rest")

Handler = Callable[[Request], Awaitable[Response]]


def json_response(document: Any, status: int = 200) -> Response:
    return Response(encode_json(document), status_code=status, media_type="application/json")


def error_response(exc: AdaserveError) -> Response:
    return json_response({"error": str(exc)}, exc.http_status)


def create_app(plane: DataPlane, *, max_request_bytes: int) -> Starlette:
    """The ASGI application; `max_request_bytes` bounds an inference request body (413 beyond it)."""

    async def body_of(request: Request) -> bytes:
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > max_request_bytes:
            raise PayloadTooLargeError(f"request body of {declared} bytes exceeds the limit of {max_request_bytes}")
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > max_request_bytes:
                raise PayloadTooLargeError(f"request body exceeds the limit of {max_request_bytes} bytes")
            chunks.append(chunk)
        return b"".join(chunks)

    async def json_body(request: Request) -> dict[str, Any]:
        body = await body_of(request)
        if not body.strip():
            return {}
        try:
            document = msgspec.json.decode(body)
        except Exception as exc:
            raise InvalidInputError(f"request body is not valid JSON: {exc}") from None
        if not isinstance(document, dict):
            raise InvalidInputError("request body must be a JSON object")
        return document

    async def live(request: Request) -> Response:
        return Response(status_code=200 if plane.live() else 503)

    async def ready(request: Request) -> Response:
        return Response(status_code=200 if plane.ready() else 503)

    async def server_metadata(request: Request) -> Response:
        return json_response(plane.metadata())

    async def model_metadata(request: Request) -> Response:
        return json_response(plane.model_metadata(*_model(request)))

    async def model_ready(request: Request) -> Response:
        return Response(status_code=200 if plane.model_ready(*_model(request)) else 503)

    async def model_config(request: Request) -> Response:
        return json_response(plane.model_config(*_model(request)))

    async def model_stats(request: Request) -> Response:
        return json_response(plane.statistics(*_model(request)))

    async def all_stats(request: Request) -> Response:
        return json_response(plane.statistics())

    async def infer(request: Request) -> Response:
        name, version = _model(request)
        plane.check_model(name, version)
        body = await body_of(request)
        inference = decode_request(name, version, body, request.headers.get(HEADER_LENGTH))
        content, headers = encode_response(await plane.infer(inference))
        return Response(content, headers=headers)

    async def repository_index(request: Request) -> Response:
        document = await json_body(request)
        return json_response(plane.repository_index(ready_only=bool(document.get("ready", False))))

    async def load(request: Request) -> Response:
        await json_body(request)
        await plane.load(request.path_params["model"])
        return Response(status_code=200)

    async def unload(request: Request) -> Response:
        await json_body(request)
        await plane.unload(request.path_params["model"])
        return Response(status_code=200)

    async def metrics(request: Request) -> Response:
        content, media_type = render_metrics(plane.router)
        return Response(content, media_type=media_type)

    model = "/v2/models/{model}"
    versioned = "/v2/models/{model}/versions/{version}"
    routes: list[BaseRoute] = [
        Route("/v2/health/live", live),
        Route("/v2/health/ready", ready),
        Route("/v2", server_metadata),
        Route("/v2/models/stats", all_stats),
        *(
            route
            for prefix in (model, versioned)
            for route in (
                Route(prefix, model_metadata),
                Route(f"{prefix}/ready", model_ready),
                Route(f"{prefix}/config", model_config),
                Route(f"{prefix}/stats", model_stats),
                Route(f"{prefix}/infer", infer, methods=["POST"]),
            )
        ),
        Route("/v2/repository/index", repository_index, methods=["POST"]),
        Route("/v2/repository/models/{model}/load", load, methods=["POST"]),
        Route("/v2/repository/models/{model}/unload", unload, methods=["POST"]),
        Route("/metrics", metrics),
    ]
    return Starlette(routes=routes, exception_handlers={AdaserveError: _on_error, Exception: _on_crash})


def _model(request: Request) -> tuple[str, str]:
    return request.path_params["model"], request.path_params.get("version", "")


async def _on_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, AdaserveError)
    return error_response(exc)


async def _on_crash(request: Request, exc: Exception) -> Response:
    log.exception("unexpected error", extra={"path": request.url.path})
    return json_response({"error": f"internal error: {type(exc).__name__}: {exc}"}, 500)
