"""The simulator benchmark's bars carry the limit: what no policy passes, from the least load time any schedule has."""

from __future__ import annotations

from typing import Any

import pytest

from adaserve.cache.simulator import ModelFigures
from adaserve.cache.workload import Request
from benchmarks.mcache.simulate import bars, limit, optimum_bars, optimum_distance, summarize_limits


def cell(throughput: float, wait: float) -> dict[str, float]:
    return {"throughput_rps": throughput, "mean_load_wait_s": wait}


def test_each_bar_says_how_far_any_policy_could_go_and_whether_that_reaches_it() -> None:
    shares = {"40%": 1.0, "60%": 1.0, "80%": 1.0}
    summary: dict[str, Any] = {
        "random": {share: {"iam": cell(2.0, 0.5), "lfu": cell(1.0, 1.0)} for share in shares},
    }
    limits = {"random": {share: {"most_throughput_rps": 2.0, "least_mean_load_wait_s": 0.5} for share in shares}}
    checks = {check["bar"]: check for check in bars(summary, limits)}
    at40, at80 = checks["IAM vs LFU throughput at 40%"], checks["IAM vs LFU throughput at 80%"]
    assert (at40["pass"], at40["most_possible"], at40["reachable"]) == (True, "2.000x", True)
    assert (at80["pass"], at80["reachable"]) == (False, False)  # 2.39x asked, 2x possible
    load = checks["IAM vs LFU mean load time at 80%"]
    assert (load["measured"], load["most_possible"], load["reachable"]) == ("50.0% lower", "50.0% lower", False)


def test_the_limit_of_a_sequence_is_its_least_load_time_with_the_execution_beside_it() -> None:
    models = {"a": ModelFigures(2, 1.0, 0.5), "b": ModelFigures(2, 3.0, 0.5)}
    requests = [Request(float(i), name) for i, name in enumerate("abab")]
    figures = limit(requests, models, 2)  # one model at a time: every request loads (1 + 3 + 1 + 3)
    assert figures["least_load_s"] == pytest.approx(8.0)
    # With 3 bytes a cache still holds one model, but the relaxation keeps half of each: a bound, not an optimum.
    assert limit(requests, models, 3)["least_load_s"] == pytest.approx(1 + 3 + 0.5 * 1 + 0.5 * 3)
    assert figures["most_throughput_rps"] == pytest.approx(4 / (8.0 + 2.0))
    assert figures["least_mean_load_wait_s"] == pytest.approx(2.0)
    rows = [{"assign": "random", "share": 0.4, **figures}, {"assign": "random", "share": 0.4, **figures}]
    assert summarize_limits(rows)["random"]["40%"]["least_load_s"] == pytest.approx(8.0)


def test_the_limit_carries_the_exact_optimum_which_no_relaxation_passes() -> None:
    models = {"a": ModelFigures(2, 1.0, 0.5), "b": ModelFigures(2, 3.0, 0.5)}
    requests = [Request(float(i), name) for i, name in enumerate("abab")]
    figures = limit(requests, models, 3)  # one model at a time: the optimum pays every load, the LP half of two
    assert figures["optimal_load_s"] == pytest.approx(8.0) and figures["optimal_proven"] == 1.0
    assert figures["least_load_s"] <= figures["optimal_bound_s"] <= figures["optimal_load_s"]
    assert figures["optimal_throughput_rps"] == pytest.approx(4 / (8.0 + 2.0))


def test_issue_bars_judge_iam_against_the_optimum_and_the_better_form_of_gdsf_and_of_lru() -> None:
    def figures(throughput: float, wait: float) -> dict[str, float]:
        return {"throughput_rps": throughput, "mean_load_wait_s": wait, "loading_s": wait * 10}

    shares = ("20%", "40%", "60%", "80%")
    summary: dict[str, Any] = {
        "random": {
            share: {
                "iam": figures(0.9, 0.6),
                "gdsf": figures(0.9, 0.7),
                "gdsf-cover": figures(0.9, 0.8),
                "lru": figures(0.8, 1.2),
                "lru-cover": figures(0.8, 1.0),
            }
            for share in shares
        }
    }
    limits = {"random": {share: {"optimal_throughput_rps": 1.0, "optimal_load_s": 5.0} for share in shares}}
    summary["random"]["80%"]["iam"] = figures(0.9, 0.7)  # 30% below LRU's, as low as GDSF's
    judged = {check["bar"]: check for check in optimum_bars(summary, limits)}
    checks = {bar: check["pass"] for bar, check in judged.items()}
    assert checks["IAM throughput vs the optimum at 40%"] and checks["IAM vs GDSF mean load time at 80%"]
    assert checks["IAM vs LRU mean load time at 60%"] and not checks["IAM vs LRU mean load time at 80%"]
    assert judged["IAM vs GDSF mean load time at 40%"]["measured"] == "600.0 vs 700.0 ms (gdsf)"
    assert judged["IAM vs LRU mean load time at 40%"]["measured"] == "40.0% lower (lru-cover)"
    for share in shares:
        summary["random"][share]["iam-known-rate"] = figures(0.8, 0.5)
    known = {check["bar"]: check["pass"] for check in optimum_bars(summary, limits, "iam-known-rate")}
    assert not known["IAM with known rates throughput vs the optimum at 40%"]
    assert known["IAM with known rates vs GDSF mean load time at 80%"] and len(known) == 11
    distance = optimum_distance(summary, limits)
    assert distance["iam"] == pytest.approx({"load_time_ratio": 1.25, "throughput_ratio": 0.9})
