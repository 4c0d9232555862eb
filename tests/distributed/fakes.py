"""What the placement controller reaches through Ray, stood in for so that its tests run without Ray: a node
actor's handle, Ray's key-value store, and a start that follows no membership."""

from __future__ import annotations

import asyncio
from typing import Any

from adaserve.distributed.controller import Controller
from adaserve.distributed.messages import Tracing


class FakeNode:
    """A node actor's handle as the controller calls it: `trace.remote(tracing)` answers `answer` (an error raised;
    None: never), which a test may change between calls."""

    def __init__(self, answer: str | BaseException | None) -> None:
        self.got: list[Tracing] = []
        self.trace = self
        self.answer = answer

    async def _call(self, tracing: Tracing) -> str:
        self.got.append(tracing)
        if self.answer is None:  # until the caller's timeout cancels the wait
            never: asyncio.Future[str] = asyncio.get_running_loop().create_future()
            return await never
        if isinstance(self.answer, BaseException):
            raise self.answer
        return self.answer

    def remote(self, tracing: Tracing) -> Any:
        return self._call(tracing)


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
