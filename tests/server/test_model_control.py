"""Triton's model control modes: explicit lets the repository API load and unload; poll and none refuse it with
Triton's words, over REST and gRPC, and keep serving."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.server_utils import Clients, running_server, write_fussy_model
from tests.test_cli import adaserve

ONE_WORKER = [{"batch": 4, "threads": 1}]


@pytest.mark.parametrize(
    ("arguments", "reason"),
    [
        (("--model-control-mode", "none"), "in model control mode none"),
        (("--repository-poll-secs", "0.2"), "if polling is enabled"),  # poll mode, implied
        (("--model-control-mode", "poll"), "if polling is enabled"),
    ],
)
def test_none_and_poll_refuse_the_repository_api_and_keep_serving(
    tmp_path: Path, arguments: tuple[str, ...], reason: str, clients: Clients
) -> None:
    write_fussy_model(tmp_path, workers=ONE_WORKER)
    with running_server(tmp_path, *arguments) as server:
        client = clients.http(server.http_url)
        for call in (client.load_model, client.unload_model):
            with pytest.raises(
                InferenceServerException, match=f"explicit model load / unload is not allowed {reason}"
            ) as e:
                call("fussy")
            assert e.value.status() == "503"
        grpc = clients.grpc(server.grpc_url)
        with pytest.raises(InferenceServerException, match="explicit model load / unload is not allowed") as error:
            grpc.unload_model("fussy")
        assert error.value.status() == "StatusCode.UNAVAILABLE"
        tensor = httpclient.InferInput("x", [1, 4], "FP32")
        tensor.set_data_from_numpy(np.ones((1, 4), np.float32))
        assert client.infer("fussy", [tensor]).as_numpy("y").tolist() == [[2.0] * 4]


def test_explicit_mode_lets_the_api_load_and_unload(tmp_path: Path, clients: Clients) -> None:
    write_fussy_model(tmp_path, workers=ONE_WORKER)
    with running_server(tmp_path, "--model-control-mode", "explicit") as server:
        client = clients.http(server.http_url)
        client.unload_model("fussy")
        assert not client.is_model_ready("fussy")
        client.load_model("fussy")
        assert client.is_model_ready("fussy")


def test_polling_outside_poll_mode_is_refused_at_start(tmp_path: Path) -> None:
    run = adaserve(
        "serve", "--model-repository", str(tmp_path), "--model-control-mode", "none", "--repository-poll-secs", "1"
    )
    assert run.returncode == 2
    assert (
        "--repository-poll-secs follows the repository on disk: it needs --model-control-mode poll, not none"
        in run.stderr
    )
