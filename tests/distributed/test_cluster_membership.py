"""The controller following Ray's membership, without Ray: a node actor that died for good while its Ray node stays,
or that lives but answers nothing, is dropped (its replicas written off, placed again on their next request) and
started afresh."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from adaserve import logs
from adaserve.distributed.controller import ClusterSettings, Controller
from adaserve.distributed.messages import NodeAddress
from adaserve.distributed.node import NodeSettings
from tests.distributed.fakes import FakeNode, MemoryKeyValue, actor_died, started


def _address(name: str) -> NodeAddress:
    return NodeAddress(f"{name}:8000", f"{name}:8001")


def _controller(monkeypatch: pytest.MonkeyPatch, unresponsive_s: float = 30.0) -> tuple[Controller, list[Any]]:
    """A controller whose `ray.kill` only records the handles it is given (in the list returned)."""
    ray = pytest.importorskip("ray", reason="the controller tells a dead actor by Ray's error, and kills through Ray")
    killed: list[Any] = []
    monkeypatch.setattr(ray, "kill", lambda handle, no_restart: killed.append(handle))
    monkeypatch.setattr(logs, "configure_logging", lambda level: None)  # it would take the root logger from caplog
    settings = ClusterSettings(NodeSettings("/models", unresponsive_s=unresponsive_s))
    return Controller(settings, "test", MemoryKeyValue()), killed


def test_a_node_actor_that_died_for_good_is_dropped_its_models_placed_again_and_a_fresh_one_started(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    controller, killed = _controller(monkeypatch)
    nodes = {"a": FakeNode(), "b": FakeNode(), "c": FakeNode()}
    fresh = FakeNode()
    starts: list[str] = []

    async def add(node_id: str, node: dict[str, Any]) -> None:  # `_add` but for Ray's part: a fresh actor started
        starts.append(node_id)
        controller._join(node_id, fresh, _address(node_id), 2, {}, 100)

    monkeypatch.setattr(controller, "_add", add)
    alive = {name: {"Resources": {"CPU": 1.0}} for name in nodes}  # every Ray node stays

    async def scenario() -> None:
        started(controller)
        for name, handle in nodes.items():
            controller._join(name, handle, _address(name), 1, {"mlp": 10} if name == "a" else {}, 100)
        assert controller.table().replicas == {"mlp": ["a"]}
        nodes["a"].died = actor_died("The actor is dead because it was killed by `ray.kill`.", pid=4242)
        with caplog.at_level(logging.WARNING, logger="adaserve.cluster"):
            await controller._follow(alive, ["b"])  # a is not listed, and dead; c is not listed, but answers
        assert killed == [nodes["a"]] and starts == ["a"]
        assert controller.nodes == {"a": fresh, "b": nodes["b"], "c": nodes["c"]}
        assert controller.decisions["lost"] == 1 and controller.placement.replicas("mlp") == []
        assert controller.table().replicas == {}  # written off: no request is sent to it
        (lost,) = [record for record in caplog.records if record.getMessage() == "node lost"]
        assert lost.levelno == logging.WARNING and lost.__dict__["node"] == "a" and lost.__dict__["models"] == ["mlp"]
        assert lost.__dict__["reason"] == "its node actor died: it was killed (ray.kill)"
        await controller.place("b", "mlp", 10, [])  # its next request places it again
        await asyncio.gather(*controller._placing.values())
        (holder,) = controller.placement.replicas("mlp")
        assert controller.nodes[holder].loaded == ["mlp"] and nodes["a"].loaded == []
        assert controller.table().replicas == {"mlp": [holder]}
        await controller._follow(alive, ["a", "b", "c"])  # every actor listed: nothing more dropped or started
        assert starts == ["a"] and controller.decisions["lost"] == 1

    asyncio.run(scenario())


def test_a_node_being_drained_is_left_to_its_drain_when_its_actor_dies() -> None:
    """The drain stops its actor and keeps it out: started afresh here, it would serve again."""
    ray = pytest.importorskip("ray", reason="the controller tells a dead actor by Ray's error")
    controller = Controller(ClusterSettings(NodeSettings("/models")), "test", MemoryKeyValue())
    nodes = {"a": FakeNode(), "b": FakeNode()}
    for name, handle in nodes.items():
        controller._join(name, handle, _address(name), 1, {}, 100)
    nodes["a"].died = ray.exceptions.ActorDiedError()
    controller.draining["a"] = True
    assert asyncio.run(controller._dead_actors(["b"])) == {}
    del controller.draining["a"]
    died = "The actor died unexpectedly before finishing this task."
    assert asyncio.run(controller._dead_actors(["b"])) == {"a": died}


def test_a_node_actor_that_answers_nothing_is_killed_dropped_and_started_afresh(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Ray lists a stopped actor as alive; only its silence tells it. Nor does it hold up the others' tables."""
    limit = 0.3
    controller, killed = _controller(monkeypatch, limit)
    nodes = {"a": FakeNode(), "b": FakeNode()}
    fresh = FakeNode()

    async def add(node_id: str, node: dict[str, Any]) -> None:
        controller._join(node_id, fresh, _address(node_id), 2, {}, 100)

    monkeypatch.setattr(controller, "_add", add)
    alive = {name: {"Resources": {"CPU": 1.0}} for name in nodes}

    async def scenario() -> None:
        started(controller)
        for name, handle in nodes.items():
            controller._join(name, handle, _address(name), 1, {"mlp": 10} if name == "a" else {}, 100)
        await controller._follow(alive, ["a", "b"])  # asked, and answered
        await asyncio.sleep(0)
        nodes["a"].stuck = True
        await controller._follow(alive, ["a", "b"])  # asked again: no answer comes
        await asyncio.sleep(limit / 3)
        await controller._follow(alive, ["a", "b"])  # silent, but not for long enough yet
        assert killed == [] and controller.nodes["a"] is nodes["a"]
        await asyncio.sleep(limit)
        with caplog.at_level(logging.WARNING, logger="adaserve.cluster"):
            # Its table is abandoned after the limit: the membership loop, and the others, go on.
            await asyncio.wait_for(controller._follow(alive, ["a", "b"]), limit + 5)
        assert killed == [nodes["a"]] and controller.nodes == {"a": fresh, "b": nodes["b"]}
        assert controller.decisions["lost"] == 1 and controller.table().replicas == {}
        (lost,) = [record for record in caplog.records if record.getMessage() == "node lost"]
        assert lost.__dict__["reason"] == "its node actor answered nothing for 0.3 s and was killed"
        assert lost.__dict__["models"] == ["mlp"]
        await asyncio.sleep(limit)
        await controller._follow(alive, ["a", "b"])  # the fresh actor and b answer: nothing more dropped
        assert killed == [nodes["a"]] and controller.decisions["lost"] == 1

    asyncio.run(scenario())


def test_a_node_being_drained_is_not_dropped_for_its_silence_and_a_stuck_one_does_not_hold_up_the_stop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A drain waits on the node by itself (and stops its actor); the cluster's stop kills it all the same."""
    monkeypatch.setattr("adaserve.distributed.controller.STOP_TIMEOUT_S", 0.0)
    limit = 0.2
    controller, killed = _controller(monkeypatch, limit)
    nodes = {"a": FakeNode(), "b": FakeNode()}
    for name, handle in nodes.items():
        controller._join(name, handle, _address(name), 1, {}, 100)
    nodes["a"].stuck = True
    controller.draining["a"] = False

    async def scenario() -> None:
        assert controller._silent_actors(0.0) == []
        await asyncio.sleep(0)
        assert controller._silent_actors(limit) == []  # being drained
        del controller.draining["a"]
        assert controller._silent_actors(limit) == ["a"]
        await asyncio.wait_for(controller.stop(), limit + 5)
        assert killed == [nodes["a"], nodes["b"]]

    asyncio.run(scenario())
