"""Partial latency budgets: each policy's shares along a path, and the least share over the paths through a node."""

from __future__ import annotations

import pytest

from adaserve.planner.budgets import EqualSplit, ProportionalSplit, partial_budgets, paths
from tests.planner.dags import chain, fork


def test_paths_run_from_the_nodes_no_other_feeds_to_those_that_feed_none() -> None:
    assert paths(fork(), {"a", "b", "c", "d"}) == [("a", "b", "d"), ("a", "c", "d")]
    assert paths(fork(), {"b", "c", "d"}) == [("b", "d"), ("c", "d")]  # a has run
    assert paths(fork(), {"b"}) == [("b",)]


def test_equal_split_gives_each_node_of_a_path_the_same_part() -> None:
    budgets = partial_budgets(chain(), ["classify", "refine"], {}, 10.0, EqualSplit())
    assert budgets == {"classify": 5.0, "refine": 5.0}


def test_proportional_split_follows_the_slowest_option_of_each_node() -> None:
    costs = {"classify": 3.0, "refine": 1.0}
    budgets = partial_budgets(chain(), ["classify", "refine"], costs, 8.0, ProportionalSplit())
    assert budgets == {"classify": 6.0, "refine": 2.0}
    unknown = {"classify": 0.0, "refine": 0.0}  # never run: no proportion to follow, so equal parts
    assert partial_budgets(chain(), ["classify", "refine"], unknown, 8.0, ProportionalSplit()) == {
        "classify": 4.0,
        "refine": 4.0,
    }


def test_a_node_on_several_paths_gets_its_least_share() -> None:
    costs = {"a": 1.0, "b": 1.0, "c": 6.0, "d": 1.0}
    budgets = partial_budgets(fork(), ["a", "b", "c", "d"], costs, 16.0, ProportionalSplit())
    # path a-b-d: 16/3 each; path a-c-d: 2, 12, 2: a and d get the smaller of their two shares
    assert budgets["a"] == pytest.approx(2.0) and budgets["d"] == pytest.approx(2.0)
    assert budgets["b"] == pytest.approx(16 / 3) and budgets["c"] == pytest.approx(12.0)
    for path in paths(fork(), {"a", "b", "c", "d"}):
        assert sum(budgets[node] for node in path) <= 16.0 + 1e-9  # the SLO holds on every path
