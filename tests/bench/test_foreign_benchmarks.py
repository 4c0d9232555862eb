"""The comparisons with KServe, Ray Serve and TorchServe at their smallest. Each foreign server lives in a venv of
its own (`benchmarks/foreign_env.sh`), not in the test extra: where it is missing, its end-to-end run is skipped
with what to run, and what needs no foreign server is still checked: each benchmark's plot and table drawn from its
committed result (the record format they read), and the message that names the missing venv."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from benchmarks import versus_kserve, versus_ray, versus_torchserve
from benchmarks.common import RESULTS
from benchmarks.foreign import venv_python
from benchmarks.perf_load import PerfAnalyzer
from tests.bench.factories import can_unshare, positive, recorded
from tests.server_utils import ROOT

#: Each benchmark, the venv its foreign server runs in, and the argument that names it.
FOREIGN = {
    "versus_kserve": (versus_kserve, ".venv-kserve", "kserve"),
    "versus_ray": (versus_ray, ".venv-ray", "ray"),
    "versus_torchserve": (versus_torchserve, ".venv-torchserve", "torchserve"),
}


def test_a_missing_venv_names_the_script_that_makes_it(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match=r"run benchmarks/foreign_env\.sh kserve first"):
        venv_python(tmp_path / ".venv-kserve", "benchmarks/foreign_env.sh kserve")


@pytest.mark.parametrize("name", sorted(FOREIGN))
def test_the_plot_and_table_read_the_committed_result(
    name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    module: ModuleType = FOREIGN[name][0]
    report = json.loads((RESULTS / f"{name}.json").read_text())
    module._plot(report, tmp_path / f"{name}.png")
    module._print(report, tmp_path / f"{name}.json")
    assert (tmp_path / f"{name}.png").stat().st_size > 0
    assert "| " in capsys.readouterr().out


def _run_foreign(name: str, tmp_path: Path, *args: str) -> dict[str, object]:
    """The benchmark end to end in a subprocess (it re-runs itself in a network namespace of its own anyway), or a
    skip naming the venv to make."""
    _, venv, kind = FOREIGN[name]
    if not (ROOT / venv / "bin" / "python").is_file():
        pytest.skip(f"no {venv}: run benchmarks/foreign_env.sh {kind}")
    if not can_unshare():
        pytest.skip("needs a network namespace (unshare -rn): the foreign servers bind every interface")
    output = tmp_path / f"{name}.json"
    command = [sys.executable, "-m", f"benchmarks.{name}", "--quick", *args, "--output", str(output)]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=540)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return recorded(output, f"benchmarks.{name}")


def _both_answered(report: dict[str, object], servers: set[str]) -> None:
    runs = report["runs"]
    assert isinstance(runs, list) and {run["server"] for run in runs} == servers
    assert all(positive(run["throughput_rps"]) for run in runs if run.get("returncode", 0) == 0)


@pytest.mark.timeout(600)
def test_versus_kserve(tmp_path: Path) -> None:
    report = _run_foreign("versus_kserve", tmp_path, "--duration", "1")
    _both_answered(report, {"adaserve", "kserve"})


@pytest.mark.timeout(600)
def test_versus_ray(tmp_path: Path, perf_analyzer: PerfAnalyzer) -> None:
    perf = str(perf_analyzer.binary.parent.parent)
    report = _run_foreign("versus_ray", tmp_path, "--request-count", "50", "--perf-venv", perf)
    _both_answered(report, {"adaserve", "ray"})


@pytest.mark.timeout(600)
def test_versus_torchserve(tmp_path: Path, perf_analyzer: PerfAnalyzer) -> None:
    perf = str(perf_analyzer.binary.parent.parent)
    report = _run_foreign("versus_torchserve", tmp_path, "--request-count", "50", "--perf-venv", perf)
    _both_answered(report, {"adaserve", "torchserve"})
