"""Drive a ModelEngine in-process, with its real host and worker processes, for the engine tests."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Awaitable, Callable
from pathlib import Path

from adaserve.engine.engine import ModelEngine
from adaserve.engine.processes import ZYGOTE
from adaserve.repository import ModelRepository


def run_engine(repository: Path, body: Callable[[ModelEngine], Awaitable[None]], model: str = "mlp") -> None:
    """Start `model` of `repository`, run `body` on its engine, and stop the engine whatever happened."""

    async def main() -> None:
        engine = ModelEngine(ModelRepository(repository).read(model))
        await engine.start()
        try:
            await body(engine)
        finally:
            await engine.stop(drain_timeout_s=5.0)

    asyncio.run(main())


def live_children(pid: int | None = None) -> list[int]:
    """The children of process `pid` (default: this one's) that have not exited (zombies not yet reaped are left
    out). Their threads' children too: a model host forks its workers from its main thread, a test from any."""
    pid = os.getpid() if pid is None else pid
    children = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):  # a thread that ended meanwhile
            children += (task / "children").read_text().split()
    alive = []
    for child in children:
        with contextlib.suppress(OSError):
            if Path(f"/proc/{child}/stat").read_text().split()[2] != "Z":
                alive.append(int(child))
    return alive


def live_hosts() -> list[int]:
    """The model hosts alive in this process's server: the children of its zygote (none before it started)."""
    process = ZYGOTE._process
    return [] if process is None else live_children(process.pid)
