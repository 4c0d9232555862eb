"""The mCache server benchmark at its smallest (three small models, 24 requests, one cell), to check that it runs end
to end and what it records: the seed's probe (each model loaded three times here, the median of the later loads'
times its penalty), a cell on a fresh server beside the simulator's replay of the same sequence, and the plot. Its
figures are the benchmark's, not this test's."""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest

from benchmarks.mcache import server
from tests.bench.factories import positive, recorded, run_benchmark

SMALL = ("fashion_cnn", "mlp_small", "mlp_large")


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_server_benchmark_probes_each_model_and_replays_a_cell_beside_the_simulator(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(server, "MODELS", SMALL)
    monkeypatch.setattr(server, "PROBE_LOADS", 2)
    output = tmp_path / "mcache_server.json"
    run_benchmark(monkeypatch, tmp_path, server, "--quick", "--cells", "iam@40", "--output", str(output))
    report = recorded(output, "benchmarks.mcache.server")
    (probed,) = report["probes"].values()  # one seed, one probe
    assert set(probed["models"]) == set(SMALL)
    assert all(
        positive(*(m[key] for key in ("size_bytes", "load_s", "first_load_s", "exec_s")))
        for m in probed["models"].values()
    )
    assert report["total_bytes"] == sum(m["size_bytes"] for m in probed["models"].values())
    for model in probed["models"].values():
        assert len(model["load_samples_s"]) == 2 and len(model["exec_samples_s"]) == 2
        assert model["load_s"] == statistics.median(model["load_samples_s"])
        assert model["exec_s"] == statistics.median(model["exec_samples_s"])
    assert [len(requests) for requests in report["sequences"].values()] == [24]
    (cell,) = report["cells"]
    assert (cell["policy"], cell["share"], cell["seed"]) == ("iam", 0.4, 0)
    assert cell["server"]["requests"] == 24 and cell["server"]["failed"] == 0 and report["failed_requests"] == 0
    assert cell["server"]["hits"] + cell["server"]["misses"] == 24  # the warm-up load before the replay not counted
    assert positive(cell["server"]["throughput_rps"], cell["simulator"]["throughput_rps"])
    assert report["bars"] == {"server": [], "simulator": [], "server against the simulator": []}  # no rival ran
