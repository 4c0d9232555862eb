"""mCache in the server: `--model-memory-budget` makes models load on demand and evicts by policy to stay in budget."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.http as httpclient
from prometheus_client.parser import text_string_to_metric_families
from tritonclient.utils import InferenceServerException

from tests.server.reference import reference_outputs
from tests.server_utils import Clients, ServerHandle, link_example, running_server, write_broken_model
from tests.test_cli import adaserve

MODELS = ("mlp", "cnn", "mlp_torchscript")
ONE_WORKER = [{"batch": 4, "threads": 1}]


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("cached") / "models"
    for name in MODELS:
        link_example(root, name, workers=ONE_WORKER)
    write_broken_model(root)
    return root


@pytest.fixture(scope="module")
def roomy(repository: Path) -> Iterator[ServerHandle]:
    """A budget every model fits in: loads on demand, never evicts."""
    with running_server(repository, "--model-memory-budget", "50GiB", "--cache-policy", "lru") as handle:
        yield handle


def images(rows: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).random((rows, 784), dtype=np.float32)


def infer(server: ServerHandle, model: str, rows: np.ndarray) -> np.ndarray:
    data = rows if model != "cnn" else rows.reshape(-1, 1, 28, 28)
    tensor = httpclient.InferInput("image", list(data.shape), "FP32")
    tensor.set_data_from_numpy(data)
    with httpclient.InferenceServerClient(server.http_url) as client:  # one per call: infer runs on threads too
        output = client.infer(model, [tensor]).as_numpy("logits")
    assert output is not None
    return output


def metrics(server: ServerHandle) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = httpx.get(f"http://{server.http_url}/metrics").text
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def model_metric(server: ServerHandle, name: str, model: str) -> float:
    return metrics(server).get((name, (("model", model),)), 0.0)


def index_states(server: ServerHandle) -> dict[str, dict[str, str]]:
    rows = httpx.post(f"http://{server.http_url}/v2/repository/index", json={}).json()
    return {row["name"]: row for row in rows}


def test_models_load_on_their_first_request_and_answer_correctly(roomy: ServerHandle, clients: Clients) -> None:
    states = index_states(roomy)
    assert states["mlp"]["state"] == "UNAVAILABLE"
    assert "loaded on its next request" in states["mlp"]["reason"]
    client = clients.http(roomy.http_url)
    assert client.is_model_ready("mlp")  # servable: the cache loads it on demand
    assert client.get_model_metadata("mlp")["inputs"][0]["name"] == "image"  # from the config, no load needed

    rows = images(3)
    np.testing.assert_allclose(infer(roomy, "mlp", rows), reference_outputs("mlp", rows), rtol=1e-4, atol=1e-4)
    infer(roomy, "mlp", rows)
    assert index_states(roomy)["mlp"]["state"] == "READY"
    assert model_metric(roomy, "adaserve_model_cache_misses_total", "mlp") == 1
    assert model_metric(roomy, "adaserve_model_cache_hits_total", "mlp") == 1
    weights = (784 * 256 + 256 + 256 * 256 + 256 + 256 * 10 + 10) * 4
    assert model_metric(roomy, "adaserve_model_resident_bytes", "mlp") >= weights
    # Under a memory budget one spare host waits (the default), forked behind the first load, which forked its own.
    assert metrics(roomy)[("adaserve_spare_hosts", ())] == 1
    assert metrics(roomy)[("adaserve_model_host_launches_total", (("host", "cold"),))] >= 1


def test_concurrent_requests_for_a_model_being_loaded_share_one_load(roomy: ServerHandle) -> None:
    with ThreadPoolExecutor(6) as pool:
        outputs = list(pool.map(lambda seed: infer(roomy, "cnn", images(1, seed)), range(6)))
    assert all(output.shape == (1, 10) for output in outputs)
    assert model_metric(roomy, "adaserve_model_loads_total", "cnn") == 1


def test_a_model_that_fails_to_load_gets_its_cause_and_the_others_keep_serving(
    roomy: ServerHandle, clients: Clients
) -> None:
    client = clients.http(roomy.http_url)
    tensor = httpclient.InferInput("x", [1, 4], "FP32")
    tensor.set_data_from_numpy(np.zeros((1, 4), dtype=np.float32))
    with pytest.raises(InferenceServerException, match="broken") as failure:
        client.infer("broken", [tensor])
    assert "cannot load model" in str(failure.value)
    assert model_metric(roomy, "adaserve_model_load_failures_total", "broken") == 1
    assert infer(roomy, "mlp_torchscript", images(2)).shape == (2, 10)


def test_a_budget_for_one_model_evicts_the_others_and_every_request_is_answered(
    repository: Path, roomy: ServerHandle
) -> None:
    for name in MODELS:
        infer(roomy, name, images(1))
    sizes = [model_metric(roomy, "adaserve_model_resident_bytes", name) for name in MODELS]
    smallest_pair = sum(sorted(sizes)[:2])
    assert max(sizes) < smallest_pair
    budget = int((max(sizes) + smallest_pair) / 2)  # room for any one model, never for two
    with running_server(repository, "--model-memory-budget", str(budget)) as server:
        for round_ in range(2):
            for name in MODELS:
                rows = images(2, seed=round_)
                expected = reference_outputs(name, rows if name != "cnn" else rows.reshape(-1, 1, 28, 28))
                np.testing.assert_allclose(infer(server, name, rows), expected, rtol=1e-4, atol=1e-4)
                used = metrics(server)[("adaserve_model_cache_used_bytes", (("policy", "iam"),))]
                assert used <= budget
        evictions = sum(model_metric(server, "adaserve_model_evictions_total", name) for name in MODELS)
        assert evictions == 2 * len(MODELS) - 1  # every request but the first found another model in the way
        logged = [json.loads(line) for line in server.log.read_text().splitlines() if '"model evicted"' in line]
        assert len(logged) == evictions and all(line["level"] == "info" for line in logged)
        assert all(line["policy"] == "iam" and "eviction_rank" in line for line in logged)
        # Each says which model needed the room: before its load, or after it, when it came out larger than its
        # size hint said (a first load, before the size was measured).
        assert all(re.fullmatch(r"(to make room for|model '\w+' took) .*", line["reason"]) for line in logged), logged
        resident = [name for name, row in index_states(server).items() if row["state"] == "READY"]
        assert resident == [MODELS[-1]]


def test_a_model_larger_than_the_whole_budget_gets_a_clear_error(repository: Path, tmp_path: Path) -> None:
    with running_server(repository, "--model-memory-budget", "1000") as server:
        with pytest.raises(InferenceServerException, match="budget") as refused:
            infer(server, "mlp", images(1))
        assert "mlp" in str(refused.value)
        assert httpx.get(f"http://{server.http_url}/v2/health/ready").status_code == 200
        np.save(tmp_path / "x.npy", images(1))
        run = adaserve("infer", "mlp", "--input", str(tmp_path / "x.npy"), "--url", server.http_url)
    # The server answered, with a 507: exit 3, not the 1 of a server that could not be reached.
    assert run.returncode == 3 and "[507]" in run.stderr and "budget" in run.stderr, run.stderr


def test_a_malformed_budget_is_refused_at_the_command_line(repository: Path) -> None:
    from adaserve.cli import build_parser

    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--model-memory-budget", "lots"])


@pytest.mark.parametrize("policy", ["oracle", "iam-foresight", "iam-known-rate"])
def test_a_policy_that_needs_the_future_is_not_offered_to_the_server(policy: str) -> None:
    from adaserve.cli import build_parser

    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--model-memory-budget", "1GiB", "--cache-policy", policy])
