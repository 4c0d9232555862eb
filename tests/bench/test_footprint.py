"""The footprint benchmark at its smallest: one server of one model, its process tree read by role."""

from __future__ import annotations

from pathlib import Path

from benchmarks.footprint import measure_start
from tests.server_utils import link_example


def test_a_start_is_measured_with_every_process_in_its_role(tmp_path: Path) -> None:
    link_example(tmp_path / "models", "mlp", workers=[{"batch": 1, "threads": 1}, {"batch": 4, "threads": 1}])
    run = measure_start(tmp_path / "models")
    counts = {role: entry["count"] for role, entry in run["by_role"].items()}
    # the hosts are forked by the one zygote; the set is pinned, so nothing is profiled
    assert counts == {"server": 1, "zygote": 1, "host": 1, "worker": 2, "profiler": 0}
    assert run["processes"] == 5 and run["ready_s"] > 0 and run["cpu_s_to_ready"] > 0
    assert 0 < run["uss_mib"] <= run["pss_mib"] <= run["rss_mib"]
    assert sum(entry["pss_mib"] for entry in run["by_role"].values()) == run["pss_mib"]


def test_a_background_profile_is_counted_as_the_profilers_not_as_a_host(tmp_path: Path) -> None:
    """With no `workers` line and no profile, the model is profiled beside serving, in a process the zygote forks
    (as it forks the hosts): the benchmark tells it from the hosts by its name."""
    link_example(tmp_path / "models", "mlp", packrat={"background_profile": True, "threads": 1})
    run = measure_start(tmp_path / "models")
    counts = {role: entry["count"] for role, entry in run["by_role"].items()}
    assert counts["host"] == 1 and counts["zygote"] == 1 and counts["profiler"] >= 1, counts
