"""Triton's version_policy: several versions of one model served at once, each addressed by its number, through
tritonclient over REST and gRPC."""

from __future__ import annotations

import urllib.request
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.engine.test_poller import ONE_WORKER, add_identity_version
from tests.server.test_poll import wait_for
from tests.server_utils import Clients, running_server, write_fussy_model


def infer(client: httpclient.InferenceServerClient, model: str, version: str = "") -> tuple[float, str]:
    """The first output for a row of 3s (version 1 doubles it, version 2 returns it), and the version that answered."""
    tensor = httpclient.InferInput("x", [1, 4], "FP32")
    tensor.set_data_from_numpy(np.full((1, 4), 3.0, dtype=np.float32))
    result = client.infer(model, [tensor], model_version=version)
    return float(result.as_numpy("y")[0, 0]), result.get_response()["model_version"]


def test_every_version_a_policy_serves_answers_by_number_and_the_newest_by_default(
    tmp_path: Path, clients: Clients
) -> None:
    repository = tmp_path / "models"
    repository.mkdir()
    both = write_fussy_model(repository, "both", workers=ONE_WORKER, version_policy={"all": True})
    newest = write_fussy_model(repository, "newest", workers=ONE_WORKER)  # the default: the newest alone
    for directory in (both, newest):
        add_identity_version(directory, 2)
    with running_server(repository, "--repository-poll-secs", "0.2") as server:
        client = clients.http(server.http_url)
        assert infer(client, "both") == (3.0, "2")
        assert infer(client, "both", "1") == (6.0, "1")
        assert infer(client, "both", "2") == (3.0, "2")
        assert client.get_model_metadata("both")["versions"] == ["1", "2"]
        index = {(row["name"], row.get("version")) for row in client.get_model_repository_index()}
        assert {("both", "1"), ("both", "2"), ("newest", "2")} <= index
        assert len(client.get_inference_statistics("both")["model_stats"]) == 2
        (stats,) = client.get_inference_statistics("both", "1")["model_stats"]
        assert (stats["version"], stats["inference_count"]) == ("1", 1)
        with urllib.request.urlopen(f"http://{server.http_url}/metrics", timeout=10) as response:
            text = response.read().decode()
        for version in ("1", "2"):
            assert f'adaserve_inference_request_success_total{{model="both",version="{version}"}}' in text

        with pytest.raises(InferenceServerException, match=r"version 1 is not loaded \(serving versions \[2\]") as e:
            infer(client, "newest", "1")
        assert e.value.status() == "503"
        with pytest.raises(InferenceServerException, match="unknown version '7' of model 'both'") as e:
            infer(client, "both", "7")
        assert e.value.status() == "404"

        grpc = clients.grpc(server.grpc_url)
        assert grpc.get_model_config("both").config.version_policy.HasField("all")
        assert grpc.get_model_config("newest").config.version_policy.latest.num_versions == 1

        add_identity_version(both, 3)  # the poller loads it beside the others
        wait_for(lambda: client.get_model_metadata("both")["versions"] == ["1", "2", "3"])
        assert infer(client, "both") == (3.0, "3") and infer(client, "both", "1") == (6.0, "1")
        assert client.get_model_config("both")["version_policy"] == {"all": {}}
