"""The fleet-scale placement benchmark's core: a replay whose every wait is stated, and a tiny fleet end to end."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from adaserve.cache.simulator import ModelFigures, read_models
from adaserve.cache.workload import Request
from benchmarks.cluster.fleet import ZOO, build_fleet, plot, run_seed, simulate_fleet, summarize
from tests.cache.factories import needs_azure_functions


def test_a_request_waits_for_the_load_under_way_and_a_full_node_for_room() -> None:
    figures = {"a": ModelFigures(10, 2.0, 0.0), "b": ModelFigures(10, 1.0, 0.0)}
    requests = [
        Request(0.0, "a"),  # cold: loads a, ready at 2
        Request(1.0, "a"),  # a is loading: waits for that load (1 s), no second load
        Request(3.0, "a"),  # hit
        Request(4.0, "b"),  # cold: evicts a, ready at 5
        Request(4.5, "a"),  # cold, and the one node is full of loading b: placed at 5, evicting b, ready at 7
    ]
    result = simulate_fleet(requests, figures, nodes=1, budget_bytes=10, placement="iam", eviction="iam")
    assert (result.requests, result.cold_starts, result.loads, result.evictions, result.refused) == (5, 4, 3, 2, 1)
    assert result.mean_load_wait_s == pytest.approx((2 + 1 + 0 + 1 + 2.5) / 5)
    assert result.mean_cold_wait_s == pytest.approx((2 + 1 + 1 + 2.5) / 4)


def test_two_nodes_keep_both_models_where_one_would_thrash() -> None:
    figures = {"a": ModelFigures(10, 1.0, 0.0), "b": ModelFigures(10, 1.0, 0.0)}
    requests = [Request(2.0 * i, "ab"[i % 2]) for i in range(10)]  # a, b, a, ... 2 s apart
    one = simulate_fleet(requests, figures, nodes=1, budget_bytes=10, placement="lru", eviction="lru")
    two = simulate_fleet(requests, figures, nodes=2, budget_bytes=10, placement="lru", eviction="lru")
    assert (one.loads, two.loads) == (10, 2)
    assert two.cold_start_rate == pytest.approx(0.2)


@needs_azure_functions
def test_a_tiny_fleet_end_to_end(tmp_path: Path) -> None:
    zoo = read_models(ZOO)
    fleet = build_fleet(zoo, 4 * len(zoo), 0.1, 0, tmp_path)
    assert len(fleet.figures) == 4 * len(zoo) and set(fleet.kinds.values()) <= set(zoo)
    assert {request.model for request in fleet.requests} <= set(fleet.figures)  # each copy its own model
    rows = run_seed(4, 0, zoo, 0.1, [0.4, 0.8], ["iam", "lru", "random"], tmp_path)
    assert [(row["memory"], row["policy"]) for row in rows] == [
        (memory, policy) for memory in (0.4, 0.8) for policy in ("iam", "lru", "random")
    ]
    assert len({row["requests"] for row in rows}) == 1  # one workload for every cell
    for row in rows:
        assert 0 < row["cold_start_rate"] <= 1 and row["loads"] <= row["cold_starts"]
        assert row["models_requested"] <= row["models_drawn"]
    summary = summarize(rows)
    assert set(summary["4"]) == {"40%", "80%"}
    assert set(summary["4"]["40%"]["iam_vs"]) == {"lru", "random"}
    report = {"settings": {"policies": ["iam", "lru", "random"], "models_per_node": 11, "sample": 0.1, "seeds": [0]}}
    plot({**report, "summary": summary}, tmp_path / "fleet.png")
    assert (tmp_path / "fleet.png").stat().st_size > 0
    json.dumps(summary)
