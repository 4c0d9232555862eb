"""The mCache server benchmark's bars over several seeds: per-seed IAM/LFU ratios, judged on their mean."""

from __future__ import annotations

import argparse
import json
from collections import Counter
from typing import Any

import pytest

from adaserve.cache.simulator import ModelFigures
from adaserve.cache.workload import Assignment
from benchmarks.mcache.server import (
    LOAD_TIMES,
    MODELS,
    CellKey,
    bars,
    distance_from_oracle,
    draw_sequence,
    parse_assignments,
    parse_seeds,
)


def cell(throughput: float, wait: float) -> dict[str, Any]:
    figures = {"throughput_rps": throughput, "mean_load_wait_s": wait}
    return {"server": figures, "simulator": figures}


def test_bars_are_judged_on_the_mean_of_the_seeds_ratios() -> None:
    cells: dict[CellKey, dict[str, Any]] = {
        ("iam", 0.4, 0, "random"): cell(1.8, 0.5),
        ("lfu", 0.4, 0, "random"): cell(1.0, 1.0),
        ("iam", 0.4, 1, "random"): cell(1.4, 0.9),
        ("lfu", 0.4, 1, "random"): cell(1.0, 1.0),
        ("iam", 0.4, 2, "random"): cell(9.0, 0.0),  # no LFU cell on seed 2: left out of the ratios
    }
    throughput, load_time = bars(cells, "server")
    assert throughput["bar"] == "IAM vs LFU throughput at 40%"
    assert throughput["value"] == pytest.approx(1.6)
    assert throughput["pass"] is True  # the mean reaches 1.5x, though seed 1 alone does not
    assert throughput["seeds"] == {"0": pytest.approx(1.8), "1": pytest.approx(1.4)}
    assert throughput["measured"] == "1.60x (mean of 2 seeds; 1.40x to 1.80x)"
    assert load_time["value"] == pytest.approx(0.3)
    assert load_time["pass"] is True
    assert load_time["measured"] == "30.0% lower (mean of 2 seeds; 10.0% lower to 50.0% lower)"


def test_one_seed_reports_its_ratio_alone() -> None:
    cells: dict[CellKey, dict[str, Any]] = {
        ("iam", 0.8, 3, "random"): cell(2.0, 0.2),
        ("lfu", 0.8, 3, "random"): cell(1.0, 0.0),
    }
    throughput, load_time = bars(cells, "simulator")
    assert (throughput["measured"], throughput["pass"]) == ("2.00x", False)  # 2.39x at 80%
    assert load_time["value"] == 0.0  # LFU never waited: IAM cannot be lower
    cells = {("iam", 0.6, 0, "random"): cell(1.0, 1.2), ("lfu", 0.6, 0, "random"): cell(1.0, 1.0)}
    assert bars(cells, "server")[0]["measured"] == "20.0% higher"
    assert bars({("iam", 0.6, 0, "random"): cell(1.0, 1.0)}, "server") == []


def test_bars_compare_on_the_random_assignment_only() -> None:
    cells: dict[CellKey, dict[str, Any]] = {
        ("iam", 0.4, 0, "random"): cell(1.2, 0.5),
        ("lfu", 0.4, 0, "random"): cell(1.0, 1.0),
        ("iam", 0.4, 0, "quantile"): cell(9.0, 0.0),
        ("lfu", 0.4, 0, "quantile"): cell(1.0, 1.0),
        ("iam", 0.8, 0, "quantile"): cell(9.0, 0.0),
        ("lfu", 0.8, 0, "quantile"): cell(1.0, 1.0),
    }
    throughput, load_time = bars(cells, "server")  # nothing at 80%: only the quantile workload has it
    assert (throughput["bar"], throughput["value"]) == ("IAM vs LFU throughput at 40%", pytest.approx(1.2))
    assert load_time["value"] == pytest.approx(0.5)


def test_seeds_must_be_distinct_integers() -> None:
    assert parse_seeds("0,1,2") == [0, 1, 2]
    with pytest.raises(argparse.ArgumentTypeError, match="expected integers"):
        parse_seeds("0,x")
    with pytest.raises(argparse.ArgumentTypeError, match="named twice"):
        parse_seeds("1,1")


def test_assignments_are_the_workload_builders() -> None:
    assert parse_assignments("random, Quantile-R") == ["random", "quantile-r"]
    with pytest.raises(argparse.ArgumentTypeError, match="'zipf': expected some of random, round-robin"):
        parse_assignments("random,zipf")
    with pytest.raises(argparse.ArgumentTypeError, match="named twice"):
        parse_assignments("quantile,quantile")


def test_distance_from_the_oracle_simulates_it_on_each_cells_sequence_and_budget() -> None:
    # Room for two of three models; A B C A B: the oracle evicts B for C (used last) and hits A; LRU evicts A and
    # then B, and hits nothing.
    figures = {name: ModelFigures(size_bytes=100, load_s=1.0, exec_s=0.1) for name in "ABC"}
    sequences = {"random:0": [[float(i), name] for i, name in enumerate("ABCAB")]}
    lru = {"hit_ratio": 0.0, "mean_load_wait_s": 1.0, "throughput_rps": 0.5}
    cells: dict[CellKey, dict[str, Any]] = {
        ("lru", 0.6, 0, "random"): {"budget_bytes": 200, "server": lru, "simulator": lru}
    }
    distance = distance_from_oracle(cells, sequences, figures)
    assert distance["server"] == {"lru": {"hit_ratio_gap": pytest.approx(0.2)}}
    assert distance["simulator"]["lru"]["hit_ratio_gap"] == pytest.approx(0.2)
    assert distance["simulator"]["lru"]["load_time_ratio"] > 1  # the oracle waited for 4 loads of 5 requests


def test_quantile_workloads_put_the_popular_functions_on_the_slowest_or_fastest_loads() -> None:
    measured = json.loads(LOAD_TIMES.read_text())["models"]
    by_load = sorted(MODELS, key=lambda name: measured[name]["load_s"])
    cases: tuple[tuple[Assignment, str], ...] = (("quantile", by_load[-1]), ("quantile-r", by_load[0]))
    for assign, expected in cases:
        sequence = draw_sequence(60, 0, assign)
        assert Counter(model for _, model in sequence).most_common(1)[0][0] == expected
        assert sequence == draw_sequence(60, 0, assign)  # a seed names one sequence
