"""The controller's state in Ray's key-value store (`adaserve.distributed.state`), with a dict for the store: kept
under the deployment's id, so a controller Ray restarts (a new object, the same arguments) gets it back, and a new
deployment starts from nothing, removing what earlier ones left."""

from __future__ import annotations

import asyncio

import msgspec

from adaserve.distributed.controller import ClusterSettings, Controller
from adaserve.distributed.messages import NodeAddress, TraceChange, Tracing
from adaserve.distributed.node import NodeSettings
from adaserve.server.trace_state import TraceSettings, TraceState
from tests.distributed.fakes import FakeNode, MemoryKeyValue, started

SETTINGS = ClusterSettings(NodeSettings("/models"))


def test_a_deployments_state_is_its_own_and_a_restarted_controller_gets_it_back() -> None:
    earlier = Tracing(3, TraceState(TraceSettings(rate=9)))
    store = MemoryKeyValue(
        {
            "deployment/before/drained-nodes": b'["a"]',
            "deployment/before/trace-settings": msgspec.json.encode(earlier),
            "drained-nodes": b'["b"]',  # where a deployment kept them before they were under its id
        }
    )
    change = TraceChange(1, "", {"trace_rate": ["5"]}, TraceSettings(), TraceState(TraceSettings()))

    async def deploy() -> Controller:
        controller = Controller(SETTINGS, "now", store)
        started(controller)
        assert (controller.drained, controller.tracing.current, store) == (set(), None, {})  # earlier ones gone
        for name, handle in (("a", None), ("b", FakeNode(""))):  # a's actor is not stopped (no Ray): no handle
            controller._join(name, handle, NodeAddress(f"{name}:8000", f"{name}:8001"), 1, {}, 100)
        controller.draining["a"] = True  # as `drain` has it once a's models moved
        await controller._retire("a")
        await controller.change_trace("b", change)
        return controller

    deployed = asyncio.run(deploy())
    assert sorted(store) == ["deployment/now/drained-nodes", "deployment/now/trace-settings"]

    async def restart(deployment: str) -> Controller:
        controller = Controller(SETTINGS, deployment, store)
        started(controller)
        return controller

    restarted = asyncio.run(restart("now"))  # Ray restarts the actor with the arguments it was made with
    assert restarted.drained == {"a"} and restarted.tracing.current == deployed.tracing.current is not None
    later = asyncio.run(restart("later"))  # the next `serve --ray` on this Ray cluster
    assert (later.drained, later.tracing.current, store) == (set(), None, {})


def test_a_restarted_controller_sends_its_trace_settings_to_every_node_once() -> None:
    """It does not know what each node has (one may have missed the change as the controller went down)."""
    store = MemoryKeyValue()
    tracing = Tracing(7, TraceState(TraceSettings(rate=5)))
    nodes = {"a": FakeNode(""), "b": FakeNode("")}

    async def restarted() -> None:
        controller = Controller(SETTINGS, "now", store)
        controller.state.save_tracing(tracing)  # what it kept before Ray restarted it
        started(controller)
        for name, handle in nodes.items():  # as it adopts the running nodes
            controller._join(name, handle, NodeAddress(f"{name}:8000", f"{name}:8001"), 1, {}, 100)
        for _ in range(2):
            controller.tracing.catch_up()
            await controller.tracing.caught_up()
        assert controller.tracing.confirmed == {"a": 7, "b": 7}

    asyncio.run(restarted())
    assert all(handle.got == [tracing] for handle in nodes.values())
