"""KServe's own Python clients (0.14, in a venv of their own) against the server, unmodified: REST in the Open
Inference Protocol (JSON and binary tensors) and in KServe's V1 protocol, and gRPC. KServe's REST client reads the
health answers' JSON bodies (`{"live": true}`, `{"ready": true}`, `{"name": ..., "ready": true}`, V1's
`{"status": "alive"}` at the root), which a server that answers health with the status alone, as Triton does,
fails."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

from adaserve.datasets import load_fashion_mnist
from tests.server.reference import reference_outputs
from tests.server_utils import ROOT, ServerHandle, logged_errors

CHECK = Path(__file__).with_name("kserve_client_check.py")


@pytest.fixture(scope="session")
def kserve_python() -> Path:
    """The Python of KServe's client venv, set up (once); in CI a set-up that fails is a failure, elsewhere a skip."""
    done = subprocess.run(
        ["bash", str(ROOT / "benchmarks" / "foreign_env.sh"), "kserve-client"],
        capture_output=True,
        text=True,
        timeout=900,
    )
    if done.returncode != 0:
        reason = f"KServe's client could not be set up: {done.stderr.strip()[-500:]}"
        if os.environ.get("CI"):
            pytest.fail(reason)
        pytest.skip(reason)
    return Path(done.stdout.strip().splitlines()[-1])


def test_kserves_clients_work_unmodified(server: ServerHandle, kserve_python: Path, tmp_path: Path) -> None:
    rows = load_fashion_mnist("test")[0][:3].reshape(3, 784)
    np.save(tmp_path / "rows.npy", rows)
    errors_before = logged_errors(server)
    done = subprocess.run(
        [str(kserve_python), str(CHECK), server.http_url, server.grpc_url, "mlp", str(tmp_path / "rows.npy")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    for check in ("rest_v2_live", "rest_v2_ready", "rest_v2_model_ready", "rest_v1_live", "rest_v1_model_ready"):
        assert found[check] is True, check
    for check in ("grpc_live", "grpc_ready", "grpc_model_ready"):
        assert found[check] is True, check
    assert (found["rest_v2_id"], found["grpc_id"]) == ("rest", "grpc")
    expected = reference_outputs("mlp", rows)
    for answer in ("rest_v2", "rest_v2_binary", "rest_v1", "grpc"):
        np.testing.assert_allclose(np.array(found[answer]), expected, rtol=1e-5, atol=1e-5, err_msg=answer)
    assert logged_errors(server) == errors_before
