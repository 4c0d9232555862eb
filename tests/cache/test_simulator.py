import json
from pathlib import Path

import pytest

from adaserve.cache.policies import POLICIES
from adaserve.cache.simulator import ModelFigures, read_models, simulate
from adaserve.cache.workload import Request, build_workload
from adaserve.errors import ConfigError, ModelTooLargeError
from tests.cache.factories import AZURE_FUNCTIONS, needs_azure_functions

#: Two models of which only one fits in 3 bytes.
TWO = {
    "A": ModelFigures(size_bytes=2, load_s=1.0, exec_s=0.5),
    "B": ModelFigures(size_bytes=2, load_s=2.0, exec_s=0.25),
}


def _requests(*pairs: tuple[float, str]) -> list[Request]:
    return [Request(time, model) for time, model in pairs]


def test_hit_ratio_and_load_time_worked_by_hand() -> None:
    requests = _requests((0.0, "A"), (0.1, "A"), (5.0, "B"), (10.0, "B"), (11.0, "A"))
    result = simulate(requests, TWO, 3, "lru")
    # A loads 0-1 and runs 1-1.5; the second A waited on that load and runs 1.5-2; B evicts A, loads 5-7, runs
    # to 7.25; B at 10 is the only hit; A evicts B, loads 11-12, runs to 12.5.
    assert (result.hits, result.loads, result.evictions) == (1, 3, 2)
    assert result.hit_ratio == pytest.approx(1 / 5)
    assert result.mean_load_wait_s == pytest.approx((1.0 + 0.9 + 2.0 + 0.0 + 1.0) / 5)
    assert result.loading_s == pytest.approx(4.0)
    assert result.mean_latency_s == pytest.approx((1.5 + 1.9 + 2.25 + 0.25 + 1.5) / 5)
    assert result.throughput_rps == pytest.approx(5 / 12.5)
    assert result.makespan_s == pytest.approx(12.5)


def test_a_busy_model_is_not_evicted_and_the_newcomer_waits() -> None:
    models = {"A": ModelFigures(2, load_s=1.0, exec_s=5.0), "B": ModelFigures(2, load_s=1.0, exec_s=1.0)}
    result = simulate(_requests((0.0, "A"), (2.0, "B")), models, 3, "lru")
    # A runs 1-6 pinned; B gets in at 6, loads to 7, runs to 8.
    assert result.mean_load_wait_s == pytest.approx((1.0 + 5.0) / 2)
    assert result.mean_latency_s == pytest.approx((6.0 + 6.0) / 2)


def test_loads_share_one_loader() -> None:
    models = {"A": ModelFigures(1, 1.0, 0.0), "B": ModelFigures(1, 1.0, 0.0)}
    result = simulate(_requests((0.0, "A"), (0.0, "B")), models, 2, "lru")
    assert result.mean_load_wait_s == pytest.approx((1.0 + 2.0) / 2)


def test_closed_loop_sends_the_next_request_at_each_answer() -> None:
    result = simulate(_requests((0.0, "A"), (100.0, "A"), (200.0, "B")), TWO, 3, "lru", clients=1)
    # A: load 0-1, run to 1.5; A: hit, run to 2; B: evicts A, loads 2-4, runs to 4.25.
    assert result.hits == 1
    assert result.makespan_s == pytest.approx(4.25)
    assert result.throughput_rps == pytest.approx(3 / 4.25)


def test_a_model_larger_than_the_budget_or_unknown_is_refused_up_front() -> None:
    with pytest.raises(ModelTooLargeError, match="model 'A' needs 2 bytes, more than the whole budget of 1"):
        simulate(_requests((0.0, "A")), TWO, 1, "lru")
    with pytest.raises(ConfigError, match="model 'C', which the models file does not describe"):
        simulate(_requests((0.0, "C")), TWO, 3, "lru")


#: Table 2 of the paper (Keras CNNs on a V100): size, load and execution time; a spread of sizes and penalties.
PAPER_MODELS = {
    "mobilenet_0.25": ModelFigures(int(1.9e6), 0.1318, 0.0160),
    "mobilenet_1.0": ModelFigures(int(17.1e6), 0.2096, 0.0175),
    "densenet": ModelFigures(int(43.9e6), 0.5863, 0.0308),
    "inception_v3": ModelFigures(int(95.7e6), 1.0106, 0.0347),
    "inception_resnet_v2": ModelFigures(int(121.6e6), 1.4763, 0.0474),
    "inception_v4": ModelFigures(int(171.2e6), 1.6423, 0.0515),
    "nasnet_large": ModelFigures(int(356.6e6), 3.7023, 0.0700),
}


@needs_azure_functions
@pytest.mark.parametrize("assign", ["random", "quantile"])
def test_the_oracle_hits_at_least_as_often_as_every_policy_on_the_real_trace(assign: str) -> None:
    load_s = {name: figures.load_s for name, figures in PAPER_MODELS.items()}
    workload = build_workload(AZURE_FUNCTIONS, load_s, assign=assign, requests=1500, seed=0)
    total = sum(figures.size_bytes for figures in PAPER_MODELS.values())
    for share in (0.6, 0.8):
        results = {name: simulate(workload.requests, PAPER_MODELS, int(total * share), name) for name in POLICIES}
        oracle = results.pop("oracle")
        best = max(results.values(), key=lambda r: r.hit_ratio)
        assert oracle.hit_ratio >= best.hit_ratio, (share, best.policy)
        online = [r for name, r in results.items() if not POLICIES[name].needs_future]
        assert oracle.mean_load_wait_s <= min(r.mean_load_wait_s for r in online)


def test_models_file_flat_or_under_models(tmp_path: Path) -> None:
    figures = {"a": {"size_bytes": 10, "load_s": 0.5, "exec_s": 0.01, "note": "ignored"}}
    flat, nested = tmp_path / "flat.json", tmp_path / "nested.json"
    flat.write_text(json.dumps(figures))
    nested.write_text(json.dumps({"machine": {}, "models": figures}))
    assert read_models(flat) == read_models(nested) == {"a": ModelFigures(10, 0.5, 0.01)}


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        ("{", "not JSON"),
        ("[]", "expected an object of models"),
        ('{"a": 3}', "model 'a': expected an object"),
        ('{"a": {"size_bytes": 1, "load_s": -1, "exec_s": 0}}', "model 'a': load_s must be a non-negative number"),
        ('{"a": {"size_bytes": 0, "load_s": 1, "exec_s": 0}}', "model 'a': size_bytes must be at least 1"),
        ('{"a": {"size_bytes": 1, "load_s": 1}}', "model 'a': exec_s must be a non-negative number, got None"),
    ],
)
def test_a_bad_models_file_is_named(tmp_path: Path, content: str, problem: str) -> None:
    path = tmp_path / "models.json"
    path.write_text(content)
    with pytest.raises(ConfigError, match=f"{path}: {problem}"):
        read_models(path)
