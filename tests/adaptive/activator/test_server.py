"""Through a real server with tritonclient: targeted requests get k and the mode back, plain requests are
unchanged, bad targets are 400s, a stale activator falls back to dense or fails the load as configured, and a CNN
is served through its MLP head."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import yaml
from tritonclient.utils import InferenceServerException

from adaserve.adaptive.activator.build import DEFAULT_GRID, BuildData, BuildOptions, build_activator
from adaserve.datasets import load_fashion_mnist
from adaserve.repository import ModelRepository
from tests.server_utils import Clients, ServerHandle, link_example, running_server

#: One worker of batch 4 that waits up to 20 ms to fill it, so concurrent requests share batches.
SHARED_BATCHES = {
    "workers": [{"batch": 4, "threads": 1}],
    "batching": {"policy": "fixed-timeout", "max_queue_delay_us": 20_000},
}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerHandle]:
    root = tmp_path_factory.mktemp("activator") / "models"
    root.mkdir()
    link_example(root, "mlp", workers=[{"batch": 4, "threads": 1}])
    link_example(root, "mlp", "mlp_slo", activator={}, **SHARED_BATCHES)
    train_x, _ = load_fashion_mnist("train")
    test_x, test_y = load_fashion_mnist("test")
    data = BuildData(train_x[:4000], test_x[:1000], test_y[:1000], "fashion-mnist subset")
    options = BuildOptions(bits=6, tables=8, max_confidence_inputs=1000, busy_levels=1, latency_repeats=20)
    folder, _ = build_activator(ModelRepository(root).read("mlp_slo"), data, options, progress=False)
    link_example(root, "cnn", workers=[{"batch": 4, "threads": 1}])
    link_example(root, "cnn", "cnn_slo", activator={}, workers=[{"batch": 4, "threads": 1}])
    cnn_data = BuildData(train_x[:1000], test_x[:300], test_y[:300], "fashion-mnist subset")
    cnn_options = BuildOptions(bits=4, tables=8, max_confidence_inputs=300, busy_levels=1, latency_repeats=20)
    build_activator(ModelRepository(root).read("cnn_slo"), cnn_data, cnn_options, progress=False)
    for name, on_mismatch in (("mlp_stale", "dense"), ("mlp_strict", "error")):
        target = link_example(root, "mlp", name, activator={"on_mismatch": on_mismatch}, workers=[{"batch": 1}])
        shutil.copytree(folder, target / "activator" / "1")
        meta_file = target / "activator" / "1" / "activator.json"
        meta = json.loads(meta_file.read_text())
        meta_file.write_text(json.dumps({**meta, "model_version": 2}))  # built "for another version"
    write_slo_chain(root)
    with running_server(root) as handle:
        yield handle


def write_slo_chain(root: Path) -> None:
    """A DAG query of two nodes in a row, each `mlp_slo` on the image (the second after the first, on every row):
    a tight SLO is spent before the second runs, and its model reads the budget left as its `latency_ms`."""
    image = {"name": "image", "datatype": "FP32", "shape": [-1, 784]}
    every_class = {"source": "first.logits", "argmax_in": list(range(10))}
    document = {
        "max_batch_size": 4,
        "inputs": [image],
        "outputs": [{"name": "logits", "datatype": "FP32", "shape": [-1, 10]}],
        "nodes": [
            {"name": "first", "options": [{"model": "mlp_slo", "accuracy": 0.9}], "inputs": {"image": "image"}},
            {
                "name": "second",
                "when": every_class,
                "options": [{"model": "mlp_slo", "accuracy": 0.9}],
                "inputs": {"image": "image"},
            },
        ],
        "results": {"logits": ["second.logits", "first.logits"]},
    }
    (root / "slo_chain").mkdir()
    (root / "slo_chain" / "dag.yaml").write_text(yaml.safe_dump(document))


def _infer(server: ServerHandle, model: str, rows: np.ndarray, parameters: dict[str, Any] | None = None
           ) -> tuple[np.ndarray, dict[str, Any]]:  # fmt: skip
    tensor = httpclient.InferInput("image", list(rows.shape), "FP32")
    tensor.set_data_from_numpy(rows)
    with httpclient.InferenceServerClient(server.http_url) as client:  # one per call: _infer runs on threads too
        result = client.infer(model, [tensor], parameters=parameters)
    return result.as_numpy("logits"), result.get_response().get("parameters", {})


@pytest.fixture(scope="module")
def images() -> np.ndarray:
    test_x, _ = load_fashion_mnist("test")
    return np.ascontiguousarray(test_x[5000:5008].reshape(8, 784))


def test_plain_requests_are_unchanged_and_targeted_ones_report_k_and_mode(
    server: ServerHandle, images: np.ndarray
) -> None:
    reference, _ = _infer(server, "mlp", images[:4])
    plain, parameters = _infer(server, "mlp_slo", images[:4])
    np.testing.assert_array_equal(plain, reference)
    assert "mode" not in parameters

    _, parameters = _infer(server, "mlp_slo", images[:1], {"accuracy": 0.8})
    assert parameters["mode"] == "aclo" and parameters["k"] in DEFAULT_GRID
    exact, parameters = _infer(server, "mlp_slo", images[:4], {"accuracy": 1.0})  # unreachable: k = 100%
    layers = parameters.pop("layers").split(",")  # which ran dense is the build's measurement
    assert len(layers) == 3 and set(layers) <= {"sparse", "dense"}
    assert parameters == {"mode": "aclo", "k": 1.0}
    np.testing.assert_allclose(exact, reference, rtol=1e-4, atol=1e-4)

    _, parameters = _infer(server, "mlp_slo", images[:2], {"latency_ms": 50})
    assert parameters["mode"] == "lcao" and 0 < parameters["k"] <= 1 and parameters["interference"] >= 0


def test_a_cnn_is_served_through_its_mlp_head(server: ServerHandle, images: np.ndarray) -> None:
    pictures = np.ascontiguousarray(images.reshape(-1, 1, 28, 28))
    reference, _ = _infer(server, "cnn", pictures[:4])
    plain, parameters = _infer(server, "cnn_slo", pictures[:4])
    np.testing.assert_array_equal(plain, reference)
    assert "mode" not in parameters

    exact, parameters = _infer(server, "cnn_slo", pictures[:4], {"latency_ms": 1e6})  # every k fits: k = 100%
    assert parameters["mode"] == "lcao" and parameters["k"] == 1.0
    np.testing.assert_allclose(exact, reference, rtol=1e-4, atol=1e-4)
    _, parameters = _infer(server, "cnn_slo", pictures[:1], {"accuracy": 0.8})
    assert parameters["mode"] == "aclo" and parameters["k"] in DEFAULT_GRID
    _, parameters = _infer(server, "cnn_slo", pictures[:2], {"latency_ms": 50})
    assert parameters["mode"] == "lcao" and 0 < parameters["k"] <= 1 and parameters["interference"] >= 0


def test_plain_and_targeted_requests_sharing_a_batch_each_get_their_own_path(
    server: ServerHandle, images: np.ndarray
) -> None:
    reference, _ = _infer(server, "mlp", images)
    targets: list[dict[str, Any] | None] = [None, {"accuracy": 0.85}, None, {"latency_ms": 20}] * 2
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda i: _infer(server, "mlp_slo", images[i : i + 1], targets[i]), range(8)))
    for index, ((logits, parameters), target) in enumerate(zip(results, targets, strict=True)):
        if target is None:  # the model's own path (a batch of another size rounds differently in the last bit)
            np.testing.assert_allclose(logits[0], reference[index], rtol=1e-5, atol=1e-5)
            assert "mode" not in parameters
        else:
            assert parameters["mode"] == ("aclo" if "accuracy" in target else "lcao")


@pytest.mark.parametrize(
    ("parameters", "named"),
    [({"accuracy": 1.5}, "accuracy"), ({"accuracy": 0}, "accuracy"), ({"latency_ms": -1}, "latency_ms")],
)
def test_a_target_out_of_range_is_a_400_naming_it(
    server: ServerHandle, images: np.ndarray, parameters: dict[str, Any], named: str
) -> None:
    with pytest.raises(InferenceServerException, match=f"parameter '{named}'") as caught:
        _infer(server, "mlp_slo", images[:1], parameters)
    assert caught.value.status() == "400"


def test_a_target_out_of_range_is_invalid_argument_over_grpc(
    server: ServerHandle, images: np.ndarray, clients: Clients
) -> None:
    client = clients.grpc(server.grpc_url)
    tensor = grpcclient.InferInput("image", [1, 784], "FP32")
    tensor.set_data_from_numpy(images[:1])
    with pytest.raises(InferenceServerException, match="parameter 'latency_ms'") as caught:
        client.infer("mlp_slo", [tensor], parameters={"latency_ms": 0})
    assert caught.value.status() == "StatusCode.INVALID_ARGUMENT"


def test_an_activator_for_another_version_falls_back_to_dense_or_fails_the_load(
    server: ServerHandle, images: np.ndarray
) -> None:
    reference, _ = _infer(server, "mlp", images[:2])
    logits, parameters = _infer(server, "mlp_stale", images[:2], {"accuracy": 0.9})
    assert parameters == {"mode": "dense", "k": 1.0}
    np.testing.assert_allclose(logits, reference, rtol=1e-4, atol=1e-4)
    with pytest.raises(InferenceServerException, match="built for model version 2, not version 1") as caught:
        _infer(server, "mlp_strict", images[:1])
    assert caught.value.status() == "503"
    _infer(server, "mlp", images[:1])  # the server keeps serving the others


def test_a_dag_budget_spent_before_its_second_node_is_no_400(server: ServerHandle, images: np.ndarray) -> None:
    """A 0.5 ms SLO over two nodes: the second node's request carried the spent, negative budget as its
    `latency_ms`, and `mlp_slo` refused it as the client's error (13 of 40 queries failed with a 400). The node
    now asks its model for its fastest answer, and the query counts as a missed SLO."""
    for index in range(40):
        logits, parameters = _infer(server, "slo_chain", images[index % 8 : index % 8 + 1], {"latency_ms": 0.5})
        assert logits.shape == (1, 10) and parameters["dag_plan"] == "first=mlp_slo,second=mlp_slo"


def test_accuracy_with_latency_ms_says_which_won(server: ServerHandle, images: np.ndarray, clients: Clients) -> None:
    conflict = "latency_ms: conflicts with accuracy, which won (SLO-NNs serves an accuracy target first)"
    _, parameters = _infer(server, "mlp_slo", images[:1], {"accuracy": 0.8, "latency_ms": 50})
    assert parameters["mode"] == "aclo" and parameters["ignored_parameters"] == conflict
    tensor = grpcclient.InferInput("image", [1, 784], "FP32")
    tensor.set_data_from_numpy(images[:1])
    result = clients.grpc(server.grpc_url).infer("mlp_slo", [tensor], parameters={"accuracy": 0.8, "latency_ms": 50})
    answered = result.get_response().parameters
    assert answered["mode"].string_param == "aclo" and answered["ignored_parameters"].string_param == conflict
    _, parameters = _infer(server, "mlp_slo", images[:1], {"latency_ms": 50})
    assert "ignored_parameters" not in parameters


def test_a_dag_query_names_its_unknown_parameters(server: ServerHandle, images: np.ndarray) -> None:
    _, parameters = _infer(server, "slo_chain", images[:1], {"latency_ms": 50, "accuracy": 0.8, "foo": 1})
    assert parameters["ignored_parameters"] == "foo: unknown parameter"
