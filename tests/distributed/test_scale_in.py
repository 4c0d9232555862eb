"""Which node scale-in gives back (`adaserve.distributed.scale_in`), and the controller's part of it that needs no
Ray: what marks a node busy, and a node given back only while more than the floor serve."""

from __future__ import annotations

import time

import pytest

from adaserve.distributed.controller import ClusterSettings, Controller
from adaserve.distributed.messages import NodeAddress, Requests
from adaserve.distributed.node import NodeSettings
from adaserve.distributed.scale_in import IdleNodes, ScaleIn
from adaserve.errors import ConfigError


def test_the_node_idle_longest_past_the_idle_time_is_given_back_down_to_the_floor() -> None:
    idle = IdleNodes()
    for node, at in (("a", 0.0), ("b", 5.0), ("c", 8.0)):
        idle.busy(node, at)
    settings = ScaleIn(idle_s=10.0, min_nodes=2)
    assert idle.idlest(["a", "b", "c"], settings, now=9.0) is None  # none idle 10 s yet
    assert idle.idlest(["a", "b", "c"], settings, now=16.0) == "a"  # a and b are: a the longer
    assert idle.idlest(["b", "c"], settings, now=60.0) is None  # two serve: the floor
    assert idle.idlest(["b", "c", "d"], settings, now=16.0) == "b"
    assert idle.idlest(["c", "d"], ScaleIn(idle_s=10.0), now=16.0) is None  # d not seen yet: busy now, and c too


@pytest.mark.parametrize(("idle_s", "min_nodes", "message"), [(0, 1, "above 0 s"), (5, 0, "at least 1 node")])
def test_a_scale_in_setting_that_cannot_be_is_refused(idle_s: float, min_nodes: int, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        ScaleIn(idle_s, min_nodes)


def test_a_report_of_requests_or_compute_marks_a_node_busy_and_a_quiet_one_does_not() -> None:
    controller = Controller(ClusterSettings(NodeSettings("/models")), "test")
    for name in ("a", "b", "c"):
        controller._join(name, None, NodeAddress(f"{name}:8000", f"{name}:8001"), 1, {}, 100)
    joined = time.monotonic()
    controller._take_report("a", Requests({"mlp": 1}, {}, {}), joined + 1)  # arrived there
    controller._take_report("b", Requests({}, {"mlp": 0}, {"mlp": 50.0}), joined + 1)  # computed there
    controller._take_report("c", Requests({}, {"mlp": 0}, {}), joined + 1)  # neither: c idle since it joined
    assert controller.idle.idlest(list(controller.nodes), ScaleIn(idle_s=0.5), now=joined + 1) == "c"
    assert controller.idle.idlest(["a", "b"], ScaleIn(idle_s=0.5), now=joined + 1) is None
