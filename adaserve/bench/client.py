"""Async senders for pre-encoded requests, over HTTP (our HTTP/1.1 client) or gRPC (grpc.aio), behind one interface.

With `compression`, HTTP request bodies are compressed once, when they are encoded before the run (so the
generator's cost per request does not grow; the server's decompression is what the run measures), and every request
asks for a compressed answer, which the sender decompresses to read, as any client must. gRPC compresses each
message in grpcio's core, on the channel.

A sender never raises for a failed inference: it returns an `Outcome` whose error kind is named here, in one
place, so the report can count errors by kind whatever the protocol. Measured on this project's 2-core machine,
the HTTP sender costs about half the CPU per request of aiohttp or tritonclient's aio client (README: "The
generator's own cost").
"""

from __future__ import annotations

import asyncio
import ssl
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal
from urllib.parse import quote, urlsplit

import grpc
import msgspec
from pydantic import BaseModel, ConfigDict, model_validator

from adaserve.bench.codec import (
    HEADER_LENGTH,
    ModelInfo,
    Payload,
    Tensor,
    decode_grpc_parameters,
    decode_http_error,
    decode_http_parameters,
    encode_grpc,
    encode_http,
    model_info_from_grpc,
    model_info_from_json,
)
from adaserve.server.content_coding import CODINGS, CodingError, compress, decompress
from adaserve.server.http_client import ConnectFailed, ConnectionPool
from adaserve.server.protos import grpc_service_pb2 as service_pb2

Protocol = Literal["http", "grpc"]
Compression = Literal["gzip", "deflate"]

#: Error kinds that mean the transport failed rather than the server answering: such a run is not valid.
TRANSPORT_ERRORS = frozenset({"connect_failed", "connection_lost"})

_GRPC_SERVICE = "/inference.GRPCInferenceService/"
#: Longest wait for the model checks that precede a run.
_PREFLIGHT_S = 10.0
#: The most a compressed answer may inflate to.
_MAX_ANSWER_BYTES = 1 << 30
_GRPC_COMPRESSION = {"gzip": grpc.Compression.Gzip, "deflate": grpc.Compression.Deflate}


class ServerUnreachable(Exception):
    """The server did not answer at all (refused, reset, timed out): nothing can be measured."""


class ModelUnavailable(Exception):
    """The server answered but the model is unknown or not ready."""


@dataclass(frozen=True, slots=True)
class Outcome:
    """What one inference returned: the response parameters, or an error kind and its text."""

    parameters: dict[str, Any]
    error_kind: str | None = None
    error: str | None = None


class ClientTls(BaseModel):
    """TLS to the server: the CA its certificate must come from (default: the system's), and the client's own
    certificate and key, for a server that asks for one (mutual TLS)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    ca_cert: Path | None = None
    client_cert: Path | None = None
    client_key: Path | None = None

    @model_validator(mode="after")
    def _usable(self) -> ClientTls:
        if (self.client_cert is None) != (self.client_key is None):
            raise ValueError("a client certificate needs its key, and a key its certificate")
        for path in (self.ca_cert, self.client_cert, self.client_key):
            if path is not None and not path.is_file():
                raise ValueError(f"{path}: no such file")
        try:
            self.ssl_context()
        except ssl.SSLError as exc:
            raise ValueError(f"the TLS files cannot be used: {exc.reason or exc}") from None
        return self

    def ssl_context(self, create: Callable[..., ssl.SSLContext] = ssl.create_default_context) -> ssl.SSLContext:
        """The client's context, made by `create` (another library's own, such as gevent's, where it needs one)."""
        context = create(cafile=self.ca_cert)
        if self.client_cert is not None:
            context.load_cert_chain(self.client_cert, self.client_key)
        context.set_alpn_protocols(["http/1.1"])
        return context

    def grpc_credentials(self) -> grpc.ChannelCredentials:
        def read(path: Path | None) -> bytes | None:
            return path.read_bytes() if path is not None else None

        return grpc.ssl_channel_credentials(read(self.ca_cert), read(self.client_key), read(self.client_cert))


def client_tls(
    wanted: bool, ca_cert: Path | None, client_cert: Path | None, client_key: Path | None
) -> ClientTls | None:
    """A command's TLS flags: None unless TLS is `wanted` or a file is given; ValidationError naming what is wrong."""
    if not wanted and ca_cert is None and client_cert is None and client_key is None:
        return None
    return ClientTls(ca_cert=ca_cert, client_cert=client_cert, client_key=client_key)


class Sender(ABC):
    """Sends pre-encoded requests to one server; create it inside the event loop that will use it."""

    @abstractmethod
    def encode(
        self, model: str, version: str, tensors: Sequence[Tensor], outputs: Sequence[str], params: Mapping[str, Any]
    ) -> Payload:
        """Encode one request once, before the run."""

    @abstractmethod
    async def model_info(self, model: str, version: str) -> ModelInfo:
        """Metadata of a ready model; raises ServerUnreachable or ModelUnavailable."""

    @abstractmethod
    async def infer(self, payload: Payload) -> Outcome:
        """Send one request and wait for its answer; failures come back as an Outcome, never raised."""

    @abstractmethod
    async def close(self) -> None:
        """Release connections."""


class HttpSender(Sender):
    """KServe V2 REST with binary tensors; each payload is a complete HTTP/1.1 request, built before the run."""

    def __init__(
        self, url: str, timeout_s: float, tls: ClientTls | None = None, compression: Compression | None = None
    ) -> None:
        parts = urlsplit(url if "://" in url else f"http://{url}")
        host, port = parts.hostname or "127.0.0.1", parts.port or (443 if tls else 80)
        self._base = f"{host}:{port}"
        self._pool = ConnectionPool(host, port, timeout_s, tls.ssl_context() if tls is not None else None)
        self._compression = compression

    def encode(
        self, model: str, version: str, tensors: Sequence[Tensor], outputs: Sequence[str], params: Mapping[str, Any]
    ) -> Payload:
        body, header_length = encode_http(tensors, outputs, params)
        headers = {HEADER_LENGTH: str(header_length), "Content-Type": "application/octet-stream"}
        if self._compression is not None:
            body = compress(self._compression, body)  # the header length counts the body before compression
            headers |= {"Content-Encoding": self._compression, "Accept-Encoding": self._compression}
        return Payload(model, self._request("POST", self._model_path(model, version) + "/infer", body, headers))

    async def model_info(self, model: str, version: str) -> ModelInfo:
        path = self._model_path(model, version)
        try:
            ready = await asyncio.wait_for(self._pool.request(self._request("GET", path + "/ready")), _PREFLIGHT_S)
            if ready.status != 200:
                detail = decode_http_error(ready.body) or f"HTTP {ready.status}"
                raise ModelUnavailable(f"model {model!r} is not ready at {self._base}: {detail}")
            response = await asyncio.wait_for(self._pool.request(self._request("GET", path)), _PREFLIGHT_S)
        except (OSError, ValueError) as exc:
            raise ServerUnreachable(f"cannot reach {self._base}: {_describe(exc)}") from None
        if response.status != 200:
            raise ModelUnavailable(
                f"model {model!r}: no metadata from {self._base}: {decode_http_error(response.body)}"
            )
        try:
            return model_info_from_json(msgspec.json.decode(response.body))
        except (ValueError, KeyError, TypeError) as exc:
            raise ModelUnavailable(f"model {model!r}: unreadable metadata from {self._base}: {exc}") from None

    async def infer(self, payload: Payload) -> Outcome:
        try:
            response = await self._pool.request(payload.body)
        except TimeoutError as exc:
            return Outcome({}, "timeout", str(exc))
        except ConnectFailed as exc:
            return Outcome({}, "connect_failed", str(exc))
        except OSError as exc:
            return Outcome({}, "connection_lost", str(exc) or type(exc).__name__)
        except ValueError as exc:
            return Outcome({}, "bad_response", str(exc))
        body, coding = response.body, response.content_encoding
        if coding not in (None, "identity"):
            if coding not in CODINGS:
                return Outcome(
                    {}, "bad_response", f"an answer in Content-Encoding {coding!r}, which is not gzip or deflate"
                )
            try:
                body = decompress(coding, body, _MAX_ANSWER_BYTES, "the answer")
            except CodingError as exc:
                return Outcome({}, "bad_response", str(exc))
        if response.status != 200:
            return Outcome({}, f"http_{response.status}", decode_http_error(body))
        try:
            return Outcome(decode_http_parameters(body, response.header_length))
        except ValueError as exc:
            return Outcome({}, "bad_response", str(exc))

    async def close(self) -> None:
        await self._pool.close()

    def _request(self, method: str, path: str, body: bytes = b"", headers: Mapping[str, str] | None = None) -> bytes:
        lines = [f"{method} {path} HTTP/1.1", f"Host: {self._base}", f"Content-Length: {len(body)}"]
        lines += [f"{name}: {value}" for name, value in (headers or {}).items()]
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body

    @staticmethod
    def _model_path(model: str, version: str) -> str:
        path = f"/v2/models/{quote(model, safe='')}"
        return f"{path}/versions/{quote(version, safe='')}" if version else path


class GrpcSender(Sender):
    """KServe V2 gRPC (`inference.GRPCInferenceService`) over one HTTP/2 channel; bodies pass through as bytes."""

    def __init__(
        self, url: str, timeout_s: float, tls: ClientTls | None = None, compression: Compression | None = None
    ) -> None:
        self._target = url.split("://", 1)[-1]
        self._timeout_s = timeout_s
        options = [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)]
        coding = None if compression is None else _GRPC_COMPRESSION[compression]
        if tls is None:
            self._channel = grpc.aio.insecure_channel(self._target, options=options, compression=coding)
        else:
            self._channel = grpc.aio.secure_channel(
                self._target, tls.grpc_credentials(), options=options, compression=coding
            )
        self._infer = self._channel.unary_unary(_GRPC_SERVICE + "ModelInfer")
        self._ready = self._channel.unary_unary(
            _GRPC_SERVICE + "ModelReady",
            request_serializer=service_pb2.ModelReadyRequest.SerializeToString,
            response_deserializer=service_pb2.ModelReadyResponse.FromString,
        )
        self._metadata = self._channel.unary_unary(
            _GRPC_SERVICE + "ModelMetadata",
            request_serializer=service_pb2.ModelMetadataRequest.SerializeToString,
            response_deserializer=service_pb2.ModelMetadataResponse.FromString,
        )

    def encode(
        self, model: str, version: str, tensors: Sequence[Tensor], outputs: Sequence[str], params: Mapping[str, Any]
    ) -> Payload:
        return Payload(model, encode_grpc(model, version, tensors, outputs, params))

    async def model_info(self, model: str, version: str) -> ModelInfo:
        try:
            ready = await self._ready(service_pb2.ModelReadyRequest(name=model, version=version), timeout=_PREFLIGHT_S)
            if not ready.ready:
                raise ModelUnavailable(f"model {model!r} is not ready at {self._target}")
            metadata = await self._metadata(
                service_pb2.ModelMetadataRequest(name=model, version=version), timeout=_PREFLIGHT_S
            )
        except grpc.aio.AioRpcError as exc:
            kind, text = _grpc_error(exc)
            if kind in TRANSPORT_ERRORS or kind == "timeout":
                raise ServerUnreachable(f"cannot reach {self._target}: {text}") from None
            raise ModelUnavailable(f"model {model!r} at {self._target}: {text}") from None
        return model_info_from_grpc(metadata)

    async def infer(self, payload: Payload) -> Outcome:
        try:
            body = await self._infer(payload.body, timeout=self._timeout_s)
        except grpc.aio.AioRpcError as exc:
            return Outcome({}, *_grpc_error(exc))
        return Outcome(decode_grpc_parameters(body))

    async def close(self) -> None:
        await self._channel.close()


def create_sender(
    protocol: Protocol,
    url: str,
    timeout_s: float,
    tls: ClientTls | None = None,
    compression: Compression | None = None,
) -> Sender:
    """The sender for `protocol` (over TLS when `tls` is given, compressing when `compression` is); call it inside
    the running event loop."""
    if protocol == "http":
        return HttpSender(url, timeout_s, tls, compression)
    if protocol == "grpc":
        return GrpcSender(url, timeout_s, tls, compression)
    raise ValueError(f"unknown protocol {protocol!r}; expected http or grpc")


def _grpc_error(exc: grpc.aio.AioRpcError) -> tuple[str, str]:
    """(kind, text): a server's UNAVAILABLE answer is a measurement, a dead connection is not."""
    code, text = exc.code(), exc.details() or exc.code().name
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return "timeout", text
    if code == grpc.StatusCode.UNAVAILABLE:
        lowered = text.lower()
        if "connect" in lowered and "reset" not in lowered:
            return "connect_failed", text
        if any(word in lowered for word in ("socket closed", "reset", "broken pipe", "goaway", "eof")):
            return "connection_lost", text
    return f"grpc_{code.name.lower()}", text


def _describe(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError):
        return f"no answer within {_PREFLIGHT_S:g} s"
    if isinstance(exc, ConnectFailed):
        return f"{exc} (is the server running, and on this port?)"
    return str(exc) or type(exc).__name__
