"""The gRPC frontend against a real server, with `tritonclient.grpc` and with stubs built from the V2 spec."""

from __future__ import annotations

import asyncio
import json
import os
import queue
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as aiogrpcclient
from tritonclient.grpc import model_config_pb2, service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from tests.conftest import MAX_REQUEST_BYTES
from tests.server.reference import MODEL_INPUT_SHAPES, reference_outputs
from tests.server_utils import Clients, ServerHandle, logged_errors

PROTO = Path(__file__).parent / "protos" / "v2_client.proto"


@pytest.fixture(scope="module")
def client(server: ServerHandle) -> Iterator[grpcclient.InferenceServerClient]:
    with grpcclient.InferenceServerClient(server.grpc_url) as opened:
        yield opened


def infer(
    client: grpcclient.InferenceServerClient, model: str, array: np.ndarray, name: str = "image", **kwargs: object
) -> grpcclient.InferResult:
    tensor = grpcclient.InferInput(name, list(array.shape), "FP32")
    tensor.set_data_from_numpy(array)
    return client.infer(model, [tensor], **kwargs)


def test_health_metadata_config_statistics_index(client: grpcclient.InferenceServerClient) -> None:
    assert client.is_server_live() and client.is_server_ready() and client.is_model_ready("cnn")
    assert not client.is_model_ready("broken")
    assert "model_repository" in client.get_server_metadata().extensions
    metadata = client.get_model_metadata("mlp")
    assert (metadata.inputs[0].name, metadata.inputs[0].datatype, list(metadata.inputs[0].shape)) == (
        "image",
        "FP32",
        [-1, 784],
    )
    config = client.get_model_config("mlp_fixed").config
    assert config.max_batch_size == 16 and config.dynamic_batching.max_queue_delay_microseconds == 2000
    level_1 = config.dynamic_batching.priority_queue_policy[1]
    delay = model_config_pb2.ModelQueuePolicy.DELAY
    assert (level_1.timeout_action, level_1.default_timeout_microseconds, level_1.max_queue_size) == (
        delay,
        5_000_000,
        32,
    )
    assert config.parameters["batching_policy"].string_value == "fixed-timeout"
    infer(client, "mlp", np.ones((3, 784), dtype=np.float32))
    stats = client.get_inference_statistics("mlp").model_stats[0]
    assert stats.inference_count >= 3 and stats.inference_stats.success.count >= 1
    index = {m.name: m for m in client.get_model_repository_index().models}
    assert index["mlp"].state == "READY" and index["broken"].state == "UNAVAILABLE"


@pytest.mark.parametrize("model", ["mlp", "cnn", "mlp_torchscript"])
def test_outputs_equal_torch(client: grpcclient.InferenceServerClient, model: str) -> None:
    array = np.random.default_rng(4).random((5, *MODEL_INPUT_SHAPES[model]), dtype=np.float32)
    result = infer(
        client,
        model,
        array,
        request_id="g-1",
        parameters={"latency_ms": 3, "accuracy": 0.99, "early_exit": True, "mode": "x"},
    )
    np.testing.assert_allclose(result.as_numpy("logits"), reference_outputs(model, array), rtol=1e-5, atol=1e-5)
    assert result.get_response().id == "g-1"


@pytest.mark.parametrize(
    ("model", "shape", "code", "message"),
    [
        ("nope", (1, 784), "StatusCode.NOT_FOUND", "unknown model 'nope'"),
        ("mlp", (1, 783), "StatusCode.INVALID_ARGUMENT", "shape [1, 783] does not match the model's [-1, 784]"),
        ("mlp", (17, 784), "StatusCode.INVALID_ARGUMENT", "batch size 17 is outside 1..16"),
        ("mlp", (MAX_REQUEST_BYTES // 3136 + 1, 784), "StatusCode.RESOURCE_EXHAUSTED", "larger than max"),
        ("broken", (1, 784), "StatusCode.UNAVAILABLE", "cannot load model"),
    ],
)
def test_bad_input_gets_a_clear_status(
    client: grpcclient.InferenceServerClient, model: str, shape: tuple[int, int], code: str, message: str
) -> None:
    with pytest.raises(InferenceServerException) as caught:
        infer(client, model, np.zeros(shape, dtype=np.float32))
    assert caught.value.status() == code
    assert message in caught.value.message()
    assert client.is_server_ready()


def test_a_parameter_without_a_value_is_named(server: ServerHandle) -> None:
    request = service_pb2.ModelInferRequest(model_name="mlp")
    request.inputs.add(name="image", datatype="FP32", shape=[1, 784])
    request.raw_input_contents.append(np.zeros((1, 784), np.float32).tobytes())
    request.parameters["priority"].SetInParent()  # present, but none of its values set
    with grpc.insecure_channel(server.grpc_url) as channel, pytest.raises(grpc.RpcError) as caught:
        service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request, timeout=30)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "parameter 'priority' has no value" in (caught.value.details() or "")


def test_wrong_datatype(client: grpcclient.InferenceServerClient) -> None:
    tensor = grpcclient.InferInput("image", [1, 784], "FP64")
    tensor.set_data_from_numpy(np.zeros((1, 784), dtype=np.float64))
    with pytest.raises(InferenceServerException, match="datatype FP64 does not match the model's FP32"):
        client.infer("mlp", [tensor])


@pytest.fixture(scope="module")
def v2_stubs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Stubs compiled from the spec-derived proto (imported in a subprocess: tritonclient holds `inference.*`)."""
    from grpc_tools import protoc

    out = tmp_path_factory.mktemp("v2_stubs")
    assert (
        protoc.main(["protoc", f"-I{PROTO.parent}", f"--python_out={out}", f"--grpc_python_out={out}", PROTO.name]) == 0
    )
    return out


V2_CLIENT = """
import json, sys
import grpc, numpy as np
import v2_client_pb2 as messages, v2_client_pb2_grpc as services
url, typed = sys.argv[1], sys.argv[2] == "typed"
array = np.load(sys.argv[3])
with grpc.insecure_channel(url) as channel:
    stub = services.GRPCInferenceServiceStub(channel)
    live = stub.ServerLive(messages.ServerLiveRequest()).live
    name = stub.ServerMetadata(messages.ServerMetadataRequest()).name
    request = messages.ModelInferRequest(model_name="mlp", id="v2")
    tensor = request.inputs.add(name="image", datatype="FP32", shape=list(array.shape))
    if typed:
        tensor.contents.fp32_contents.extend(array.ravel().tolist())
    else:
        request.raw_input_contents.append(array.tobytes())
    request.parameters["latency_ms"].int64_param = 4
    response = stub.ModelInfer(request)
logits = np.frombuffer(response.raw_output_contents[0], dtype=np.float32)
print(json.dumps({"live": live, "name": name, "id": response.id, "output": response.outputs[0].name,
                  "shape": list(response.outputs[0].shape), "logits": logits.tolist()}))
"""


@pytest.mark.parametrize("contents", ["raw", "typed"])
def test_a_client_built_from_the_v2_spec(server: ServerHandle, v2_stubs: Path, contents: str, tmp_path: Path) -> None:
    array = np.random.default_rng(5).random((2, 784), dtype=np.float32)
    np.save(tmp_path / "x.npy", array)
    run = subprocess.run(
        [sys.executable, "-c", V2_CLIENT, server.grpc_url, contents, str(tmp_path / "x.npy")],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(v2_stubs)},
    )
    assert run.returncode == 0, run.stderr
    answer = json.loads(run.stdout)
    assert answer["live"] and answer["name"] == "adaserve" and answer["id"] == "v2"
    assert answer["output"] == "logits" and answer["shape"] == [2, 10]
    logits = np.array(answer["logits"], dtype=np.float32).reshape(2, 10)
    np.testing.assert_allclose(logits, reference_outputs("mlp", array), rtol=1e-5, atol=1e-5)


def test_a_load_that_sends_a_config_is_refused_not_ignored(client: grpcclient.InferenceServerClient) -> None:
    with pytest.raises(InferenceServerException, match=r"parameters \['config'\] are not supported") as raised:
        client.load_model("mlp", config=json.dumps({"max_batch_size": 4}))
    assert raised.value.status() == "StatusCode.INVALID_ARGUMENT"
    client.unload_model("mlp_torchscript")  # sends unload_dependents, which is accepted
    assert not client.is_model_ready("mlp_torchscript")
    client.unload_model("mlp_torchscript")  # Triton's rule: unloading a model that is not loaded succeeds
    with pytest.raises(InferenceServerException, match="unknown model 'no_such_model'") as raised:
        client.unload_model("no_such_model")
    assert raised.value.status() == "StatusCode.NOT_FOUND"
    client.load_model("mlp_torchscript")
    assert client.is_model_ready("mlp_torchscript") and client.is_model_ready("mlp")


def test_a_stream_answers_every_request_by_id_and_goes_on_after_an_error(
    server: ServerHandle, clients: Clients
) -> None:
    """Triton's ModelStreamInfer through tritonclient's stream API: requests of two models and mixed batch sizes,
    one of them bad, on one stream; each is answered once, matched by id, the bad one with its error."""
    answers: queue.Queue[tuple[grpcclient.InferResult | None, InferenceServerException | None]] = queue.Queue()
    client = clients.grpc(server.grpc_url)
    images = np.random.default_rng(5).random((24, 784), dtype=np.float32)
    sent: dict[str, tuple[str, np.ndarray]] = {}
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        for i, rows in enumerate([1, 3, 8, 2, 16, 1, 5]):
            model = "mlp" if i % 2 else "mlp_torchscript"
            batch = images[i : i + rows]
            tensor = grpcclient.InferInput("image", list(batch.shape), "FP32")
            tensor.set_data_from_numpy(batch)
            client.async_stream_infer(model, [tensor], request_id=f"r{i}")
            sent[f"r{i}"] = (model, batch)
        wrong = grpcclient.InferInput("image", [1, 783], "FP32")
        wrong.set_data_from_numpy(images[:1, :783])
        client.async_stream_infer("mlp", [wrong], request_id="bad")
        results = [answers.get(timeout=60) for _ in range(len(sent) + 1)]
    finally:
        client.stop_stream()
    errors = [error for result, error in results if error is not None]
    assert len(errors) == 1 and "input 'image': shape [1, 783] does not match the model's [-1, 784]" in str(errors[0])
    answered = {result.get_response().id: result for result, _ in results if result is not None}
    assert sorted(answered) == sorted(sent)
    for request_id, (model, batch) in sent.items():
        np.testing.assert_allclose(
            answered[request_id].as_numpy("logits"), reference_outputs(model, batch), rtol=1e-4, atol=1e-5
        )
    assert client.is_server_ready()


def test_a_stream_cancelled_with_requests_in_flight_leaves_the_server_serving(
    server: ServerHandle, clients: Clients
) -> None:
    """tritonclient's `stop_stream(cancel_requests=True)` while the slow model still computes: the server takes
    back what has not started, logs no error, and the next stream is answered."""
    errors_before = logged_errors(server)
    client = clients.grpc(server.grpc_url)
    client.start_stream(callback=lambda result, error: None)
    for i in range(2):
        tensor = grpcclient.InferInput("x", [1, 4], "FP32")
        tensor.set_data_from_numpy(np.ones((1, 4), dtype=np.float32))
        client.async_stream_infer("slow", [tensor], request_id=f"s{i}")
    client.stop_stream(cancel_requests=True)

    answers: queue.Queue[tuple[grpcclient.InferResult | None, InferenceServerException | None]] = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        tensor = grpcclient.InferInput("image", [1, 784], "FP32")
        tensor.set_data_from_numpy(np.zeros((1, 784), dtype=np.float32))
        client.async_stream_infer("mlp", [tensor], request_id="after")
        result, error = answers.get(timeout=60)
    finally:
        client.stop_stream()
    assert error is None and result is not None and result.get_response().id == "after"
    assert logged_errors(server) == errors_before


def test_tritonclient_grpc_asyncio_client(server: ServerHandle) -> None:
    """tritonclient.grpc.aio: a unary call, compressed, and a stream of requests, each answered under its id."""
    array = np.random.default_rng(7).random((2, 784), dtype=np.float32)
    tensor = grpcclient.InferInput("image", list(array.shape), "FP32")
    tensor.set_data_from_numpy(array)

    async def run() -> list[tuple[str, np.ndarray]]:
        async with aiogrpcclient.InferenceServerClient(server.grpc_url) as client:
            assert await client.is_server_ready() and await client.is_model_ready("mlp")
            unary = await client.infer("mlp", [tensor], compression_algorithm="gzip")
            answers = [("unary", unary.as_numpy("logits"))]

            async def requests() -> Any:
                for i in range(3):
                    yield {"model_name": "mlp", "inputs": [tensor], "request_id": str(i)}

            async for result, error in client.stream_infer(requests()):
                assert error is None, error
                answers.append((result.get_response().id, result.as_numpy("logits")))
                if len(answers) == 4:
                    break
            return answers

    answers = asyncio.run(run())
    assert sorted(name for name, _ in answers) == ["0", "1", "2", "unary"]
    for _, logits in answers:
        np.testing.assert_allclose(logits, reference_outputs("mlp", array), rtol=1e-5, atol=1e-5)
