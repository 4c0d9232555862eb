"""The REST frontend against a real server, with `tritonclient.http`, raw HTTP and curl."""

from __future__ import annotations

import http.client
import json
import os
import random
import shutil
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from adaserve.datasets import load_fashion_mnist
from tests.conftest import MAX_REQUEST_BYTES
from tests.server.reference import MODEL_INPUT_SHAPES, reference_outputs
from tests.server_utils import EXAMPLES, ServerHandle


def http_post(server: ServerHandle, path: str, body: bytes, headers: dict[str, str] | None = None) -> tuple[int, Any]:
    request = urllib.request.Request(f"http://{server.http_url}{path}", data=body, headers=headers or {}, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def infer_json(model: str, array: np.ndarray, name: str = "image", datatype: str = "FP32") -> bytes:
    tensor = {"name": name, "datatype": datatype, "shape": list(array.shape), "data": array.ravel().tolist()}
    return json.dumps({"inputs": [tensor]}).encode()


def client_infer(
    client: httpclient.InferenceServerClient, model: str, array: np.ndarray, *, binary: bool = True, **kwargs: Any
) -> Any:
    tensor = httpclient.InferInput("image", list(array.shape), "FP32")
    tensor.set_data_from_numpy(array, binary_data=binary)
    outputs = [httpclient.InferRequestedOutput("logits", binary_data=binary)]
    return client.infer(model, [tensor], outputs=outputs, **kwargs)


@pytest.fixture(scope="module")
def client(server: ServerHandle) -> Iterator[httpclient.InferenceServerClient]:
    with httpclient.InferenceServerClient(server.http_url, concurrency=8) as opened:
        yield opened


def test_health_and_metadata(client: httpclient.InferenceServerClient, server: ServerHandle) -> None:
    assert client.is_server_live() and client.is_server_ready()
    assert _health(server, "/v2/health/live") == (200, {"live": True})
    assert _health(server, "/v2/health/ready") == (200, {"ready": True})
    assert _health(server, "/v2/models/cnn/versions/1/ready") == (200, {"name": "cnn", "ready": True})
    assert _health(server, "/") == (200, {"status": "alive"})  # KServe's V1 liveness
    metadata = client.get_server_metadata()
    assert metadata["name"] == "adaserve" and "binary_tensor_data" in metadata["extensions"]
    model = client.get_model_metadata("cnn")
    assert model["inputs"] == [{"name": "image", "datatype": "FP32", "shape": [-1, 1, 28, 28]}]
    assert model["outputs"][0]["name"] == "logits" and model["versions"] == ["1"]
    assert client.is_model_ready("mlp") and not client.is_model_ready("broken")


@pytest.mark.parametrize("model", ["mlp", "cnn", "mlp_torchscript"])
@pytest.mark.parametrize("binary", [True, False])
def test_outputs_equal_torch(client: httpclient.InferenceServerClient, model: str, binary: bool) -> None:
    array = np.random.default_rng(0).random((3, *MODEL_INPUT_SHAPES[model]), dtype=np.float32)
    result = client_infer(client, model, array, binary=binary, request_id="req-7")
    np.testing.assert_allclose(result.as_numpy("logits"), reference_outputs(model, array), rtol=1e-5, atol=1e-5)
    assert result.get_response()["id"] == "req-7"


def test_known_accuracy_through_the_server(client: httpclient.InferenceServerClient) -> None:
    """The whole Fashion-MNIST test split through the server reproduces the accuracy recorded at training."""
    images, labels = load_fashion_mnist("test")
    flat = images.reshape(len(images), -1)
    requests = [client.async_infer("mlp", _inputs(flat[i : i + 16])) for i in range(0, len(flat), 16)]
    predictions = np.concatenate([r.get_result().as_numpy("logits").argmax(axis=1) for r in requests])
    recorded = json.loads((EXAMPLES / "mlp" / "1" / "metrics.json").read_text())["test_accuracy"]
    assert float((predictions == labels).mean()) == pytest.approx(recorded, abs=1e-3)


def _inputs(array: np.ndarray) -> list[httpclient.InferInput]:
    tensor = httpclient.InferInput("image", list(array.shape), "FP32")
    tensor.set_data_from_numpy(np.ascontiguousarray(array))
    return [tensor]


@pytest.mark.parametrize("model", ["mlp", "mlp_fixed", "mlp_none"])
def test_concurrent_mixed_batches(server: ServerHandle, model: str) -> None:
    """Many concurrent requests of batch 1..16 on every batching policy: each gets exactly its own rows back."""
    rng = np.random.default_rng(1)
    arrays = [rng.random((int(rng.integers(1, 17)), 784), dtype=np.float32) for _ in range(160)]

    def send(array: np.ndarray) -> np.ndarray:
        with httpclient.InferenceServerClient(server.http_url) as local:
            return client_infer(local, model, array).as_numpy("logits")

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(send, arrays))
    expected = reference_outputs("mlp", np.concatenate(arrays))
    np.testing.assert_allclose(np.concatenate(results), expected, rtol=1e-5, atol=1e-5)


def test_parameters_are_accepted(client: httpclient.InferenceServerClient) -> None:
    array = np.ones((1, 784), dtype=np.float32)
    parameters = {"latency_ms": 5, "accuracy": 0.99, "early_exit": False, "tag": "a"}
    result = client_infer(client, "mlp", array, parameters=parameters, priority=1)
    np.testing.assert_allclose(result.as_numpy("logits"), reference_outputs("mlp", array), rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
def test_plain_curl(server: ServerHandle) -> None:
    array = np.zeros((1, 784), dtype=np.float32)
    body = infer_json("mlp", array).decode()
    out = subprocess.run(
        ["curl", "-sS", "-X", "POST", f"http://{server.http_url}/v2/models/mlp/infer", "-d", body],
        capture_output=True,
        check=True,
        text=True,
    ).stdout
    logits = json.loads(out)["outputs"][0]["data"]
    np.testing.assert_allclose(logits, reference_outputs("mlp", array)[0], rtol=1e-5, atol=1e-5)
    live = subprocess.run(
        ["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", f"http://{server.http_url}/v2/health/live"],
        capture_output=True,
        text=True,
    ).stdout
    assert live == "200"


GOOD = np.zeros((1, 784), dtype=np.float32)


def _health(server: ServerHandle, path: str) -> tuple[int, Any]:
    """A health route's status and JSON body (the Open Inference Protocol's REST form of each answer)."""
    connection = http.client.HTTPConnection(server.http_url, timeout=10)
    try:
        connection.request("GET", path)
        answer = connection.getresponse()
        return answer.status, json.loads(answer.read())
    finally:
        connection.close()


def _with_parameters(parameters: dict[str, Any]) -> bytes:
    document = json.loads(infer_json("mlp", GOOD))
    return json.dumps(document | {"parameters": parameters}).encode()


@pytest.mark.parametrize(
    ("path", "body", "headers", "status", "message"),
    [
        ("/v2/models/mlp/infer", b"{not json", None, 400, "not valid JSON"),
        ("/v2/models/mlp/infer", b"[1, 2]", None, 400, "JSON object"),
        ("/v2/models/mlp/infer", b"[" * 100_000 + b"]" * 100_000, None, 400, "nests arrays or objects too deeply"),
        ("/v2/repository/index", b"[" * 100_000 + b"]" * 100_000, None, 400, "nests arrays or objects too deeply"),
        (
            "/v2/models/mlp/infer",
            infer_json("mlp", GOOD.astype(np.float64), datatype="FP64"),
            None,
            400,
            "datatype FP64 does not match the model's FP32",
        ),
        (
            "/v2/models/mlp/infer",
            infer_json("mlp", np.zeros((1, 783), np.float32)),
            None,
            400,
            "shape [1, 783] does not match the model's [-1, 784]",
        ),
        ("/v2/models/mlp/infer", infer_json("mlp", GOOD, name="pixels"), None, 400, "unknown input 'pixels'"),
        ("/v2/models/mlp/infer", b'{"inputs": []}', None, 400, "non-empty 'inputs'"),
        (
            "/v2/models/mlp/infer",
            infer_json("mlp", np.zeros((17, 784), np.float32)),
            None,
            400,
            "batch size 17 is outside 1..16",
        ),
        (
            "/v2/models/mlp/infer",
            b'{"inputs": [{"name": "image", "datatype": "FP32", "shape": [1, 784], "data": [1, 2]}]}',
            None,
            400,
            "2 values for shape [1, 784]",
        ),
        (
            "/v2/models/mlp/infer",
            json.dumps(
                {"inputs": [{"name": "image", "datatype": "FP32", "shape": [1, 784], "data": ["1"] * 784}]}
            ).encode(),
            None,
            400,
            "FP32 data must be fractional numbers, got strings",
        ),
        (
            "/v2/models/mlp/infer",
            json.dumps(
                {"inputs": [{"name": "image", "datatype": "FP32", "shape": [True, 784], "data": [0] * 784}]}
            ).encode(),
            None,
            400,
            "shape must be a list of non-negative integers",
        ),
        (
            "/v2/models/mlp/infer",
            _with_parameters({"priority": 2**70}),
            None,
            400,
            "parameter 'priority' cannot be passed to the model: can't serialize ints",
        ),
        (
            "/v2/models/mlp/infer",
            _with_parameters({"tags": ["a"]}),
            None,
            400,
            "parameter 'tags' must be a boolean, a number or a string, got list",
        ),
        (
            "/v2/models/mlp/infer",
            _with_parameters({"binary_data_output": 1}),
            None,
            400,
            "parameter 'binary_data_output' must be true or false, got 1",
        ),
        ("/v2/models/nope/infer", infer_json("nope", GOOD), None, 404, "unknown model 'nope'"),
        ("/v2/models/mlp/versions/9/infer", infer_json("mlp", GOOD), None, 404, "unknown version '9'"),
        ("/v2/models/broken/infer", infer_json("broken", GOOD), None, 503, "cannot load model"),
    ],
)
def test_bad_input_gets_a_clear_error(
    server: ServerHandle, path: str, body: bytes, headers: dict[str, str] | None, status: int, message: str
) -> None:
    code, document = http_post(server, path, body, headers)
    assert code == status
    assert message in document["error"]


def test_binary_data_shorter_than_declared(server: ServerHandle) -> None:
    header = (
        b'{"inputs": [{"name": "image", "datatype": "FP32", "shape": [1, 784], '
        b'"parameters": {"binary_data_size": 3136}}]}'
    )
    code, document = http_post(
        server, "/v2/models/mlp/infer", header + bytes(100), {"Inference-Header-Content-Length": str(len(header))}
    )
    assert code == 400 and "binary_data_size 3136 exceeds" in document["error"]


def test_missing_input_and_unknown_output(server: ServerHandle) -> None:
    body = json.dumps(
        {
            "inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [0, 0, 0, 0]}],
            "outputs": [{"name": "nope"}],
        }
    ).encode()
    code, document = http_post(server, "/v2/models/slow/infer", body)
    assert code == 400 and "unknown output 'nope'" in document["error"]
    code, document = http_post(
        server,
        "/v2/models/mlp/infer",
        json.dumps(
            {
                "inputs": [
                    {"name": "image", "datatype": "FP32", "shape": [1, 784], "data": [0.0] * 784},
                    {"name": "image", "datatype": "FP32", "shape": [1, 784], "data": [0.0] * 784},
                ]
            }
        ).encode(),
    )
    assert code == 400 and "given twice" in document["error"]


def test_payload_over_the_limit_is_refused(server: ServerHandle) -> None:
    """Refused on the declared length, before the body is read (so the test sends only the headers): over the
    server's limit, or over what the model asked for can take."""
    host, port = server.http_url.split(":")
    for path, limit, what in (
        ("/v2/repository/index", MAX_REQUEST_BYTES, "request body"),
        ("/v2/models/mlp/infer", 868_352, "request body for model 'mlp' (at most 16 rows of its inputs)"),
    ):
        connection = http.client.HTTPConnection(host, int(port), timeout=30)
        connection.putrequest("POST", path)
        connection.putheader("Content-Length", str(MAX_REQUEST_BYTES + 1))
        connection.endheaders()
        response = connection.getresponse()
        document = json.loads(response.read())
        connection.close()
        assert response.status == 413
        assert document["error"] == f"{what} of {MAX_REQUEST_BYTES + 1} bytes exceeds the limit of {limit} bytes"


def test_overload_is_refused_and_nothing_accepted_is_lost(server: ServerHandle) -> None:
    """The slow model queues at most 2 rows: a burst gets 503s, every accepted request is answered correctly."""

    def send(value: float) -> tuple[int, Any]:
        array = np.full((1, 4), value, dtype=np.float32)
        return http_post(server, "/v2/models/slow/infer", infer_json("slow", array, name="x"))

    values = [float(v) for v in range(24)]
    with ThreadPoolExecutor(12) as pool:
        answers = list(pool.map(send, values))
    refused = [doc for code, doc in answers if code == 503]
    accepted = [(value, doc) for value, (code, doc) in zip(values, answers, strict=True) if code == 200]
    assert refused and accepted and len(refused) + len(accepted) == len(values)
    assert all("max_queue_size 2" in doc["error"] for doc in refused)
    for value, doc in accepted:
        assert json.loads(doc)["outputs"][0]["data"] == [value] * 4


def test_a_model_error_fails_only_the_request_that_caused_it(server: ServerHandle) -> None:
    """Four requests land in one batch (fixed-timeout, 200 ms); the model raises on one; the others are answered."""
    values = [1.0, 2.0, -1.0, 3.0]

    def send(value: float) -> tuple[int, Any]:
        return http_post(server, "/v2/models/fussy/infer", infer_json("fussy", np.full((1, 4), value, np.float32), "x"))

    with ThreadPoolExecutor(4) as pool:
        answers = dict(zip(values, pool.map(send, values), strict=True))
    code, document = answers.pop(-1.0)
    assert code == 500 and "model 'fussy'" in document["error"] and "negative input" in document["error"]
    for value, (code, body) in answers.items():
        assert code == 200 and json.loads(body)["outputs"][0]["data"] == [2 * value] * 4
    with urllib.request.urlopen(f"http://{server.http_url}/v2/models/fussy/stats", timeout=10) as response:
        batches = json.loads(response.read())["model_stats"][0]["batch_stats"]
    assert any(entry["batch_size"] == 4 for entry in batches)  # they really shared a batch


def test_server_keeps_serving_after_errors(client: httpclient.InferenceServerClient) -> None:
    array = np.random.default_rng(2).random((2, 784), dtype=np.float32)
    np.testing.assert_allclose(
        client_infer(client, "mlp", array).as_numpy("logits"), reference_outputs("mlp", array), rtol=1e-5, atol=1e-5
    )


def test_config_statistics_and_index(client: httpclient.InferenceServerClient) -> None:
    config = client.get_model_config("mlp_fixed")
    assert config["max_batch_size"] == 16
    assert config["input"] == [{"name": "image", "data_type": "TYPE_FP32", "dims": [784]}]
    assert config["dynamic_batching"]["max_queue_delay_microseconds"] == 2000
    assert (config["dynamic_batching"]["priority_levels"], config["dynamic_batching"]["default_priority_level"]) == (
        2,
        2,
    )
    assert config["dynamic_batching"]["priority_queue_policy"]["1"] == {
        "timeout_action": "DELAY",
        "default_timeout_microseconds": 5_000_000,
        "allow_timeout_override": True,
        "max_queue_size": 32,
    }
    assert config["dynamic_batching"]["default_queue_policy"]["max_queue_size"] == 1024  # none of its own: the model's
    assert config["parameters"]["batching_policy"]["string_value"] == "fixed-timeout"
    parameters = client.get_model_config("mlp")["parameters"]
    # the server's CPUs less one for the frontend; the default workers the largest granularities, one per busy thread
    busy_threads = max(1, len(os.sched_getaffinity(0)) - 1)
    assert parameters["max_busy_threads"]["string_value"] == str(busy_threads)
    workers = sorted(w["batch"] for w in json.loads(parameters["workers"]["string_value"]))
    assert workers == [1, 1, 2, 4, 8, 16][-busy_threads:]
    assert parameters["idle_spin_us"]["string_value"] == ("5000" if len(os.sched_getaffinity(0)) > 1 else "0")
    assert parameters["max_busy_threads_saturated"]["string_value"] == "0"  # off
    assert parameters["share_cores"]["string_value"] == "true"  # a CPU model counts the server's other CPU models
    before = client.get_inference_statistics("mlp")["model_stats"][0]
    client_infer(client, "mlp", np.ones((4, 784), dtype=np.float32))
    after = client.get_inference_statistics("mlp")["model_stats"][0]
    assert after["inference_stats"]["success"]["count"] == before["inference_stats"]["success"]["count"] + 1
    assert after["inference_count"] == before["inference_count"] + 4
    index = {row["name"]: row for row in client.get_model_repository_index()}
    assert index["mlp"]["state"] == "READY"
    assert index["broken"]["state"] == "UNAVAILABLE" and "cannot load model" in index["broken"]["reason"]


def test_metrics_endpoint(server: ServerHandle, client: httpclient.InferenceServerClient) -> None:
    client_infer(client, "cnn", np.ones((2, 1, 28, 28), dtype=np.float32))
    with urllib.request.urlopen(f"http://{server.http_url}/metrics", timeout=10) as response:
        text = response.read().decode()
    for metric in (
        'adaserve_inference_request_success_total{model="cnn",version="1"}',
        'adaserve_executed_batches_total{model="cnn",size="2",version="1"}',
        'adaserve_queue_duration_seconds_bucket{le="0.001",model="cnn",version="1"}',
        'adaserve_compute_duration_seconds_count{model="cnn",version="1"}',
        'adaserve_inflight_rows{model="cnn",version="1"}',
        'adaserve_queue_delayed_requests_total{model="cnn",version="1"} 0.0',
        'adaserve_queued_rows_by_priority_level{level="2",model="mlp_fixed",version="1"} 0.0',
        'adaserve_gc_pause_seconds_count{generation="0"}',
    ):
        assert metric in text
    memory = {
        measure: float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        for measure in ("pss", "uss")
        if line.startswith(f'adaserve_model_process_memory_bytes{{measure="{measure}",model="cnn",version="1"}}')
    }
    assert 0 < memory["uss"] < memory["pss"]  # the host and workers share pages with each other and the zygote
    with pytest.raises(urllib.error.HTTPError) as alone:  # no cluster: no cluster-wide exposition to pass off
        urllib.request.urlopen(f"http://{server.http_url}/metrics/cluster", timeout=10)
    with alone.value as refused:
        assert refused.code == 404


def test_unload_and_load_through_the_repository_api(
    client: httpclient.InferenceServerClient, server: ServerHandle
) -> None:
    client.unload_model("mlp_torchscript")
    assert not client.is_model_ready("mlp_torchscript")
    assert _health(server, "/v2/models/mlp_torchscript/ready") == (503, {"name": "mlp_torchscript", "ready": False})
    with pytest.raises(Exception, match="not loaded"):
        client_infer(client, "mlp_torchscript", GOOD)
    client.unload_model("mlp_torchscript")  # Triton's rule: unloading a model that is not loaded succeeds
    with pytest.raises(InferenceServerException, match="unknown model 'no_such_model'") as raised:
        client.unload_model("no_such_model")
    assert raised.value.status() == "404"
    with pytest.raises(InferenceServerException, match="no model named 'no_such_model'") as raised:
        client.load_model("no_such_model")
    with pytest.raises(InferenceServerException, match="unknown model 'no_such_model'") as raised:
        client_infer(client, "no_such_model", GOOD)  # a failed load of a name the repository lacks leaves no state
    assert raised.value.status() == "404"
    client.load_model("mlp_torchscript")
    assert client.is_model_ready("mlp_torchscript")
    np.testing.assert_allclose(
        client_infer(client, "mlp_torchscript", GOOD).as_numpy("logits"),
        reference_outputs("mlp", GOOD),
        rtol=1e-5,
        atol=1e-5,
    )
    with pytest.raises(Exception, match="cannot load model"):
        client.load_model("broken")
    assert client.is_model_ready("mlp")


def test_a_load_that_sends_a_config_is_refused_not_ignored(client: httpclient.InferenceServerClient) -> None:
    with pytest.raises(Exception, match=r"parameters \['config'\] are not supported"):
        client.load_model("mlp", config=json.dumps({"max_batch_size": 4}))
    assert client.get_model_config("mlp")["max_batch_size"] == 16
    assert client.is_model_ready("mlp")


def test_random_garbage_never_breaks_the_server(server: ServerHandle, client: httpclient.InferenceServerClient) -> None:
    rng = random.Random(3)
    for _ in range(50):
        body = bytes(rng.getrandbits(8) for _ in range(rng.randint(0, 200)))
        code, _ = http_post(
            server, "/v2/models/mlp/infer", body, {"Inference-Header-Content-Length": str(rng.randint(-5, 250))}
        )
        assert code == 400
    assert client.is_server_ready()
