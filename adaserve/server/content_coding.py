"""HTTP content codings (RFC 9110 §8.4): request bodies that arrive compressed, and answers compressed for clients
that ask.

`tritonclient.http` compresses a request with `request_compression_algorithm="gzip"` or `"deflate"` (it sends
`Content-Encoding`) and asks for a compressed answer with `response_compression_algorithm` (`Accept-Encoding`);
Triton's HTTP server does both. This one reads a compressed body on every route, and compresses the answers that
Triton does, successful inference answers (V2 `infer`, and V1 `predict`), and `/metrics` for a Prometheus scrape,
and no others: tritonclient reads a compressed body only there. Its error parser reads an error's body as it comes,
and its asyncio client (aiohttp, which asks for gzip on every request, with decompression off) reads metadata as it
comes; both failed on compressed answers. `deflate` is the zlib format (RFC 9110 §8.4.1.2), which is what
tritonclient and curl send.

gRPC compresses in grpcio's core: it reads compressed requests by itself (and holds them to the size limit once
decompressed), and compresses answers at `--grpc-infer-response-compression-level`, one of
`GRPC_COMPRESSION_LEVELS`.

A compressed body is held to the same limit as a plain one after it is decompressed, and decompression stops at
that limit, so a small body that would inflate to gigabytes (a "zip bomb") costs the server the limit at most. Bodies
over `OFFLOAD_BYTES`, or that may inflate to more, and compressed bodies over `INLINE_COMPRESSED_BYTES` are
(de)compressed on a worker thread (zlib releases the GIL), so a large one does not stall the other connections.
"""

from __future__ import annotations

import asyncio
import zlib
from collections.abc import Callable
from typing import ParamSpec, TypeVar

__all__ = [
    "CODINGS",
    "GRPC_COMPRESSION_LEVELS",
    "CodingError",
    "accepted_coding",
    "compress",
    "decode_body",
    "decompress",
    "encode_body",
]

P = ParamSpec("P")
T = TypeVar("T")

#: The codings this server reads and writes, and zlib's window bits for each (16 + : gzip's header and trailer).
_WBITS = {"gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}
CODINGS = tuple(_WBITS)
#: zlib's level for answers. Level 1 keeps most of the gain on inference outputs (JSON numbers, float tensors) at a
#: fraction of the default level's CPU (`benchmarks/http_compression.py` measures both).
COMPRESSION_LEVEL = 1
#: Triton's names for gRPC's compression levels, in gRPC's order (`grpc_compression_level`: NONE is 0, HIGH 3).
GRPC_COMPRESSION_LEVELS = ("none", "low", "medium", "high")
#: Bodies larger than this, or that may inflate to more, are (de)compressed off the event loop.
OFFLOAD_BYTES = 1 << 20
#: Compressed bodies larger than this are decompressed off the event loop whatever they inflate to: one of empty
#: gzip members takes about 6 ms of a core.
INLINE_COMPRESSED_BYTES = 64 * 1024
#: gzip members a body may hold (RFC 1952 allows several in a row; a client compresses a body as one): an empty one
#: is 20 bytes, and 4 MiB of them took a third of a second of a core even in linear time.
MAX_GZIP_MEMBERS = 64
#: The chunks a compressed member is fed in: the first, and the most they double to.
_FIRST_CHUNK_BYTES = 64
_LAST_CHUNK_BYTES = 1 << 20


class CodingError(Exception):
    """A request body that cannot be decoded: the HTTP status to answer with, and headers for that answer."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.headers = headers or {}


async def decode_body(content_encoding: str | None, body: bytes, limit: int, what: str = "request body") -> bytes:
    """`body` with the codings that `Content-Encoding` lists undone (the last applied is undone first); CodingError
    for a coding this server does not read (415), data that is not what its coding says (400), or a result over
    `limit` bytes (413)."""
    codings = [coding.strip().lower() for coding in (content_encoding or "").split(",") if coding.strip()]
    for coding in reversed(codings):
        if coding == "identity":
            continue
        if coding not in _WBITS:
            raise CodingError(
                415,
                f"request body's Content-Encoding {coding!r} is not supported; this server reads {', '.join(CODINGS)}",
                {"accept-encoding": ", ".join(CODINGS)},
            )
        if body:
            offload = len(body) > INLINE_COMPRESSED_BYTES or limit > OFFLOAD_BYTES
            body = await _offloaded(offload, decompress, coding, body, limit, what)
    return body


def accepted_coding(accept_encoding: str | None) -> str | None:
    """The coding to answer in: the client's most preferred of `CODINGS` by its q-values (RFC 9110 §12.5.3); None
    to answer as is (no header, nothing this server writes, or `identity` preferred). Malformed entries are
    skipped, as Triton does."""
    if not accept_encoding:
        return None
    weights: dict[str, float] = {}
    for entry in accept_encoding.split(","):
        name, *parameters = entry.split(";")
        name = name.strip().lower()
        weight = 1.0
        for parameter in parameters:
            key, _, value = parameter.partition("=")
            if key.strip().lower() == "q":
                try:
                    weight = float(value)
                except ValueError:
                    weight = -1.0
        if name and 0.0 <= weight <= 1.0:
            weights[name] = weight
    anything = weights.get("*", 0.0)
    best = max(CODINGS, key=lambda coding: weights.get(coding, anything))  # ties: the order of CODINGS
    best_weight = weights.get(best, anything)
    if best_weight <= 0.0 or weights.get("identity", 0.0) > best_weight:
        return None
    return best


async def encode_body(coding: str, body: bytes) -> bytes:
    """`body` compressed in `coding` (one of `CODINGS`)."""
    return await _offloaded(len(body) > OFFLOAD_BYTES, compress, coding, body)


def decompress(coding: str, data: bytes, limit: int, what: str = "request body") -> bytes:
    """Decompress every member of `data` (gzip allows several in a row), producing at most `limit` bytes;
    CodingError naming `what` for data that is not what its coding says (400) or too much of it (413). The load
    generator reads compressed answers with it too.

    Linear in the size of `data`: each member is fed in chunks that start small and double, so what zlib copies
    out as the data after a member's end (`unused_data`) is at most its last chunk. Fed whole, that copy was all
    the rest of `data`, once per member: 4 MiB of empty gzip members took 17 s of a core. At most
    `MAX_GZIP_MEMBERS` members."""
    view = memoryview(data)
    pieces: list[bytes] = []
    size = position = 0
    members = 0
    while position < len(view):
        if members and coding != "gzip":
            raise CodingError(400, f"{what} has {len(view) - position} bytes after the end of its {coding} data")
        members += 1
        if members > MAX_GZIP_MEMBERS:
            raise CodingError(400, f"{what} has more than {MAX_GZIP_MEMBERS} gzip members")
        inflater = zlib.decompressobj(_WBITS[coding])
        chunk = _FIRST_CHUNK_BYTES
        while not inflater.eof:
            if position >= len(view):
                raise CodingError(400, f"{what}'s {coding} data ends before its end marker (truncated)")
            fed = view[position : position + chunk]
            position += len(fed)
            chunk = min(2 * chunk, _LAST_CHUNK_BYTES)
            try:
                piece = inflater.decompress(fed, limit - size + 1)
            except zlib.error as exc:
                raise CodingError(400, f"{what} is not valid {coding} data: {exc}") from None
            size += len(piece)
            if size > limit:
                raise CodingError(413, f"{what} exceeds the limit of {limit} bytes once decompressed ({coding})")
            pieces.append(piece)
        position -= len(inflater.unused_data)  # the next member's start, fed with this one's last chunk
    return b"".join(pieces)


def compress(coding: str, body: bytes) -> bytes:
    """`body` compressed in `coding` (one of `CODINGS`) at `COMPRESSION_LEVEL`."""
    compressor = zlib.compressobj(COMPRESSION_LEVEL, zlib.DEFLATED, _WBITS[coding])
    return compressor.compress(body) + compressor.flush()


async def _offloaded(offload: bool, function: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """`function`'s result, computed on a worker thread if `offload`."""
    if offload:
        return await asyncio.to_thread(function, *args, **kwargs)
    return function(*args, **kwargs)
