"""The gRPC server loops benchmark at its smallest, to check that it runs and what it records (its figures are the
benchmark's, not this test's); and that each loop of the canned gRPC floor answers tritonclient."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from benchmarks.grpc_floor import LOOPS
from benchmarks.grpc_loops import CONCURRENCIES, RATIOS, SERVERS
from benchmarks.perf_load import PerfAnalyzer
from benchmarks.serving_overhead import floor_server
from tests.server_utils import ROOT


@pytest.mark.parametrize("loop", LOOPS)
def test_each_loop_of_the_grpc_floor_answers_a_triton_client(loop: str) -> None:
    with floor_server("grpc", loop=loop) as floor:
        client = grpcclient.InferenceServerClient(floor.grpc_url)
        try:
            tensor = grpcclient.InferInput("image", [1, 784], "FP32")
            tensor.set_data_from_numpy(np.ones((1, 784), dtype=np.float32))
            answer = client.infer("mlp", [tensor]).as_numpy("logits")
            assert answer.shape == (1, 10) and not answer.any()
            assert client.get_model_metadata("mlp").inputs[0].name == "image"
        finally:
            client.close()


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_grpc_loops_benchmark_runs_every_server_at_every_concurrency(
    tmp_path: Path, perf_analyzer: PerfAnalyzer
) -> None:
    output = tmp_path / "grpc_loops.json"
    command = [sys.executable, "-m", "benchmarks.grpc_loops", "--quick", "--request-count", "200"]
    command += ["--output", str(output), "--perf-venv", str(perf_analyzer.binary.parent.parent)]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=540)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(output.read_text())
    assert len(report["runs"]) == len(SERVERS) * len(CONCURRENCIES)
    assert set(report["cases"]) == {f"{name}_c{c}" for name, _, _ in SERVERS for c in CONCURRENCIES}
    answered = [case for case in report["cases"].values() if case["throughput_rps"]]
    assert len(answered) >= len(report["cases"]) - 2
    assert all(case["cpu_us_per_call"] > 0 for case in answered)
    assert all(set(ratio) == set(RATIOS) for ratio in report["over_aio"].values())
    assert output.with_suffix(".png").exists() and "| grpc_threads | 8 |" in done.stdout
