"""ModelRouter driven in-process, with real host and worker processes: repository loads and unloads."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from adaserve.engine.router import ModelRouter
from adaserve.repository import ModelRepository
from tests.engine.engines import live_children
from tests.server_utils import link_example

ONE_WORKER = [{"batch": 4, "threads": 1}]


@pytest.mark.parametrize("operation", ["load", "unload"])
def test_a_repository_operation_whose_caller_stops_waiting_still_ends(tmp_path: Path, operation: str) -> None:
    """A client that hangs up, or whose gRPC deadline passes, cancels the call that waits for a load or unload,
    not the operation: it ends as asked, and leaves the model's processes and no others. Before, a cancelled
    load left a host process that no engine owned, and the model unloaded."""
    link_example(tmp_path, "mlp", workers=ONE_WORKER)

    async def main() -> None:
        others = live_children()
        router = ModelRouter(ModelRepository(tmp_path))
        try:
            if operation == "unload":
                await router.load("mlp")
            call = asyncio.get_running_loop().create_task(getattr(router, operation)("mlp"))
            await asyncio.sleep(0.2)  # a load has started its host by now; an unload is stopping the workers
            call.cancel()
            with pytest.raises(asyncio.CancelledError):
                await call
            wanted = ("READY", 1) if operation == "load" else ("UNAVAILABLE", 0)  # the state, and host processes

            def now() -> tuple[str, int]:
                return router.index()[0].state, len(set(live_children()) - set(others))

            deadline = time.monotonic() + 120.0
            while now() != wanted and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            assert now() == wanted
            hosts = set(live_children()) - set(others)  # a host forks the model's workers: they are its children
            if hosts:
                workers = router.engines["mlp"].workers.values()
                assert sorted(live_children(hosts.pop())) == sorted(w.pid for w in workers)
        finally:
            await router.close()
        assert set(live_children()) <= set(others)

    asyncio.run(main())
