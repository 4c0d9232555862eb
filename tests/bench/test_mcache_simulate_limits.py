"""The simulator benchmark's bars carry the limit: what no policy passes, from the least load time any schedule has."""

from __future__ import annotations

from typing import Any

import pytest

from adaserve.cache.simulator import ModelFigures
from adaserve.cache.workload import Request
from benchmarks.mcache.simulate import bars, limit, summarize_limits


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
