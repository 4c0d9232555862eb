"""Triton's own C++ client against the server: perf_analyzer (from the tritonclient 2.48.0 wheel, in its own venv,
`benchmarks/perf_analyzer_env.sh`) with tensors in system shared memory over HTTP and gRPC, and over a gRPC stream.
Its C++ clients parse responses more strictly than tritonclient's Python ones: its HTTP client refused an output in
shared memory answered with `parameters`, which the Python client accepted."""

from __future__ import annotations

import subprocess

import pytest

from benchmarks.perf_load import PerfAnalyzer
from tests.server_utils import ServerHandle, logged_errors


@pytest.mark.parametrize(
    ("protocol", "mode"),
    [("http", "--shared-memory=system"), ("grpc", "--shared-memory=system"), ("grpc", "--streaming")],
)
def test_perf_analyzer_runs_against_the_server(
    server: ServerHandle, perf_analyzer: PerfAnalyzer, protocol: str, mode: str
) -> None:
    errors_before = logged_errors(server)
    url = server.http_url if protocol == "http" else server.grpc_url
    arguments = ["-m", "mlp", "-u", url, "-i", protocol, mode, "--concurrency-range", "2", "-b", "1"]
    arguments += ["--measurement-mode", "count_windows", "--measurement-request-count", "200", "-s", "1000"]
    done = subprocess.run(
        [str(perf_analyzer.binary), *arguments], env=perf_analyzer.env, capture_output=True, text=True, timeout=120
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-2000:]
    assert "Throughput:" in output and "error" not in output.lower(), output[-2000:]
    assert logged_errors(server) == errors_before
