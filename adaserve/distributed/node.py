"""The node actor: one per Ray node, starting and supervising that node's `adaserve serve`.

The node server is a process of its own (today's whole server: frontends, engine, workers), not the actor: Ray's
actor runtime stays off the request path, and the server's event loop is not shared with Ray's. The actor holds the
node's CPUs in Ray's books, so nothing else is scheduled onto the cores the server's Packrat plans. It talks to the
server over a socket pair (`control.py`): orders down (load, unload, drain, the routing table, the cluster's trace
settings), reports up (placement requests, request counts and trace setting changes, which it passes to the
controller). When the server dies the actor tells the controller (its replicas are gone) and starts it again, under
the cluster's trace settings; when the actor dies the socket closes and the server stops.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import socket
import sys
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any

import msgspec

from adaserve.distributed.control import Channel
from adaserve.distributed.messages import (
    Drain,
    Drained,
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
    ToNode,
    TraceChange,
    TraceChanged,
    TraceCountLeft,
    TraceCountRead,
    Traced,
    TraceGive,
    TraceShare,
    TraceShareLeft,
    Tracing,
    Unload,
    Unloaded,
)
from adaserve.distributed.trace_settings import split

log = logging.getLogger("adaserve.cluster")

#: How long a node server has to start (its frontends up and its control channel answering).
START_TIMEOUT_S = 120.0
#: How long a node server has to stop after SIGTERM (its accepted requests finish) before it is killed.
STOP_TIMEOUT_S = 15.0
#: Waits between restarts of a node server that keeps dying: from the first, doubling to the last.
RESTART_BACKOFF_S = (1.0, 30.0)
#: How often each node server is asked to answer on its control channel (`NodeServer._watch`).
PROBE_EVERY_S = 2.0
#: In a node server's arguments (a trace file's path), replaced by that server's name: servers sharing a machine
#: must not write one file.
NODE_PLACEHOLDER = "{node}"


@dataclass(frozen=True)
class NodeSettings:
    """What a node server is started with: the model repository (the same path on every node), where it listens,
    and any further `adaserve serve` flags (limits, TLS, logging). The controller gives each node its ports.

    `servers` > 1 runs that many servers on the node, on the same ports (SO_REUSEPORT: the kernel spreads the
    connections), each on a group of the node's cores (`core_groups`): one Python frontend cannot keep a large
    machine's cores busy with small models. They hold the same models, so the node is one unit of placement."""

    repository: str
    host: str = "127.0.0.1"
    http_port: int = 8000
    grpc_port: int = 8001
    serve_args: tuple[str, ...] = ()
    servers: int = 1  # node servers on this node, sharing its ports (`--reuse-port`), each on a group of its cores
    unresponsive_s: float = 30.0  # a server (or node actor) alive that answers nothing this long is killed

    @property
    def address(self) -> NodeAddress:
        return NodeAddress(f"{self.host}:{self.http_port}", f"{self.host}:{self.grpc_port}")


def server_arguments(settings: NodeSettings, node: str, index: int) -> list[str]:
    """The further `serve` flags of server `index` of `node`, with `{node}` (a trace file's path) replaced by the
    server's name: the node's, and the server's index on a node of several."""
    name = node if settings.servers == 1 else f"{node}-{index}"
    return [argument.replace(NODE_PLACEHOLDER, name) for argument in settings.serve_args]


class _Server:
    """One `adaserve serve` process of the node, its control channel, and its answers awaited."""

    def __init__(self, process: asyncio.subprocess.Process, channel: Channel[FromNode]) -> None:
        self.process = process
        self.channel = channel
        self.loads: dict[str, asyncio.Future[Loaded]] = {}
        self.unloads: dict[str, asyncio.Future[None]] = {}
        self.asked: dict[type, asyncio.Future[Any]] = {}  # the answer's type → the future of the question asked
        self.traced: dict[int, asyncio.Future[str]] = {}  # trace settings version → its answer (an error, or "")
        self.shares: dict[int, asyncio.Future[int]] = {}  # a `TraceShare`'s ask → what was left
        self.unresponsive = False  # killed by `NodeServer._watch`: alive, it answered nothing
        self._asks = itertools.count(1)

    def load(self, model: str) -> asyncio.Future[Loaded]:
        return self._ask(self.loads, model, Load(model))

    def unload(self, model: str) -> asyncio.Future[None]:
        return self._ask(self.unloads, model, Unload(model))

    def report(self) -> asyncio.Future[dict[str, int]]:
        return self._ask(self.asked, Resident, Report())

    def drain(self, timeout_s: float) -> asyncio.Future[list[str]]:
        return self._ask(self.asked, Drained, Drain(timeout_s))

    def trace(self, tracing: Tracing) -> asyncio.Future[str]:
        return self._ask(self.traced, tracing.version, tracing)

    def share(self, scope: str, serial: int, take: bool) -> asyncio.Future[int]:
        ask = next(self._asks)
        return self._ask(self.shares, ask, TraceShare(ask, scope, serial, take))

    def _ask(self, waiting: dict[Any, asyncio.Future[Any]], key: object, order: ToNode) -> asyncio.Future[Any]:
        """The answer to `order`, sent once however many wait for it (`_follow` pops the future as it answers)."""
        future = waiting.get(key)
        if future is None:
            future = waiting[key] = asyncio.get_running_loop().create_future()
            self.channel.send(order)
        return future

    def answer(self, waiting: dict[Any, asyncio.Future[Any]], key: object, result: object) -> bool:
        """Give the answer awaited under `key` in `waiting`; False when none was awaited."""
        future = waiting.pop(key, None)
        if future is not None and not future.done():
            future.set_result(result)
        return future is not None

    def gone(self) -> None:
        """The server stopped: everything awaited from it fails."""
        error = ConnectionError("the node server stopped")
        for waiting in (self.loads, self.unloads, self.asked, self.traced, self.shares):
            for pending in waiting.values():
                if not pending.done():
                    pending.set_exception(error)
            waiting.clear()


class NodeServer:
    """The Ray actor (made with `ray.remote` by the controller) that runs node `name`'s servers."""

    def __init__(self, name: str, settings: NodeSettings, controller: str, namespace: str, log_level: str) -> None:
        from adaserve.logs import configure_logging

        configure_logging(log_level)
        self.name = name
        self.settings = settings
        self._controller_name, self._namespace = controller, namespace
        self._servers: list[_Server] = []
        self._stopping = False
        self._supervisors: list[asyncio.Task[None]] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self._tracing: Tracing | None = None  # the cluster's trace settings: each server started takes them

    # -- called by the controller ----------------------------------------------------------------------------------
    async def start(self, tracing: Tracing | None = None) -> tuple[NodeAddress, int]:
        """Start the node's servers (under the cluster's trace settings `tracing`, if any were changed) and keep
        them running; the node's address, and its first server's process id, once they answer."""
        self._tracing = tracing or self._tracing
        if not self._servers:
            self._servers = await self._start_servers()
            loop = asyncio.get_running_loop()
            indices = range(len(self._servers))
            self._supervisors = [loop.create_task(self._supervise(i)) for i in indices]
            self._supervisors += [loop.create_task(self._watch(i)) for i in indices]
        return await self.info()

    async def load(self, model: str) -> Loaded:
        """Load `model` on every server of the node: its bytes are theirs together. If one fails, the others unload
        it and the error is the node's."""
        answers = await asyncio.gather(*(server.load(model) for server in self._servers), return_exceptions=True)
        errors = [str(a) if isinstance(a, BaseException) else a.error for a in answers]
        error = next((e for e in errors if e), "")
        if error:
            await asyncio.gather(*(s.unload(model) for s in self._servers), return_exceptions=True)
            return Loaded(model, error=error)
        loaded = [a for a in answers if isinstance(a, Loaded)]
        return Loaded(model, size_bytes=sum(a.size_bytes for a in loaded), load_s=max(a.load_s for a in loaded))

    async def unload(self, model: str) -> None:
        await asyncio.gather(*(server.unload(model) for server in self._servers), return_exceptions=True)

    async def routes(self, table: Routes) -> None:
        for server in self._servers:
            server.channel.send(table)

    async def trace(self, tracing: Tracing) -> str:
        """Have every server of the node trace under the cluster's settings `tracing`, from now on and when it
        restarts (with no share of a count then: what it had went with it), the node's shares of the counts split
        among them; once they do, "", else why one cannot."""
        if self._tracing is None or tracing.version > self._tracing.version:
            self._tracing = msgspec.structs.replace(tracing, shares={})
        parts = len(self._servers)
        shares = {scope: split(count, parts) for scope, count in tracing.shares.items()}
        answers = await asyncio.gather(
            *(
                server.trace(msgspec.structs.replace(tracing, shares={s: of[i] for s, of in shares.items()}))
                for i, server in enumerate(self._servers)
            ),
            return_exceptions=True,
        )
        return next((str(answer) for answer in answers if answer), "")

    async def trace_left(self, scope: str, serial: int, take: bool) -> int:
        """What is left of the node's share of trace scope `scope`'s count, given by change `serial`, on all its
        servers (a server that does not answer has none); `take`: all of it given back."""
        answers = await asyncio.gather(*(s.share(scope, serial, take) for s in self._servers), return_exceptions=True)
        return sum(max(answer, 0) for answer in answers if isinstance(answer, int))

    async def give_traces(self, scope: str, serial: int, count: int) -> None:
        """Add `count` traces to the node's share of scope `scope`'s count, split among its servers."""
        for server, part in zip(self._servers, split(count, len(self._servers)), strict=True):
            if part:
                server.channel.send(TraceGive(scope, serial, part))

    async def refused(self, model: str, reason: str) -> None:
        for server in self._servers:
            server.channel.send(Refused(model, reason))

    async def resident(self) -> dict[str, int]:
        """What the node's servers all hold, with their bytes together (a restarted controller rebuilds its books
        from this)."""
        reports = await asyncio.gather(*(server.report() for server in self._servers))
        held = set.intersection(*(set(report) for report in reports)) if reports else set()
        return {model: sum(report[model] for report in reports) for model in held}

    async def drain(self, timeout_s: float) -> list[str]:
        """Wait up to `timeout_s` until the requests the node's servers accepted are answered (the table they have
        sends them no more); the models that still had some."""
        answers = await asyncio.gather(*(server.drain(timeout_s) for server in self._servers), return_exceptions=True)
        return sorted({model for answer in answers if isinstance(answer, list) for model in answer})

    async def info(self) -> tuple[NodeAddress, int]:
        return self.settings.address, self._servers[0].process.pid

    async def stop(self) -> None:
        """Stop the node's servers: SIGTERM (their accepted requests finish), then SIGKILL past STOP_TIMEOUT_S."""
        self._stopping = True
        for supervisor in self._supervisors:
            supervisor.cancel()
        await asyncio.gather(*(_stop(server.process) for server in self._servers))
        for server in self._servers:
            server.channel.close()

    # -- the node's servers --------------------------------------------------------------------------------------
    async def _start_servers(self) -> list[_Server]:
        groups = self._cpu_groups() or [()]
        return list(await asyncio.gather(*(self._start_server(i, group) for i, group in enumerate(groups))))

    async def _start_server(self, index: int, cpus: tuple[int, ...]) -> _Server:
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
            *(["--reuse-port", "--cpus", ",".join(map(str, cpus))] if cpus else []),
            *server_arguments(settings, self.name, index),
        ]
        process = await asyncio.create_subprocess_exec(*command, pass_fds=(theirs.fileno(),))
        theirs.close()
        server = _Server(process, await Channel[FromNode].open(ours, FromNode))
        asyncio.get_running_loop().create_task(self._follow(server))
        await asyncio.wait_for(server.report(), START_TIMEOUT_S)  # answered once its control channel is read
        if self._tracing is not None:  # a server that (re)starts traces as the cluster does
            await asyncio.wait_for(server.trace(self._tracing), START_TIMEOUT_S)
        return server

    async def _supervise(self, index: int) -> None:
        """Start server `index` again when it dies. The node's replicas are written off first (the controller
        places them again on demand), and the other servers of the node unload them too: all the node's servers
        hold the same models."""
        wait_s = RESTART_BACKOFF_S[0]
        while not self._stopping:
            server = self._servers[index]
            code = await server.process.wait()
            if self._stopping:
                return
            log.error("node server died: restarting it", extra={"node": self.name, "server": index, "exit_code": code})
            from adaserve.engine.processes import how_it_exited  # once a server died: the actor starts light

            why = how_it_exited(code)
            if server.unresponsive:
                why = f"answered nothing for {self.settings.unresponsive_s:g} s and was killed"
            await self._controller().node_lost.remote(self.name, f"its server {why}")
            others = [s for s in self._servers if s is not server]
            held = await asyncio.gather(*(s.report() for s in others), return_exceptions=True)
            models = {m for report in held if isinstance(report, dict) for m in report}
            await asyncio.gather(*(s.unload(m) for s in others for m in models), return_exceptions=True)
            await asyncio.sleep(wait_s)
            try:
                groups = self._cpu_groups()
                self._servers[index] = await self._start_server(index, groups[index] if groups else ())
            except (OSError, TimeoutError) as exc:
                log.error("node server did not start", extra={"node": self.name, "error": str(exc)})
                wait_s = min(2 * wait_s, RESTART_BACKOFF_S[1])
                continue
            wait_s = RESTART_BACKOFF_S[0]
            address, pid = await self.info()
            await self._controller().node_ready.remote(self.name, address, pid, {})

    async def _watch(self, index: int) -> None:
        """Kill server `index` once it has left a question on its control channel unanswered for `unresponsive_s`:
        its process lives but serves nothing (stopped, or its event loop stuck), and neither Ray nor `_supervise`
        would ever see it. Killed, it is one that died: `_supervise` writes its replicas off and starts it again,
        and the requests forwarded to it fail at once and are retried on another replica."""
        limit = self.settings.unresponsive_s
        while not self._stopping:
            await asyncio.sleep(PROBE_EVERY_S)
            server = self._servers[index]
            if server.process.returncode is not None or server.unresponsive:
                continue  # dead: `_supervise` starts the next one
            try:  # shielded: the question may be another caller's too (`resident`)
                await asyncio.wait_for(asyncio.shield(server.report()), limit)
            except TimeoutError:
                log.error(
                    "node server answers nothing: killing it",
                    extra={"node": self.name, "server": index, "pid": server.process.pid, "silent_s": limit},
                )
                server.unresponsive = True
                with contextlib.suppress(ProcessLookupError):  # it died meanwhile
                    server.process.kill()
            except ConnectionError:
                pass  # it stopped while asked: `_supervise` starts the next one

    def _cpu_groups(self) -> list[tuple[int, ...]]:
        if self.settings.servers == 1:
            return []
        from adaserve.cpu.groups import core_groups

        return [tuple(group) for group in core_groups(self.settings.servers)]

    async def _follow(self, server: _Server) -> None:
        """A server's reports: answers to this actor's orders, and what goes on to the controller."""
        while (message := await server.channel.receive()) is not None:
            match message:
                case Loaded(model):
                    server.answer(server.loads, model, message)
                case Unloaded(model):
                    if not server.answer(server.unloads, model, None):  # not ordered: the server lost it (say,
                        self._controller().unloaded.remote(self.name, model)  # unloaded through its API)
                        self._forget(model)
                case Resident(models):
                    server.answer(server.asked, Resident, models)
                case Drained(busy):
                    server.answer(server.asked, Drained, busy)
                case Place(model, size, avoid):
                    self._controller().place.remote(self.name, model, size, avoid)
                case Requests():
                    self._controller().requests.remote(self.name, message)
                case Traced(version, error):
                    server.answer(server.traced, version, error)
                case TraceShareLeft(ask, left):
                    server.answer(server.shares, ask, left)
                case TraceChange():
                    self._spawn(self._change_trace(server, message))
                case TraceCountRead():
                    self._spawn(self._read_trace_count(server, message))
        server.channel.close()
        server.gone()

    async def _change_trace(self, server: _Server, change: TraceChange) -> None:
        """Ask the controller to make a trace setting request that arrived at `server` for the cluster; its answer
        goes back to the server."""
        try:
            missing: dict[str, str] = await self._controller().change_trace.remote(self.name, change)
        except Exception as exc:  # the controller is away (restarting), or refused the change
            server.channel.send(TraceChanged(change.ask, error=str(exc)))
            return
        server.channel.send(TraceChanged(change.ask, missing))

    async def _read_trace_count(self, server: _Server, read: TraceCountRead) -> None:
        """Ask the controller what is left of the cluster's trace count `read` asks about; its answer goes back to
        the server."""
        try:
            left: int | None = await self._controller().trace_left.remote(read.scope)
        except Exception as exc:  # the controller is away (restarting)
            server.channel.send(TraceCountLeft(read.ask, error=str(exc)))
            return
        server.channel.send(TraceCountLeft(read.ask, left))

    def _forget(self, model: str) -> None:
        """Unload `model` from every server of the node (in a task: this runs in a server's report loop, which reads
        the answers)."""
        self._spawn(self.unload(model))

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _controller(self) -> Any:
        """The controller's actor handle (looked up each time: it may have restarted)."""
        import ray

        return ray.get_actor(self._controller_name, namespace=self._namespace)


async def _stop(process: asyncio.subprocess.Process) -> None:
    if process.returncode is not None:
        return
    process.terminate()
    try:
        await asyncio.wait_for(process.wait(), STOP_TIMEOUT_S)
    except TimeoutError:
        process.kill()
        await process.wait()
