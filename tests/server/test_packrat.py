"""`workers: auto`: Packrat picks the worker set from the profile and switches it under load with no failed request.
With no `workers` line, Packrat plans from a usable profile at start, or from one measured in the background."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import tritonclient.http as httpclient

from adaserve.cpu.profiler import (
    Cell,
    ProfileRecord,
    ProfileSettings,
    Stability,
    StaleProfile,
    artifact_digest,
    fingerprint,
    load_profile,
    save_profile,
)
from adaserve.engine.worker_sets import PackratWorkerSet
from adaserve.repository import ModelRepository
from tests.server_utils import link_example, running_server, write_slow_model

THREADS, BATCHES = (1, 2), (1, 2, 4, 8, 16)
#: Packrat's settings for these tests: reconfigure within a second of the load moving.
PACKRAT = {"threads": 2, "initial_batch": 1, "reconfigure_timeout_s": 1.0, "window": 4, "sample_interval_s": 0.05}


def write_profile(model_dir: Path, latency_ms: dict[int, float]) -> None:
    """A profile for this machine whose latencies are `latency_ms[t] × b`: known, so the plans are known."""
    spec = ModelRepository(model_dir.parent).read(model_dir.name)
    settled = Stability(trials=3, spread_pct=0.0, stable=True)

    def cell(t: int, b: int) -> Cell:
        mean_s = latency_ms[t] * b / 1e3
        return Cell(threads=t, batch=b, mean_s=mean_s, p50_s=mean_s, std_s=0, runs=3, stability=settled)

    cells = tuple(cell(t, b) for t in THREADS for b in BATCHES)
    record = ProfileRecord(
        fingerprint=fingerprint(),
        model=spec.name,
        version=spec.version,
        artifact_sha256=artifact_digest(spec.artifact),
        torch="test",
        created="test",
        settings=ProfileSettings(),
        threads=THREADS,
        batches=BATCHES,
        cells=cells,
    )
    save_profile(model_dir, record)


def auto_model(repository: Path) -> Path:
    return link_example(repository, "mlp", "mlp_auto", workers="auto", packrat=PACKRAT)


def worker_set(client: httpclient.InferenceServerClient, model: str = "mlp_auto") -> dict[str, Any]:
    config = client.get_model_config(model)
    return json.loads(config["parameters"]["worker_set"]["string_value"])  # type: ignore[no-any-return]


def test_without_a_profile_the_fat_instance_is_the_stated_default(tmp_path: Path) -> None:
    auto_model(tmp_path)
    choice = PackratWorkerSet(ModelRepository(tmp_path).read("mlp_auto")).initial()
    assert [(w.batch, w.threads) for w in choice.workers] == [(1, 2)]
    assert "no profile" in choice.reason and "adaserve profile mlp_auto" in choice.reason
    assert choice.details["from_profile"] is False


def test_the_worker_set_follows_the_load_with_no_failed_request(tmp_path: Path) -> None:
    # A model that takes about 2 ms a row, so 16 clients queue at its worker on any machine. With the example MLP
    # (0.06 ms a row) a fast machine's worker kept up with all the Python clients could send, and B never moved.
    repository = tmp_path / "models"
    model = "slow_auto"
    write_profile(write_slow_model(repository, model, rounds=300, max_batch_size=16, workers="auto", packrat=PACKRAT),
                  {1: 0.1, 2: 0.07})  # fmt: skip
    with running_server(repository) as handle, httpclient.InferenceServerClient(handle.http_url) as client:
        before = worker_set(client, model)
        assert before["batch"] == 1 and before["instances"] == [[1, 2, 1]] and before["from_profile"] is True
        rng = np.random.default_rng(7)
        deadline = time.monotonic() + 60

        def send(seed: int) -> int:
            """Batch-1 requests until the set has changed (or the deadline); returns how many, all checked."""
            sent = 0
            with httpclient.InferenceServerClient(handle.http_url) as local:
                while time.monotonic() < deadline and (sent < 20 or worker_set(local, model)["reconfigurations"] == 0):
                    x = rng.random((1, 4), dtype=np.float32)
                    tensor = httpclient.InferInput("x", [1, 4], "FP32")
                    tensor.set_data_from_numpy(x)
                    np.testing.assert_array_equal(local.infer(model, [tensor]).as_numpy("y"), x)  # Spin returns x
                    sent += 1
            return sent

        with ThreadPoolExecutor(16) as pool:
            sent = sum(pool.map(send, range(16)))
        after = worker_set(client, model)
        stats = client.get_inference_statistics(model)["model_stats"][0]["inference_stats"]

    # The B the estimator settles on depends on how fast this machine drains the queue; with this profile any
    # B >= 2 is best served by 1-thread workers, where B = 1 was served by one 2-thread worker.
    assert after["reconfigurations"] >= 1, after
    assert after["batch"] >= 2, after
    assert all(threads == 1 for _, threads, _ in after["instances"]), after
    assert stats["fail"]["count"] == 0 and stats["success"]["count"] == sent


# -- a model with no `workers` line ----------------------------------------------------------------------------------


def infer_once(client: httpclient.InferenceServerClient, model: str) -> None:
    """One request of the example MLP, answered with its 10 logits."""
    tensor = httpclient.InferInput("image", [1, 784], "FP32")
    tensor.set_data_from_numpy(np.zeros((1, 784), np.float32))
    assert client.infer(model, [tensor]).as_numpy("logits").shape == (1, 10)


def wait_for(
    client: httpclient.InferenceServerClient, model: str, done: Callable[[dict[str, Any]], bool]
) -> dict[str, Any]:
    """The model's worker-set document once `done` holds for it; a generous deadline, as the profile runs only on
    CPU time serving and other work leave."""
    deadline = time.monotonic() + 300
    while not done(document := worker_set(client, model)):
        assert time.monotonic() < deadline, document
        time.sleep(0.2)
    return document


def test_with_no_workers_line_a_usable_profile_is_planned_from_at_start(tmp_path: Path) -> None:
    repository = tmp_path / "models"
    write_profile(link_example(repository, "mlp", "mlp_implicit", packrat={"threads": 2}), {1: 0.1, 2: 0.07})
    with running_server(repository) as handle, httpclient.InferenceServerClient(handle.http_url) as client:
        document = worker_set(client, "mlp_implicit")
        infer_once(client, "mlp_implicit")
    assert document["planner"] == "packrat" and document["from_profile"] is True and document["batch"] == 16
    assert str(document["reason"]).startswith("Packrat plan ⟨") and "profile of test" in str(document["reason"])
    assert document["background"] is None and document["reconfigurations"] == 0


def test_without_a_profile_the_default_set_serves_until_the_background_profile_plans(tmp_path: Path) -> None:
    """A small profile (T = 1, b = 1, 2) with a stability percentage no three trials can miss (each trial's mean
    is at most 3 × the three's mean): it settles however busy the machine is, and the model switches to its plan."""
    repository = tmp_path / "models"
    packrat = {"background_profile": True, "threads": 1, "profile_stability_percentage": 200.0}
    model_dir = link_example(repository, "mlp", "mlp_bg", max_batch_size=2, packrat=packrat)
    spec = ModelRepository(repository).read("mlp_bg")
    with running_server(repository) as handle, httpclient.InferenceServerClient(handle.http_url) as client:
        before = worker_set(client, "mlp_bg")
        infer_once(client, "mlp_bg")
        after = wait_for(client, "mlp_bg", lambda document: document["reconfigurations"] > 0)
        infer_once(client, "mlp_bg")
        log = handle.log.read_text()
    assert before["planner"] == "default" and str(before["reason"]).startswith("default set")
    assert [w["batch"] for w in before["workers"]] == [w.batch for w in spec.config.worker_set]
    assert str(before["background"]).startswith("profiling in the background (no profile.json in ")
    assert after["planner"] == "packrat" and after["from_profile"] is True and after["batch"] == 2
    assert after["instances"] == [[1, 1, 2]] and after["background"] is None
    assert isinstance(load_profile(model_dir, fingerprint(), spec), ProfileRecord)  # the next start uses it at once
    assert "default set; profiling in the background: no profile.json" in log
    assert "Packrat plan from the profile of " in log and "worker set switched" in log


def test_an_unstable_background_profile_keeps_the_default_set_and_says_why(tmp_path: Path) -> None:
    """A stability percentage no trials meet: the profile's one cell is stored as unstable, and not planned from."""
    repository = tmp_path / "models"
    packrat = {"background_profile": True, "threads": 1, "profile_stability_percentage": 1e-9, "profile_retry_s": 3600}
    model_dir = link_example(repository, "mlp", "mlp_noisy", max_batch_size=1, packrat=packrat)
    spec = ModelRepository(repository).read("mlp_noisy")
    with running_server(repository) as handle, httpclient.InferenceServerClient(handle.http_url) as client:
        document = wait_for(client, "mlp_noisy", lambda document: "in the background" not in document["background"])
        infer_once(client, "mlp_noisy")
        log = handle.log.read_text()
    background = str(document["background"])
    assert (
        background.startswith("profile unstable: unstable cells t=1 b=1 (spread ")
        and "retrying in 3600 s" in background
    )
    assert document["planner"] == "default" and document["reconfigurations"] == 0
    assert isinstance(load_profile(model_dir, fingerprint(), spec), StaleProfile)  # stored, not planned from
    assert "profile unstable: unstable cells t=1 b=1" in log
