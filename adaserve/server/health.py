"""The standard gRPC health service (`grpc.health.v1.Health`), which Kubernetes' gRPC probes, Envoy and
`grpc_health_probe` call, answered from the server's readiness.

The server as a whole (service "") and `inference.GRPCInferenceService` are SERVING while the server is ready
(`DataPlane.ready`: the startup models loaded and every engine ready, and not stopping), else NOT_SERVING. Any other
service name is NOT_FOUND to Check and SERVICE_UNKNOWN to Watch, as the protocol asks. It is in Triton's `health`
category of restricted APIs.

With `--grpc-frontend process` the frontend's process relays Check to the engine and answers Watch from relayed
reads of the status (`relayed_calls`), with the same loop (`watch`). This module imports the engine only to type it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from adaserve.errors import NotAllowedError
from adaserve.server.grpc_relay import RelayedCall
from adaserve.server.restrictions import Restrictions

if TYPE_CHECKING:
    from adaserve.server.dataplane import DataPlane

SERVICES = ("", "inference.GRPCInferenceService")
#: How often a Watch looks at readiness again (it writes only when the status changes).
WATCH_PERIOD_S = 0.5

Status = health_pb2.HealthCheckResponse


class HealthService(health_pb2_grpc.HealthServicer):
    def __init__(self, plane: DataPlane, restrictions: Restrictions | None = None) -> None:
        self.plane = plane
        self.restrictions = restrictions or Restrictions()

    def status(self, service: str) -> int:
        if service not in SERVICES:
            return Status.SERVICE_UNKNOWN
        return Status.SERVING if self.plane.ready() else Status.NOT_SERVING

    async def Check(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        await self._check_allowed(context)
        status = self.status(request.service)
        if status == Status.SERVICE_UNKNOWN:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"unknown service '{request.service}'")
        return Status(status=status)

    async def Watch(self, request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        """The status now, then each change, until the client goes away or the server stops."""
        await self._check_allowed(context)

        async def status() -> int:
            return self.status(request.service)

        async for answer in watch(status):
            yield answer

    def relayed_calls(self) -> dict[str, RelayedCall]:
        """The calls the gRPC frontend's process relays here (`server/grpc_relay.py`): Check, and "Watch", which
        answers the status now, SERVICE_UNKNOWN included, for the frontend's own `watch` loop."""

        async def check(raw: bytes, context: Any) -> bytes:
            return bytes((await self.Check(health_pb2.HealthCheckRequest.FromString(raw), context)).SerializeToString())

        async def status(raw: bytes, context: Any) -> bytes:
            await self._check_allowed(context)
            service = health_pb2.HealthCheckRequest.FromString(raw).service
            return bytes(Status(status=self.status(service)).SerializeToString())

        return {"Check": check, "Watch": status}

    async def _check_allowed(self, context: grpc.aio.ServicerContext) -> None:
        try:
            self.restrictions.check_call("health", context)
        except NotAllowedError as exc:
            await context.abort(exc.grpc_code, str(exc))


async def watch(status: Callable[[], Awaitable[int]]) -> AsyncIterator[Any]:
    """Health's Watch: the `status()` now, then each change, read every WATCH_PERIOD_S, until the client goes away
    or the server stops."""
    last = None
    while True:
        now = await status()
        if now != last:
            yield Status(status=now)
            last = now
        await asyncio.sleep(WATCH_PERIOD_S)
