"""The node actor: one per Ray node, starting and supervising that node's `adaserve serve`.

The node server is a process of its own (today's whole server: frontends, engine, workers), not the actor: Ray's
actor runtime stays off the request path, and the server's event loop is not shared with Ray's. The actor holds the
node's CPUs in Ray's books, so nothing else is scheduled onto the cores the server's Packrat plans. It talks to the
server over a socket pair (`control.py`): orders down (load, unload, the routing table), reports up (placement
requests and request counts, which it passes to the controller). When the server dies the actor tells the
controller (its replicas are gone) and starts it again; when the actor dies the socket closes and the server stops.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import sys
from dataclasses import dataclass, field
from typing import Any

from adaserve.distributed.control import Channel
from adaserve.distributed.messages import (
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
    Unload,
    Unloaded,
)

log = logging.getLogger("adaserve.cluster")

#: How long a node server has to start (its frontends up and its control channel answering).
START_TIMEOUT_S = 120.0
#: How long a node server has to stop after SIGTERM (its accepted requests finish) before it is killed.
STOP_TIMEOUT_S = 15.0
#: Waits between restarts of a node server that keeps dying: from the first, doubling to the last.
RESTART_BACKOFF_S = (1.0, 30.0)


@dataclass(frozen=True)
class NodeSettings:
    """What a node server is started with: the model repository (the same path on every node), where it listens,
    and any further `adaserve serve` flags (limits, TLS, logging). The controller gives each node its ports."""

    repository: str
    host: str = "127.0.0.1"
    http_port: int = 8000
    grpc_port: int = 8001
    serve_args: tuple[str, ...] = ()
    cpus: tuple[int, ...] = field(default=())  # the cores the server may use (`--cpus`); () all of the node's

    @property
    def address(self) -> NodeAddress:
        return NodeAddress(f"{self.host}:{self.http_port}", f"{self.host}:{self.grpc_port}")


class NodeServer:
    """The Ray actor (made with `ray.remote` by the controller) that runs node `name`'s server."""

    def __init__(self, name: str, settings: NodeSettings, controller: str, namespace: str, log_level: str) -> None:
        from adaserve.logs import configure_logging

        configure_logging(log_level)
        self.name = name
        self.settings = settings
        self._controller_name, self._namespace = controller, namespace
        self._process: asyncio.subprocess.Process | None = None
        self._channel: Channel[FromNode] | None = None
        self._loads: dict[str, asyncio.Future[Loaded]] = {}
        self._unloads: dict[str, asyncio.Future[None]] = {}
        self._resident: asyncio.Future[dict[str, int]] | None = None
        self._stopping = False
        self._supervisor: asyncio.Task[None] | None = None

    # -- called by the controller ----------------------------------------------------------------------------------
    async def start(self) -> tuple[NodeAddress, int]:
        """Start the node server and keep it running; its address and process id once it answers."""
        if self._process is None or self._process.returncode is not None:
            await self._start_server()
            self._supervisor = asyncio.get_running_loop().create_task(self._supervise())
        assert self._process is not None
        return self.settings.address, self._process.pid

    async def load(self, model: str) -> Loaded:
        future = self._loads.get(model)
        if future is None:
            future = self._loads[model] = asyncio.get_running_loop().create_future()
            self._send(Load(model))
        return await asyncio.shield(future)

    async def unload(self, model: str) -> None:
        future = self._unloads.get(model)
        if future is None:
            future = self._unloads[model] = asyncio.get_running_loop().create_future()
            self._send(Unload(model))
        await asyncio.shield(future)

    async def routes(self, table: Routes) -> None:
        self._send(table)

    async def refused(self, model: str, reason: str) -> None:
        self._send(Refused(model, reason))

    async def resident(self) -> dict[str, int]:
        """What the node server holds now (a restarted controller rebuilds its books from this)."""
        if self._resident is None or self._resident.done():
            self._resident = asyncio.get_running_loop().create_future()
            self._send(Report())
        return await asyncio.shield(self._resident)

    async def info(self) -> tuple[NodeAddress, int]:
        assert self._process is not None
        return self.settings.address, self._process.pid

    async def stop(self) -> None:
        """Stop the node server: SIGTERM (its accepted requests finish), then SIGKILL past STOP_TIMEOUT_S."""
        self._stopping = True
        if self._supervisor is not None:
            self._supervisor.cancel()
        process = self._process
        if process is None or process.returncode is not None:
            return
        process.terminate()
        try:
            await asyncio.wait_for(process.wait(), STOP_TIMEOUT_S)
        except TimeoutError:
            process.kill()
            await process.wait()

    # -- the node server ---------------------------------------------------------------------------------------
    async def _start_server(self) -> None:
        ours, theirs = socket.socketpair()
        settings = self.settings
        command = [
            sys.executable,
            "-m",
            "adaserve",
            "serve",
            "--model-repository",
            settings.repository,
            "--host",
            settings.host,
            "--http-port",
            str(settings.http_port),
            "--grpc-port",
            str(settings.grpc_port),
            "--cluster-node",
            self.name,
            "--cluster-control",
            str(theirs.fileno()),
            *(["--cpus", ",".join(map(str, settings.cpus))] if settings.cpus else []),
            *settings.serve_args,
        ]
        self._process = await asyncio.create_subprocess_exec(*command, pass_fds=(theirs.fileno(),))
        theirs.close()
        self._channel = await Channel[FromNode].open(ours, FromNode)
        asyncio.get_running_loop().create_task(self._follow(self._channel))
        await asyncio.wait_for(self.resident(), START_TIMEOUT_S)  # answered once its control channel is read

    async def _supervise(self) -> None:
        """Start the node server again when it dies, after telling the controller its replicas are gone."""
        wait_s = RESTART_BACKOFF_S[0]
        while not self._stopping:
            assert self._process is not None
            code = await self._process.wait()
            if self._stopping:
                return
            log.error("node server died: restarting it", extra={"node": self.name, "exit_code": code})
            await self._controller().node_lost.remote(self.name, f"its server exited with code {code}")
            await asyncio.sleep(wait_s)
            try:
                await self._start_server()
            except (OSError, TimeoutError) as exc:
                log.error("node server did not start", extra={"node": self.name, "error": str(exc)})
                wait_s = min(2 * wait_s, RESTART_BACKOFF_S[1])
                continue
            wait_s = RESTART_BACKOFF_S[0]
            address, pid = await self.info()
            await self._controller().node_ready.remote(self.name, address, pid, {})

    async def _follow(self, channel: Channel[FromNode]) -> None:
        """The node server's reports: answers to this actor's orders, and what goes on to the controller."""
        while (message := await channel.receive()) is not None:
            match message:
                case Loaded(model):
                    if (future := self._loads.pop(model, None)) is not None and not future.done():
                        future.set_result(message)
                case Unloaded(model):
                    done = self._unloads.pop(model, None)
                    if done is None:  # not ordered: the server lost it (unloaded through its API, say)
                        self._controller().unloaded.remote(self.name, model)
                    elif not done.done():
                        done.set_result(None)
                case Resident(models):
                    if self._resident is not None and not self._resident.done():
                        self._resident.set_result(models)
                case Place(model, size, avoid):
                    self._controller().place.remote(self.name, model, size, avoid)
                case Requests():
                    self._controller().requests.remote(self.name, message)
        gone = ConnectionError(f"node {self.name}'s server stopped")
        for pending in (*self._loads.values(), *self._unloads.values(), self._resident):
            if pending is not None and not pending.done():
                pending.set_exception(gone)
        self._loads.clear()
        self._unloads.clear()

    def _send(self, message: Routes | Load | Unload | Report | Refused) -> None:
        if self._channel is None:
            raise ConnectionError(f"node {self.name}'s server is not running")
        self._channel.send(message)

    def _controller(self) -> Any:
        """The controller's actor handle (looked up each time: it may have restarted)."""
        import ray

        return ray.get_actor(self._controller_name, namespace=self._namespace)
