"""The control channel between a node actor and its node server: a stream socket of length-prefixed msgpack
messages (`messages.py`). Either end's exit closes the socket, which the other reads as the end: a node server
whose actor is gone stops (Ray restarted the actor elsewhere, or the node left), so no orphan keeps serving."""

from __future__ import annotations

import asyncio
import socket
import struct
from typing import Any, Generic, TypeVar

import msgspec

_LENGTH = struct.Struct("<I")
_encoder = msgspec.msgpack.Encoder()

Incoming = TypeVar("Incoming")


class Channel(Generic[Incoming]):
    """One end of the channel, on the running event loop; `receive` returns None once the other end is gone."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, incoming: Any) -> None:
        """`incoming`: the type (a union of tagged messages) the other end sends."""
        self._reader, self._writer = reader, writer
        self._decoder = msgspec.msgpack.Decoder(incoming)

    @classmethod
    async def open(cls, sock: socket.socket, incoming: Any) -> Channel[Incoming]:
        reader, writer = await asyncio.open_unix_connection(sock=sock)
        return cls(reader, writer, incoming)

    def send(self, message: msgspec.Struct) -> None:
        """Queue a message; a closed channel drops it (the other end is gone and will not read it)."""
        if self._writer.is_closing():
            return
        body = _encoder.encode(message)
        self._writer.write(_LENGTH.pack(len(body)) + body)

    async def receive(self) -> Incoming | None:
        try:
            head = await self._reader.readexactly(_LENGTH.size)
            (size,) = _LENGTH.unpack(head)
            message: Incoming = self._decoder.decode(await self._reader.readexactly(size))
            return message
        except (asyncio.IncompleteReadError, ConnectionError):
            return None

    def close(self) -> None:
        self._writer.close()
