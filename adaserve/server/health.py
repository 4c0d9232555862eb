"""The standard gRPC health service (`grpc.health.v1.Health`), which Kubernetes' gRPC probes, Envoy and
`grpc_health_probe` call, answered from the server's readiness.

The server as a whole (service "") and `inference.GRPCInferenceService` are SERVING while the server is ready
(`DataPlane.ready`: the startup models loaded and every engine ready, and not stopping), else NOT_SERVING. Any other
service name is NOT_FOUND to Check and SERVICE_UNKNOWN to Watch, as the protocol asks. It is in Triton's `health`
category of restricted APIs.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from adaserve.errors import NotAllowedError
from adaserve.server.dataplane import DataPlane
from adaserve.server.restrictions import Restrictions

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
        last = None
        while True:
            status = self.status(request.service)
            if status != last:
                yield Status(status=status)
                last = status
            await asyncio.sleep(WATCH_PERIOD_S)

    async def _check_allowed(self, context: grpc.aio.ServicerContext) -> None:
        try:
            self.restrictions.check_call("health", context)
        except NotAllowedError as exc:
            await context.abort(exc.grpc_code, str(exc))
