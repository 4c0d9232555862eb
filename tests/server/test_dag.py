"""DAG queries through a real server and tritonclient: a query answered by two models in turn, the planner's
choice in the response, and the query beside models in metadata, config, statistics, the repository index and
/metrics; a query that cannot load says why and the rest keep serving."""

from __future__ import annotations

import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import yaml
from tritonclient.utils import InferenceServerException

from tests.server.test_poll import wait_for
from tests.server_utils import Clients, running_server, write_fussy_model, write_slow_model

ONE_WORKER = [{"batch": 4, "threads": 1}]
ROW = {"datatype": "FP32", "shape": [-1, 4]}


def write_dag(repository: Path, name: str, **overrides: Any) -> None:
    """first (double) → second, only on rows whose class is 0: double (fast, less accurate) or slow (y = x)."""
    document: dict[str, Any] = {
        "max_batch_size": 4,
        "inputs": [{"name": "x", **ROW}],
        "outputs": [{"name": "y", **ROW}],
        "probes": 3,
        "nodes": [
            {"name": "first", "options": [{"model": "double", "accuracy": 0.9}], "inputs": {"x": "x"}},
            {
                "name": "second",
                "when": {"source": "first.y", "argmax_in": [0]},
                "options": [{"model": "double", "accuracy": 0.5}, {"model": "slow", "accuracy": 0.99}],
                "inputs": {"x": "first.y"},
            },
        ],
        "results": {"y": ["second.y", "first.y"]},
    }
    document.update(overrides)
    (repository / name).mkdir()
    (repository / name / "dag.yaml").write_text(yaml.safe_dump(document))


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    repository = tmp_path_factory.mktemp("dag") / "models"
    repository.mkdir()
    write_fussy_model(repository, "double", workers=ONE_WORKER, batching={"policy": "elastic"})
    write_slow_model(repository, "slow", rounds=3000, max_batch_size=4, workers=ONE_WORKER)  # tens of ms
    write_dag(repository, "pipe")
    write_dag(
        repository,
        "unknown_model",
        nodes=[{"name": "first", "options": [{"model": "nope", "accuracy": 1}], "inputs": {"x": "x"}}],
        results={"y": ["first.y"]},
    )
    write_dag(
        repository,
        "miswired",
        nodes=[{"name": "first", "options": [{"model": "double", "accuracy": 1}], "inputs": {"image": "x"}}],
        results={"y": ["first.y"]},
    )
    with running_server(repository) as handle:
        yield handle


def infer(
    client: httpclient.InferenceServerClient,
    rows: np.ndarray,
    parameters: dict[str, Any] | None = None,
    model: str = "pipe",
) -> tuple[np.ndarray, dict[str, Any]]:
    tensor = httpclient.InferInput("x", list(rows.shape), "FP32")
    tensor.set_data_from_numpy(rows.astype(np.float32))
    result = client.infer(model, [tensor], parameters=parameters)
    return result.as_numpy("y"), result.get_response()["parameters"]


ROWS = np.array([[1, 0, 0, 0], [0, 1, 0, 0]], np.float32)


def test_the_planner_picks_per_node_and_rows_take_the_first_source_that_ran(server, clients: Clients) -> None:  # type: ignore[no-untyped-def]
    client = clients.http(server.http_url)
    y, parameters = infer(client, ROWS)  # no SLO: the most accurate option, slow (y = x)
    assert y.tolist() == [[2, 0, 0, 0], [0, 2, 0, 0]]
    assert parameters["dag_plan"] == "first=double,second=slow"

    y, parameters = infer(client, ROWS, {"latency_ms": 3})  # slow does not fit: double, fast, doubles again
    assert y.tolist() == [[4, 0, 0, 0], [0, 2, 0, 0]]
    assert parameters == {"dag_plan": "first=double,second=double", "latency_budget_ms": 3.0}

    y, parameters = infer(client, ROWS[1:], {"latency_ms": 3})
    assert y.tolist() == [[0, 2, 0, 0]] and parameters["dag_plan"] == "first=double,second=skipped"

    grpc = clients.grpc(server.grpc_url)
    tensor = grpcclient.InferInput("x", [2, 4], "FP32")
    tensor.set_data_from_numpy(ROWS)
    result = grpc.infer("pipe", [tensor])
    assert result.as_numpy("y").tolist() == [[2, 0, 0, 0], [0, 2, 0, 0]]
    assert result.get_response().parameters["dag_plan"].string_param == "first=double,second=slow"


def test_bad_requests_name_their_problem(server, clients: Clients) -> None:  # type: ignore[no-untyped-def]
    client = clients.http(server.http_url)
    with pytest.raises(InferenceServerException, match="'latency_ms' must be a positive number") as error:
        infer(client, ROWS, {"latency_ms": -1})
    assert error.value.status() == "400"
    with pytest.raises(InferenceServerException, match=r"shape \[2, 3\] does not match the model's \[-1, 4\]"):
        infer(client, ROWS[:, :3])
    with pytest.raises(InferenceServerException, match="negative input") as error:  # a node's model fails
        infer(client, -ROWS)
    assert error.value.status() == "500"
    assert infer(client, ROWS)[0].shape == (2, 4)  # and the query keeps serving


def test_a_query_that_cannot_load_says_why_and_the_rest_serve(server, clients: Clients) -> None:  # type: ignore[no-untyped-def]
    client = clients.http(server.http_url)
    index = {row["name"]: row for row in client.get_model_repository_index()}
    assert index["pipe"]["state"] == "READY" and index["double"]["state"] == "READY"
    assert index["unknown_model"]["state"] == "UNAVAILABLE"
    assert "node 'first': unknown model 'nope'" in index["unknown_model"]["reason"]
    assert "model 'double' takes inputs ['x'], the node wires ['image']" in index["miswired"]["reason"]
    assert not client.is_model_ready("miswired") and client.is_model_ready("pipe")
    with pytest.raises(InferenceServerException, match=r"DAG query 'miswired' is not loaded: .*takes inputs") as e:
        infer(client, ROWS, model="miswired")
    assert e.value.status() == "503"


def test_a_query_shows_as_a_model_does(server, clients: Clients) -> None:  # type: ignore[no-untyped-def]
    client = clients.http(server.http_url)
    infer(client, ROWS, {"latency_ms": 3})
    metadata = client.get_model_metadata("pipe")
    assert (metadata["platform"], metadata["versions"]) == ("dag", ["1"])
    assert metadata["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [-1, 4]}]
    config = client.get_model_config("pipe")
    assert yaml.safe_load(config["parameters"]["dag"]["string_value"])["nodes"][1]["name"] == "second"
    grpc = clients.grpc(server.grpc_url)
    assert grpc.get_model_config("pipe").config.platform == "dag"
    (stats,) = client.get_inference_statistics("pipe")["model_stats"]
    assert stats["inference_stats"]["success"]["count"] >= 1 and stats["inference_count"] >= 2
    names = {entry["name"] for entry in client.get_inference_statistics()["model_stats"]}
    assert {"pipe", "double", "slow"} <= names
    with urllib.request.urlopen(f"http://{server.http_url}/metrics", timeout=10) as response:
        text = response.read().decode()
    assert 'adaserve_dag_node_runs_total{dag="pipe",model="double",node="second"}' in text
    assert 'adaserve_dag_query_success_total{dag="pipe"}' in text


def test_unload_and_load_through_the_repository_api(server, clients: Clients) -> None:  # type: ignore[no-untyped-def]
    client = clients.http(server.http_url)
    client.unload_model("pipe")
    assert not client.is_model_ready("pipe")
    with pytest.raises(InferenceServerException, match="DAG query 'pipe' is not loaded") as error:
        infer(client, ROWS)
    assert error.value.status() == "503"
    client.load_model("pipe")
    assert infer(client, ROWS)[1]["dag_plan"] == "first=double,second=slow"
    client.unload_model("slow")  # an option unloaded: the planner passes over it rather than fail
    assert infer(client, ROWS)[1]["dag_plan"] == "first=double,second=double"
    client.load_model("slow")
    assert infer(client, ROWS)[1]["dag_plan"] == "first=double,second=slow"
    with pytest.raises(InferenceServerException, match="unknown model 'nothing'"):
        client.unload_model("nothing")


def test_the_poller_follows_dag_queries_on_disk(tmp_path: Path, clients: Clients) -> None:
    repository = tmp_path / "models"
    repository.mkdir()
    write_fussy_model(repository, "double", workers=ONE_WORKER, batching={"policy": "elastic"})
    write_slow_model(repository, "slow", rounds=1, max_batch_size=4, workers=ONE_WORKER)
    with running_server(repository, "--repository-poll-secs", "0.2") as server:
        client = clients.http(server.http_url)
        write_dag(repository, "pipe")  # added: loaded
        wait_for(lambda: client.is_model_ready("pipe"))
        assert infer(client, ROWS)[1]["dag_plan"] == "first=double,second=slow"

        def policy() -> str:
            return str(
                yaml.safe_load(client.get_model_config("pipe")["parameters"]["dag"]["string_value"])["budget_policy"]
            )

        document = yaml.safe_load((repository / "pipe" / "dag.yaml").read_text())
        (repository / "pipe" / "dag.yaml").write_text(yaml.safe_dump({**document, "budget_policy": "equal"}))
        wait_for(lambda: policy() == "equal")  # changed: reloaded

        (repository / "pipe" / "dag.yaml").unlink()  # removed: unloaded
        wait_for(lambda: not client.is_model_ready("pipe"))
        assert client.is_model_ready("double")


def test_under_a_memory_budget_the_options_load_on_demand(tmp_path: Path, clients: Clients) -> None:
    repository = tmp_path / "models"
    repository.mkdir()
    write_fussy_model(repository, "double", workers=ONE_WORKER, batching={"policy": "elastic"})
    write_slow_model(repository, "slow", rounds=1, max_batch_size=4, workers=ONE_WORKER)
    write_dag(repository, "pipe")
    with running_server(repository, "--model-memory-budget", "1GiB") as server:
        client = clients.http(server.http_url)
        # no model loads at start under a budget: the query's probes loaded its options through the model cache
        assert {row["name"]: row["state"] for row in client.get_model_repository_index()} == {
            "double": "READY",
            "slow": "READY",
            "pipe": "READY",
        }
        y, parameters = infer(client, ROWS)
        assert y.tolist() == [[2, 0, 0, 0], [0, 2, 0, 0]] and parameters["dag_plan"] == "first=double,second=slow"


def test_a_query_named_at_start_loads_as_a_query_not_as_a_model(tmp_path: Path, clients: Clients) -> None:
    repository = tmp_path / "models"
    repository.mkdir()
    write_fussy_model(repository, "double", workers=ONE_WORKER, batching={"policy": "elastic"})
    write_slow_model(repository, "slow", rounds=1, max_batch_size=4, workers=ONE_WORKER)
    write_fussy_model(repository, "other", workers=ONE_WORKER)
    write_dag(repository, "pipe")
    names = ("--model", "double", "--model", "slow", "--model", "pipe")
    with running_server(repository, *names) as server:
        client = clients.http(server.http_url)
        states = {row["name"]: row["state"] for row in client.get_model_repository_index()}
        assert states == {"double": "READY", "slow": "READY", "pipe": "READY", "other": "UNAVAILABLE"}
        assert "failed to load" not in server.log.read_text()
