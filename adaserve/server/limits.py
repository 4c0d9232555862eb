"""What clients may hold of the server, and for how long.

A client can hold the server's memory with request bodies and its open files with connections, and hold either
for as long as it keeps sending a byte now and then. Each is bounded here, the way nginx and Apache's
mod_reqtimeout bound them, so that an attack gets a cheap, early refusal and the other clients notice nothing.
The HTTP frontend (`server/http.py`) enforces every limit; gRPC's core enforces those it has (`server/app.py`):
the message size, the connection count, the handshake's deadline and the idle timeout.

- Request bodies: one at most `max_body_bytes`, and all of them, on every connection, at most `body_budget_bytes`
  together (30 connections each holding 60 MiB of an unfinished body took the server from 174 MB to 2.0 GB).
- Time: a request's URL and headers must all arrive within `header_timeout_s` of its first byte, and its body
  within `body_timeout_s` plus a second per `body_min_rate` bytes, however the bytes trickle in (one header byte
  every 25 s restarted a 75 s idle timer for ever).
- Connections: at most `max_connections`; past it, the one quiet longest makes room (19,980 held connections
  exhausted the server's open files: new connections failed, and gRPC with them).
"""

from __future__ import annotations

from dataclasses import dataclass

#: A body up to this size may fill the whole budget; a larger one only `LARGE_SHARE` of it, so that small requests
#: always find room beside large bodies that slow clients hold.
SMALL_BODY_BYTES = 64 * 1024
LARGE_SHARE = 0.75


@dataclass(frozen=True)
class ClientLimits:
    """The frontends' limits (`adaserve serve` sets each from a flag)."""

    max_body_bytes: int = 64 * 1024 * 1024
    body_budget_bytes: int = 128 * 1024 * 1024  # every connection's request bodies together
    max_connections: int = 4096  # each frontend's
    idle_timeout_s: float = 75.0  # a connection quiet between requests (nginx's keep-alive timeout)
    header_timeout_s: float = 30.0  # a request's URL and headers, from its first byte (or the connection's start)
    body_timeout_s: float = 30.0  # a request's body, from its headers' end, before `body_min_rate` credit
    body_min_rate: float = 64 * 1024  # bytes a second a body earns its time at
    #: A connection younger than this in what it is doing is not closed to make room for a new one
    #: (`HttpProtocol.evictable`): at the limit with every connection that young, the new one is refused.
    evict_after_s: float = 0.25
    #: The largest gRPC message received; None: what the repository's models take at start
    #: (`server/app.py`'s `grpc_message_bytes`).
    grpc_message_bytes: int | None = None

    def __post_init__(self) -> None:
        for name, value in self.__dict__.items():
            if value is not None and value <= 0:
                raise ValueError(f"limit {name} must be above 0, got {value}")
        if self.body_budget_bytes * LARGE_SHARE < self.max_body_bytes:
            raise ValueError(
                f"a body budget of {self.body_budget_bytes} bytes cannot hold a body of the largest size, "
                f"{self.max_body_bytes} bytes (a large body may fill {LARGE_SHARE:.0%} of it)"
            )

    def body_time_s(self, received: int) -> float:
        """How long a body may have taken once `received` bytes of it have arrived."""
        return self.body_timeout_s + received / self.body_min_rate


class BodyBudget:
    """The request bodies all connections hold in memory, as they arrive, wait their turn and are answered."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.held = 0

    def take(self, size: int, body_bytes: int) -> bool:
        """Hold `size` more bytes for a body that will then be `body_bytes` long; False, holding nothing, when
        that would pass its share of the budget."""
        cap = self.total if body_bytes <= SMALL_BODY_BYTES else int(self.total * LARGE_SHARE)
        if self.held + size > cap:
            return False
        self.held += size
        return True

    def give_back(self, size: int) -> None:
        self.held -= size
