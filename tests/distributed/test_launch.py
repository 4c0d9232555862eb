"""A start that finds an adaserve deployment on its Ray cluster (`adaserve.distributed.launch`): refused while that
deployment's driver calls its controller, taking it over once its driver has been silent a while; and the
controller's part, which keeps when its driver last called."""

from __future__ import annotations

import asyncio

import pytest

from adaserve.distributed.controller import ClusterSettings, Controller
from adaserve.distributed.launch import ORPHANED_AFTER_S, takes_over
from adaserve.distributed.node import NodeSettings
from adaserve.errors import ConfigError
from tests.distributed.fakes import MemoryKeyValue, started


def test_a_start_refuses_a_deployment_whose_driver_calls_and_takes_over_one_whose_driver_died() -> None:
    assert not takes_over("ours", "ours", ORPHANED_AFTER_S * 10)  # the controller it found is the one it made
    with pytest.raises(ConfigError) as refused:
        takes_over("ours", "4f0c", 4.2)
    message = str(refused.value)
    assert message.startswith("adaserve deployment 4f0c runs on this Ray cluster") and "called it 4 s ago" in message
    assert "stop that process first" in message
    assert f"a deployment whose driver has not called for {ORPHANED_AFTER_S:g} s is taken over" in message
    with pytest.raises(ConfigError):
        takes_over("ours", "4f0c", ORPHANED_AFTER_S - 0.1)
    assert takes_over("ours", "4f0c", ORPHANED_AFTER_S)


def test_the_controller_answers_how_long_its_driver_has_been_silent_and_a_ping_resets_it() -> None:
    async def scenario() -> None:
        controller = Controller(ClusterSettings(NodeSettings("/models")), "4f0c", MemoryKeyValue())
        started(controller)  # a ping starts a controller that is not started: here, nothing to start
        controller._pinged -= 100.0  # its driver last called 100 s ago
        silent = await controller.driver()
        assert silent["deployment"] == "4f0c" and silent["silent_s"] >= 100.0
        await controller.ping()
        assert (await controller.driver())["silent_s"] < 100.0

    asyncio.run(scenario())
