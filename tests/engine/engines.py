"""Drive a ModelEngine in-process, with its real host and worker processes, for the engine tests."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path

from adaserve.engine.engine import ModelEngine
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
