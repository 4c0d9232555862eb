"""What a plain `pip install .` brings is enough to serve: the server runs and answers with neither tritonclient
nor transformers importable (they come with the `client`, `zoo` and `test` extras)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import grpc
import httpx
import numpy as np

from adaserve.server.protos import grpc_service_pb2, grpc_service_pb2_grpc
from tests.server_utils import EXAMPLES, link_example, running_server, without_packages

CLIENT_PACKAGES = ("tritonclient", "transformers")


def test_the_server_needs_no_client_library_nor_transformers(tmp_path: Path) -> None:
    repository = tmp_path / "models"
    for name in ("mlp", "cnn", "mlp_torchscript"):
        link_example(repository, name)
    env = without_packages(tmp_path / "blocked", *CLIENT_PACKAGES)
    image = np.random.default_rng(0).random(784, dtype=np.float32)
    with running_server(repository, env=env) as server:
        body = {"inputs": [{"name": "image", "datatype": "FP32", "shape": [1, 784], "data": image.tolist()}]}
        answer = httpx.post(f"http://{server.http_url}/v2/models/mlp/infer", json=body, timeout=30)
        assert answer.status_code == 200, answer.text
        logits = np.array(answer.json()["outputs"][0]["data"], np.float32)
        request = grpc_service_pb2.ModelInferRequest(model_name="mlp_torchscript")
        request.inputs.add(name="image", datatype="FP32", shape=[1, 784])
        request.raw_input_contents.append(image.tobytes())
        with grpc.insecure_channel(server.grpc_url) as channel:
            response = grpc_service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request, timeout=30)
        np.testing.assert_allclose(np.frombuffer(response.raw_output_contents[0], np.float32), logits, rtol=1e-5)
    assert "blocked by the test" not in server.log.read_text()


def test_the_command_line_starts_without_them(tmp_path: Path) -> None:
    """`adaserve --help` and `models list` import every subcommand's module."""
    env = without_packages(tmp_path / "blocked", *CLIENT_PACKAGES)
    for args in (["--help"], ["models", "list", "--model-repository", str(EXAMPLES)]):
        done = subprocess.run([sys.executable, "-m", "adaserve", *args], capture_output=True, text=True, env=env)
        assert done.returncode == 0, done.stderr
