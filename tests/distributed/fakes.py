"""What the placement controller reaches through Ray, stood in for so that its tests run without Ray: a node
actor's handle, Ray's key-value store, and a start that follows no membership; and the controller's handle, as a
node actor reaches it."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from adaserve.distributed.controller import Controller
from adaserve.distributed.messages import Loaded, NodeAddress, Tracing
from adaserve.server.trace import Tracer


class FakeNode:
    """A node actor's handle as the controller calls it (`handle.method.remote(...)`): `trace` answers `answer` (an
    error raised; None: never), which a test may change between calls, and a `tracer`, if given, adopts the settings
    and holds the node's shares of the trace counts; `load` holds any model at `size_bytes`, the other calls answer
    as a running node's; once `died` is set, every call raises it, as Ray does a dead actor's; while `stuck` is set,
    no call made answers (a stopped actor's), until the caller gives up on it."""

    def __init__(
        self, answer: str | BaseException | None = "", size_bytes: int = 10, tracer: Tracer | None = None
    ) -> None:
        self.got: list[Tracing] = []
        self.answer = answer
        self.size_bytes = size_bytes
        self.tracer = tracer
        self.died: BaseException | None = None
        self.stuck = False
        self.loaded: list[str] = []
        self.trace, self.load = _Method(self, self._trace), _Method(self, self._load)
        self.trace_left, self.give_traces = _Method(self, self._trace_left), _Method(self, self._give_traces)
        self.routes = self.unload = self.refused = self.stop = _Method(self, self._ignore)
        self.info = _Method(self, self._info)

    async def _trace(self, tracing: Tracing) -> str:
        self.got.append(tracing)
        if self.tracer is not None:
            self.tracer.adopt(tracing.state, tracing.shares)
        if self.answer is None:  # until the caller's timeout cancels the wait
            never: asyncio.Future[str] = asyncio.get_running_loop().create_future()
            return await never
        if isinstance(self.answer, BaseException):
            raise self.answer
        return self.answer

    async def _trace_left(self, scope: str, serial: int, take: bool) -> int:
        assert self.tracer is not None
        return self.tracer.left(scope, serial, take)

    async def _give_traces(self, scope: str, serial: int, count: int) -> None:
        assert self.tracer is not None
        self.tracer.give(scope, serial, count)

    async def _load(self, model: str) -> Loaded:
        self.loaded.append(model)
        return Loaded(model, size_bytes=self.size_bytes)

    async def _info(self) -> tuple[NodeAddress, int]:
        return NodeAddress("127.0.0.1:8000", "127.0.0.1:8001"), 1

    async def _ignore(self, *args: object) -> None:
        return None


class FakeController:
    """The placement controller's handle as a node actor calls it when one of its servers dies: `node_lost` and
    `node_ready`, each call recorded in `calls` as (method, arguments)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[Any, ...]]] = []
        self.died: BaseException | None = None
        self.stuck = False
        self.node_lost, self.node_ready = _Method(self, self._lost), _Method(self, self._ready)

    async def _lost(self, *args: Any) -> None:
        self.calls.append(("node_lost", args))

    async def _ready(self, *args: Any) -> None:
        self.calls.append(("node_ready", args))


class _Method:
    """One method of a fake actor: `remote(...)` is the call, which the caller awaits."""

    def __init__(self, node: FakeNode | FakeController, call: Callable[..., Awaitable[Any]]) -> None:
        self.node, self.call = node, call

    async def _remote(self, *args: Any) -> Any:
        if self.node.died is not None:
            raise self.node.died
        if self.node.stuck:
            never: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
            return await never
        return await self.call(*args)

    def remote(self, *args: Any) -> Any:
        return self._remote(*args)


def actor_died(message: str, **fields: Any) -> BaseException:
    """An ActorDiedError as Ray raises it for a node actor whose death its GCS explained with `message` (fields of
    Ray's `ActorDiedErrorContext`: `pid`, say)."""
    import ray
    from ray.core.generated.common_pb2 import ActorDiedErrorContext

    context = ActorDiedErrorContext(
        error_message=message, class_name="NodeServer", actor_id=b"\x01" * 16, name="adaserve-node-a", **fields
    )
    return ray.exceptions.ActorDiedError(context)  # type: ignore[no-any-return]


class MemoryKeyValue(dict[str, bytes]):
    """Ray's key-value store (one namespace) as a dict: `KeyValue`."""

    def put(self, key: str, value: bytes) -> None:
        self[key] = value

    def delete(self, key: str) -> None:
        self.pop(key, None)

    def list_keys(self) -> list[str]:
        return list(self)


def started(controller: Controller) -> None:
    """Start `controller` (in the running event loop) as `Controller.start` does, but for Ray's part: its state
    loaded from its store, no node adopted, no membership followed. A test joins the nodes (`Controller._join`)."""
    controller._load_state()
    done = asyncio.get_running_loop().create_future()
    done.set_result(None)
    controller._starting = done
