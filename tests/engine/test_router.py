"""ModelRouter driven in-process, with real host and worker processes: repository loads and unloads."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from adaserve.engine.engine import EngineState
from adaserve.engine.router import CacheSettings, ModelRouter
from adaserve.repository import ModelRepository
from tests.engine.engines import live_children, live_hosts
from tests.engine.test_poller import add_identity_version
from tests.server_utils import link_example, write_fussy_model

ONE_WORKER = [{"batch": 4, "threads": 1}]


@pytest.mark.parametrize("operation", ["load", "unload"])
def test_a_repository_operation_whose_caller_stops_waiting_still_ends(tmp_path: Path, operation: str) -> None:
    """A client that hangs up, or whose gRPC deadline passes, cancels the call that waits for a load or unload,
    not the operation: it ends as asked, and leaves the model's processes and no others. Before, a cancelled
    load left a host process that no engine owned, and the model unloaded."""
    link_example(tmp_path, "mlp", workers=ONE_WORKER)

    async def main() -> None:
        others = live_hosts()
        router = ModelRouter(ModelRepository(tmp_path))
        try:
            if operation == "unload":
                await router.load("mlp")
                engine = router.engines["mlp"]
            call = asyncio.get_running_loop().create_task(getattr(router, operation)("mlp"))

            def underway() -> bool:
                if operation == "load":
                    return bool(set(live_hosts()) - set(others))
                return engine.state is EngineState.UNLOADING

            while not underway():  # a load has forked its host; an unload is stopping the model's processes
                await asyncio.sleep(0.001)
            call.cancel()
            with pytest.raises(asyncio.CancelledError):
                await call
            wanted = ("READY", 1) if operation == "load" else ("UNAVAILABLE", 0)  # the state, and host processes

            def now() -> tuple[str, int]:
                return router.index()[0].state, len(set(live_hosts()) - set(others))

            deadline = time.monotonic() + 120.0
            while now() != wanted and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            assert now() == wanted
            hosts = set(live_hosts()) - set(others)  # a host forks the model's workers: they are its children
            if hosts:
                workers = router.engines["mlp"].workers.values()
                assert sorted(live_children(hosts.pop())) == sorted(w.pid for w in workers)
        finally:
            await router.close()
        assert set(live_hosts()) <= set(others)

    asyncio.run(main())


def test_under_a_memory_budget_a_model_with_two_versions_is_resident_with_both(tmp_path: Path) -> None:
    """mCache holds a model's versions together: a request for either loads them all, and the model's resident
    bytes are the sum of its engines'."""
    both = write_fussy_model(tmp_path, "both", workers=ONE_WORKER, version_policy={"all": True})
    add_identity_version(both, 2)

    async def main() -> None:
        router = ModelRouter(ModelRepository(tmp_path), CacheSettings(8 * 2**30))
        try:
            assert router.spec("both", "1").version == 1  # known before it is resident
            async with router.serving("both", "1") as engine:
                assert engine.model.version == 1
            engines = router.served_engines("both")
            assert [e.model.version for e in engines] == [1, 2]
            assert router.cache is not None
            resident = router.cache.snapshot().models["both"].resident_bytes
            assert resident == sum(e.memory_bytes for e in engines) > 0
        finally:
            await router.close()

    asyncio.run(main())
