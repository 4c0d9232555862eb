"""The spare-hosts benchmark at its smallest (one model, one round, a short pause), to check that it runs end to end
and what it records: every load on both servers, in both modes, summarized and plotted. Its figures are the
benchmark's, not this test's."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.mcache import spare_hosts
from tests.bench.factories import positive, recorded, run_benchmark


@pytest.mark.slow
def test_spare_hosts_loads_every_model_on_both_servers_in_both_modes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(spare_hosts, "SETTLE_S", 0.0)  # the first load may wait for the spare: no figure is judged
    output = tmp_path / "spare_hosts.json"
    args = ["--models", "mlp_small", "--rounds", "1", "--gap-s", "0.1", "--output", str(output)]
    run_benchmark(monkeypatch, tmp_path, spare_hosts, *args)
    report = recorded(output, "benchmarks.mcache.spare_hosts")
    assert report["settings"]["models"] == ["mlp_small"]
    loads = report["loads"]
    assert sorted((load["mode"], load["spare_hosts"]) for load in loads) == [
        ("back_to_back", 0),
        ("back_to_back", 1),
        ("paced", 0),
        ("paced", 1),
    ]
    assert all(load["model"] == "mlp_small" and positive(load["client_s"], load["server_s"]) for load in loads)
    for mode in ("paced", "back_to_back"):
        summary = report["summary"][mode]
        assert set(summary["per_model_mean_s"]) == {"mlp_small"}
        assert positive(*summary["mean_load_s"].values())
    assert set(report["server_cpu_s"]) == {"0", "1"}


def test_an_unknown_model_is_refused_before_any_server_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        run_benchmark(monkeypatch, tmp_path, spare_hosts, "--models", "nope", "--output", str(tmp_path / "x.json"))
    assert "unknown model(s) ['nope']" in capsys.readouterr().err
