import json
from pathlib import Path

import pytest

from adaserve.cli import build_parser
from adaserve.errors import ModelTooLargeError
from tests.cache.factories import AZURE_FUNCTIONS, needs_azure_functions

MODELS = {
    "small": {"size_bytes": 10_000_000, "load_s": 0.2, "exec_s": 0.01},
    "medium": {"size_bytes": 40_000_000, "load_s": 0.6, "exec_s": 0.02},
    "large": {"size_bytes": 90_000_000, "load_s": 1.5, "exec_s": 0.05},
}


def _run(*argv: str) -> int:
    args = build_parser().parse_args(["model-cache", "simulate", *argv])
    return int(args.func(args))


@needs_azure_functions
def test_simulate_prints_a_row_per_workload_budget_and_policy(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    models, output = tmp_path / "models.json", tmp_path / "out.json"
    models.write_text(json.dumps(MODELS))
    code = _run(
        "--models", str(models), "--trace", str(AZURE_FUNCTIONS), "--assign", "random,quantile",
        "--requests", "300", "--budget", "70%,100MB", "--policy", "iam,lru,oracle", "--json", str(output),
    )  # fmt: skip
    assert code == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:4] == ["assign", "budget", "policy", "hit"]
    assert len([line for line in lines if line.startswith(("random", "quantile"))]) == 2 * 2 * 3
    written = json.loads(output.read_text())
    assert written["total_bytes"] == 140_000_000 and len(written["rows"]) == 12
    assert {row["policy"] for row in written["rows"]} == {"iam", "lru", "oracle"}
    assert written["settings"]["requests"] == 300


@needs_azure_functions
def test_a_budget_below_a_model_or_a_bad_file_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    models = tmp_path / "models.json"
    models.write_text(json.dumps(MODELS))
    with pytest.raises(ModelTooLargeError, match="model 'large' needs 90000000 bytes"):
        _run("--models", str(models), "--budget", "50MB", "--requests", "100")
    assert _run("--models", str(models), "--budget", "lots") == 2
    assert "budget 'lots'" in capsys.readouterr().err
    assert _run("--models", str(tmp_path / "missing.json")) == 2
    assert "cannot read the models file" in capsys.readouterr().err


def test_unknown_policy_is_refused_by_the_parser(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["model-cache", "simulate", "--models", "m.json", "--policy", "iam,mru"])
    assert "unknown mru" in capsys.readouterr().err
