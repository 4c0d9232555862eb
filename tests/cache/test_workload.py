import csv
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from adaserve.bench.traces import TraceError
from adaserve.cache.workload import ASSIGNMENTS, build_workload, read_invocations
from tests.cache.factories import AZURE_FUNCTIONS, needs_azure_functions

#: Seven models by load time, longest first: m6 (7 s) ... m0 (1 s).
LOAD_S = {f"m{i}": float(i + 1) for i in range(7)}
BY_LOAD = sorted(LOAD_S, key=LOAD_S.__getitem__, reverse=True)


def _http_popularity() -> dict[str, int]:
    """Each HTTP function's invocations, read independently of the code under test."""
    with AZURE_FUNCTIONS.open(newline="") as stream:
        rows = list(csv.reader(stream))[1:]
    return {"/".join(r[:3]): sum(int(x) for x in r[4:]) for r in rows if r[3] == "http"}


@needs_azure_functions
def test_http_functions_only_and_the_most_popular_tenth_dropped() -> None:
    popularity = _http_popularity()
    limit = np.quantile(list(popularity.values()), 0.9)
    workload = build_workload(AZURE_FUNCTIONS, LOAD_S, assign="random", requests=500)
    assert set(workload.assignment) == {key for key, count in popularity.items() if count <= limit}
    assert workload.kept_functions + workload.dropped_functions == len(popularity)
    assert workload.dropped_functions == sum(count > limit for count in popularity.values()) > 0
    assert workload.available == sum(count for count in popularity.values() if count <= limit)


@needs_azure_functions
@pytest.mark.parametrize("assign", ASSIGNMENTS)
def test_downsampled_to_the_target_count_within_the_window(assign: str) -> None:
    workload = build_workload(
        AZURE_FUNCTIONS, LOAD_S, assign=assign, requests=700, seed=3, start_minute=600, minutes=60
    )
    times = [r.time_s for r in workload.requests]
    assert len(times) == 700
    assert times == sorted(times) and times[0] >= 0 and times[-1] < 3600
    assert {r.model for r in workload.requests} <= set(LOAD_S)


@needs_azure_functions
def test_assignments_of_one_seed_share_their_times() -> None:
    made = [build_workload(AZURE_FUNCTIONS, LOAD_S, assign=a, requests=300, seed=1) for a in ASSIGNMENTS]
    assert len({tuple(r.time_s for r in w.requests) for w in made}) == 1
    again = build_workload(AZURE_FUNCTIONS, LOAD_S, assign="random", requests=300, seed=1)
    assert again.requests == made[0].requests
    other = build_workload(AZURE_FUNCTIONS, LOAD_S, assign="random", requests=300, seed=2)
    assert other.requests != made[0].requests


@needs_azure_functions
def test_round_robin_goes_down_the_models_by_load_time_in_file_order() -> None:
    workload = build_workload(AZURE_FUNCTIONS, LOAD_S, assign="round-robin", requests=100)
    assert list(workload.assignment.values())[:9] == [*BY_LOAD, *BY_LOAD[:2]]


@needs_azure_functions
@pytest.mark.parametrize(("assign", "popular_model"), [("quantile", "m6"), ("quantile-r", "m0")])
def test_quantile_pairs_popularity_with_load_time(assign: str, popular_model: str) -> None:
    popularity = _http_popularity()
    workload = build_workload(AZURE_FUNCTIONS, LOAD_S, assign=assign, requests=2000)
    ranked = sorted(workload.assignment, key=lambda key: -popularity[key])
    assert workload.assignment[ranked[0]] == popular_model  # the most popular function: longest (or shortest) load
    groups = Counter(workload.assignment.values())
    assert max(groups.values()) - min(groups.values()) <= 1  # equal-count popularity quantiles
    per_model = Counter(r.model for r in workload.requests)
    assert per_model.most_common(1)[0][0] == popular_model
    order = BY_LOAD if assign == "quantile" else BY_LOAD[::-1]
    pops = [sum(popularity[k] for k, m in workload.assignment.items() if m == model) for model in order]
    assert pops == sorted(pops, reverse=True)


@needs_azure_functions
def test_random_uses_every_model() -> None:
    workload = build_workload(AZURE_FUNCTIONS, LOAD_S, assign="random", requests=1000)
    assert set(workload.assignment.values()) == set(LOAD_S)


@needs_azure_functions
def test_asking_for_more_requests_than_the_window_holds_is_an_error() -> None:
    with pytest.raises(TraceError, match=r"the window holds \d+ invocations"):
        build_workload(AZURE_FUNCTIONS, LOAD_S, assign="random", requests=10_000, minutes=10)
    with pytest.raises(TraceError, match="no minute 5; it covers 480-959"):
        build_workload(AZURE_FUNCTIONS, LOAD_S, assign="random", requests=10, start_minute=5)


def _write(tmp_path: Path, *lines: str) -> Path:
    path = tmp_path / "invocations.csv"
    path.write_text("\n".join(lines) + "\n")
    return path


HEADER = "HashOwner,HashApp,HashFunction,Trigger,1,2,3"


@pytest.mark.parametrize(
    ("row", "problem"),
    [
        ("o,a,f,http,1,x,3", r"line 3: invocation count 'x' \(column 6\) is not an integer"),
        ("o,a,f,http,1,2", "line 3: 6 fields, expected 7"),
        ("o,a,f,http,1,-2,3", "line 3: negative invocation count -2"),
        ("o,a,,http,1,2,3", "line 3: empty HashOwner, HashApp, HashFunction or Trigger"),
    ],
)
def test_a_malformed_row_names_file_line_and_problem(tmp_path: Path, row: str, problem: str) -> None:
    path = _write(tmp_path, HEADER, "o,a,g,http,1,2,3", row)
    with pytest.raises(TraceError, match=f"{path}: {problem}"):
        read_invocations(path)


def test_a_bad_header_or_missing_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="line 1: expected the header"):
        read_invocations(_write(tmp_path, "a,b,c,d,1", "o,a,f,http,1"))
    with pytest.raises(TraceError, match="line 1: the columns after Trigger must be minute numbers"):
        read_invocations(_write(tmp_path, "HashOwner,HashApp,HashFunction,Trigger,one"))
    with pytest.raises(TraceError, match="cannot read the invocations file"):
        read_invocations(tmp_path / "missing.csv")


def test_a_small_file_works_by_hand(tmp_path: Path) -> None:
    path = _write(tmp_path, HEADER, "o,a,f,http,2,0,1", "o,a,g,timer,5,5,5", "o,a,h,http,0,0,1", "o,a,k,http,0,2,0")
    workload = build_workload(path, {"fast": 0.1, "slow": 1.0}, assign="quantile", requests=3)
    assert workload.dropped_functions == 1  # f: 3 invocations, above the 90th percentile of (3, 1, 2), 2.8
    assert workload.assignment == {"o/a/k": "slow", "o/a/h": "fast"}  # the more popular gets the longer load
    assert sorted((int(r.time_s // 60), r.model) for r in workload.requests) == [(1, "slow"), (1, "slow"), (2, "fast")]
