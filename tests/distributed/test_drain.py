"""The controller's part of a drain that needs no Ray: which node a name means (never the last one serving), and
the routing table without a node once it is drained out of it."""

from __future__ import annotations

import pytest

from adaserve.distributed.controller import ClusterSettings, Controller, _one_of
from adaserve.distributed.messages import NodeAddress
from adaserve.distributed.node import NodeSettings
from adaserve.errors import ConfigError


def test_a_node_is_named_in_full_or_by_a_start_only_it_has() -> None:
    nodes = ["a1f0", "a1f9", "b700"]
    assert _one_of("a1f0", nodes, "node") == "a1f0"
    assert _one_of("b", nodes, "node") == "b700"
    with pytest.raises(ConfigError, match=r"2 nodes match 'a1'; the nodes: a1f0, a1f9, b700"):
        _one_of("a1", nodes, "node")
    with pytest.raises(ConfigError, match=r"no drained nodes match 'c'; the drained nodes: none"):
        _one_of("c", [], "drained node")


def _controller(*nodes: str) -> Controller:
    """A controller (no Ray behind it) that has `nodes` joined, each holding mlp and a model of its own."""
    controller = Controller(ClusterSettings(NodeSettings("/models")), "test")
    for name in nodes:
        address = NodeAddress(f"{name}:8000", f"{name}:8001")
        controller._join(name, None, address, 1, {"mlp": 10, f"only-{name}": 10}, 100)
    return controller


def test_a_drain_names_a_serving_node_and_never_the_last() -> None:
    controller = _controller("a1", "b2")
    assert controller._to_drain("a") == "a1"
    controller.draining["a1"] = False
    with pytest.raises(ConfigError, match=r"no serving nodes match 'a1'; the serving nodes: b2"):
        controller._to_drain("a1")  # being drained already
    with pytest.raises(ConfigError, match=r"node b2 is the last serving node"):
        controller._to_drain("b2")


def test_the_table_leaves_out_a_node_drained_out_of_it_and_its_replicas() -> None:
    controller = _controller("a", "b")
    controller.draining["a"] = False  # models being moved off it: still in the table
    assert controller.table().replicas == {"mlp": ["a", "b"], "only-a": ["a"], "only-b": ["b"]}
    controller.draining["a"] = True
    table = controller.table()
    assert list(table.nodes) == ["b"] and table.replicas == {"mlp": ["b"], "only-b": ["b"]}
