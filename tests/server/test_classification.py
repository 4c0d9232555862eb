"""Triton's classification extension: the top classes of an output, with the labels of its `label_filename`, as
tritonclient asks for them (`InferRequestedOutput(name, class_count=k)`) over HTTP (JSON and binary) and gRPC."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from adaserve.config import TensorSpec
from adaserve.datasets import FASHION_MNIST_CLASSES, load_fashion_mnist
from adaserve.errors import ConfigError, InvalidInputError
from adaserve.repository import ModelRepository
from adaserve.server.classification import check_classifiable, top_classes
from adaserve.server.protocol import class_count
from tests.server_utils import Clients, ServerHandle, link_example, running_server


def test_top_classes_are_highest_first_ties_by_index_in_tritons_format() -> None:
    scores = np.array([[0.5, 2.0, 2.0, -1.25], [3.0, 0.0, 1.0, 2.0]], dtype=np.float32)
    answer = top_classes(scores, 3, ("a", "b", "c"))
    assert answer.shape == (2, 3) and answer.dtype == object
    assert answer.tolist() == [
        [b"2.000000:1:b", b"2.000000:2:c", b"0.500000:0:a"],
        [b"3.000000:0:a", b"2.000000:3", b"1.000000:2:c"],  # class 3 has no label: none is added
    ]
    assert top_classes(scores, 10).shape == (2, 4)  # more than there are: all of them
    assert top_classes(scores[:, np.newaxis, :], 1).tolist() == [[b"2.000000:1"], [b"3.000000:0"]]


@pytest.mark.parametrize(("shape", "ok"), [((-1, 10), True), ((-1, 1, 10), True), ((-1, 4, 10), False)])
def test_only_an_output_with_one_dimension_of_classes_can_be_classified(shape: tuple[int, ...], ok: bool) -> None:
    spec = TensorSpec(name="y", datatype="FP32", shape=shape)
    if ok:
        check_classifiable(spec, "output 'y'")
    else:
        with pytest.raises(InvalidInputError, match=r"output 'y': classification needs one dimension of classes"):
            check_classifiable(spec, "output 'y'")


@pytest.mark.parametrize("value", [0, -2, True, "3", 2.5])
def test_a_class_count_that_is_not_a_whole_number_above_zero_is_refused(value: Any) -> None:
    with pytest.raises(InvalidInputError, match=r"output 'y': parameter 'classification' must be a whole number"):
        class_count("output 'y'", {"classification": value})
    assert class_count("output 'y'", {}) == 0


def test_labels_are_read_at_load_and_a_missing_file_or_an_input_label_is_a_config_error(tmp_path: Path) -> None:
    root = tmp_path / "models"
    link_example(root, "mlp")
    assert ModelRepository(root).read("mlp").labels == {"logits": FASHION_MNIST_CLASSES}
    outputs = [{"name": "logits", "datatype": "FP32", "shape": [-1, 10], "label_filename": "x.txt"}]
    link_example(root, "mlp", "lost", outputs=outputs)
    with pytest.raises(ConfigError, match=r"lost/config.yaml: output 'logits': label_filename x.txt: .*No such file"):
        ModelRepository(root).read("lost")
    inputs = [{"name": "image", "datatype": "FP32", "shape": [-1, 784], "label_filename": "labels.txt"}]
    link_example(root, "mlp", "odd", inputs=inputs)
    with pytest.raises(ConfigError, match="input 'image': label_filename belongs on an output"):
        ModelRepository(root).read("odd")


def test_a_label_file_linked_outside_the_repository_is_refused_and_one_linked_inside_is_read(tmp_path: Path) -> None:
    """Class names go back to clients: `labels.txt -> /etc/passwd` answered that file's lines as labels."""
    root = tmp_path / "models"
    link_example(root, "mlp", "leaky")
    (root / "leaky" / "labels.txt").unlink()
    (root / "leaky" / "labels.txt").symlink_to("/etc/passwd")
    with pytest.raises(ConfigError, match=r"label_filename labels.txt links to /etc/passwd, outside the model repo"):
        ModelRepository(root).read("leaky")
    link_example(root, "mlp", "shared")
    (root / "shared" / "labels.txt").unlink()
    (root / "shared" / "labels.txt").symlink_to("../leaky/config.yaml")  # inside the repository: fine
    assert ModelRepository(root).read("shared").labels["logits"][0] == "inputs:"


# -- a real server -----------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerHandle]:
    root = tmp_path_factory.mktemp("classification") / "models"
    link_example(root, "mlp")  # its logits are labelled with Fashion-MNIST's classes
    link_example(root, "mlp", "bare", outputs=[{"name": "logits", "datatype": "FP32", "shape": [-1, 10]}])
    link_example(root, "cnn")
    with running_server(root) as handle:
        yield handle


def images(rows: int) -> np.ndarray:
    return np.random.default_rng(rows).random((rows, 784), dtype=np.float32)


def client_for(clients: Clients, server: ServerHandle, protocol: str) -> tuple[Any, Any]:
    module: Any = grpcclient if protocol == "grpc" else httpclient
    return module, clients.of(server, "grpc" if protocol == "grpc" else "http")


def ask(
    clients: Clients, server: ServerHandle, protocol: str, x: np.ndarray, count: int, model: str = "mlp"
) -> np.ndarray:
    """The top `count` classes of each row, as tritonclient reads them (`protocol`: http, http-json or grpc)."""
    module, client = client_for(clients, server, protocol)
    tensor = module.InferInput("image", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x)
    binary = {} if protocol == "grpc" else {"binary_data": protocol == "http"}
    output = module.InferRequestedOutput("logits", class_count=count, **binary)
    result = client.infer(model, [tensor], outputs=[output])
    answer = result.as_numpy("logits")
    assert answer.dtype == object
    return answer


def text(item: bytes | str) -> str:
    """A class as tritonclient gives it: bytes from binary data and gRPC, a str from JSON (as from Triton)."""
    return item.decode() if isinstance(item, bytes) else item


def logits(clients: Clients, server: ServerHandle, x: np.ndarray, model: str = "mlp") -> np.ndarray:
    _, client = client_for(clients, server, "http")
    tensor = httpclient.InferInput("image", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x)
    return client.infer(model, [tensor]).as_numpy("logits")


@pytest.mark.parametrize("protocol", ["http", "http-json", "grpc"])
def test_each_row_gets_its_top_classes_with_their_labels(server: ServerHandle, protocol: str, clients: Clients) -> None:
    x = images(4)
    expected = logits(clients, server, x)
    answer = ask(clients, server, protocol, x, 3)
    assert answer.shape == (4, 3)
    for row, scores in zip(answer, expected, strict=True):
        parts = [text(item).split(":") for item in row]
        indices = [int(index) for _, index, _ in parts]
        assert indices == list(np.argsort(-scores, kind="stable")[:3])
        assert [label for _, _, label in parts] == [FASHION_MNIST_CLASSES[i] for i in indices]
        np.testing.assert_allclose([float(value) for value, _, _ in parts], scores[indices], atol=1e-6)


def test_without_labels_a_class_is_its_value_and_index(server: ServerHandle, clients: Clients) -> None:
    x = images(1)
    (row,) = ask(clients, server, "grpc", x, 2, model="bare")
    assert [text(item).count(":") for item in row] == [1, 1]
    assert int(text(row[0]).split(":")[1]) == int(np.argmax(logits(clients, server, x, model="bare")))


def test_the_extension_is_announced_and_the_label_file_shown(server: ServerHandle, clients: Clients) -> None:
    _, client = client_for(clients, server, "http")
    assert "classification" in client.get_server_metadata()["extensions"]
    assert client.get_model_config("mlp")["output"][0]["label_filename"] == "labels.txt"
    grpc_config = clients.grpc(server.grpc_url).get_model_config("mlp").config
    assert grpc_config.output[0].label_filename == "labels.txt"


@pytest.mark.parametrize(
    ("parameters", "message"),
    [
        ({"classification": 0}, "output 'logits': parameter 'classification' must be a whole number above 0, got 0"),
        (
            {"classification": 2, "shared_memory_region": "r", "shared_memory_byte_size": 64},
            "output 'logits': classification results are strings; ask for them in the response, not in shared memory",
        ),
    ],
)
def test_a_bad_classification_request_is_a_400_naming_it(
    server: ServerHandle, parameters: dict[str, Any], message: str
) -> None:
    body = {
        "inputs": [{"name": "image", "datatype": "FP32", "shape": [1, 784], "data": [0.5] * 784}],
        "outputs": [{"name": "logits", "parameters": parameters}],
    }
    request = urllib.request.Request(f"http://{server.http_url}/v2/models/mlp/infer", json.dumps(body).encode())
    with pytest.raises(urllib.error.HTTPError) as raised:
        urllib.request.urlopen(request, timeout=10)
    assert raised.value.code == 400
    assert json.loads(raised.value.read())["error"] == message


def test_grpc_refuses_a_bad_count_by_name(server: ServerHandle, clients: Clients) -> None:
    with pytest.raises(InferenceServerException, match="parameter 'classification' must be a whole number above 0"):
        ask(clients, server, "grpc", images(1), -1)


def test_a_cnn_classifies_real_images(server: ServerHandle, clients: Clients) -> None:
    pictures, labels = load_fashion_mnist("test")
    module, client = client_for(clients, server, "http")
    tensor = module.InferInput("image", [16, 1, 28, 28], "FP32")
    tensor.set_data_from_numpy(pictures[:16])
    result = client.infer("cnn", [tensor], outputs=[module.InferRequestedOutput("logits", class_count=1)])
    named = [text(item).split(":")[2] for item in result.as_numpy("logits")[:, 0]]
    correct = sum(name == FASHION_MNIST_CLASSES[label] for name, label in zip(named, labels[:16], strict=True))
    assert correct >= 12  # the example CNN reaches 90.6% on the test split
