"""`python -m benchmarks.stale` on a small git repository made for each test: which changes make a result stale."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from benchmarks.common import code_version
from benchmarks.stale import Verdict, check, describe, measured_paths

CORE = '"""The technique."""\n\n\ndef score(x: int) -> int:\n    return x + 1\n'
FILES = {
    "adaserve/__init__.py": "",
    "adaserve/zoo.py": "WIDTH = 4\n",
    "adaserve/technique/__init__.py": "",
    "adaserve/technique/core.py": CORE,
    "adaserve/bench/__init__.py": "RATE = 1\n",
    "adaserve/other/__init__.py": "X = 1\n",
    "benchmarks/__init__.py": "",
    "benchmarks/common.py": "from adaserve.other import X\n",
    "benchmarks/helper.py": "from adaserve import bench\n",
    "benchmarks/demo.py": (
        "from adaserve.technique.core import score\nfrom adaserve import zoo\n"
        "from benchmarks.common import X\nfrom benchmarks.helper import bench\n"
    ),
}


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True).stdout.strip()


def _commit(repo: Path, files: dict[str, str], message: str) -> str:
    for name, text in files.items():
        path = repo / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    _git(repo, "add", "-A")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", message)
    return _git(repo, "rev-parse", "HEAD")


def _result(commit: str | None = None) -> str:
    machine = {} if commit is None else {"commit": commit, "dirty": False}
    return json.dumps(
        {"benchmark": "demo", "command": ".venv/bin/python -m benchmarks.demo --quick", "machine": machine}
    )


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    _git(tmp_path, "init", "-q")
    _commit(tmp_path, {**FILES, "benchmarks/results/demo.json": _result()}, "a benchmark and its result")
    return tmp_path


def _verdict(repo: Path, name: str = "demo.json") -> Verdict:
    return next(v for v in check(repo) if v.result == f"benchmarks/results/{name}")


def test_the_measured_code_is_the_benchmark_its_imports_and_the_packages_they_name(repo: Path) -> None:
    assert measured_paths(repo, "benchmarks.demo") == [
        "adaserve/technique/",
        "adaserve/bench/",
        "benchmarks/demo.py",
        "benchmarks/helper.py",
    ]  # not benchmarks/common.py, adaserve/other/ (only common imports it) nor the top-level adaserve/zoo.py


def test_a_result_is_current_until_the_code_it_measures_changes(repo: Path) -> None:
    assert _verdict(repo).changed == ()
    _commit(repo, {"adaserve/technique/core.py": CORE.replace("The technique.", "The technique, said better.")}, "doc")
    _commit(repo, {"adaserve/technique/core.py": CORE.replace("x + 1", "x + 1  # one more")}, "comment")
    _commit(repo, {"adaserve/zoo.py": "WIDTH = 8\n", "adaserve/other/__init__.py": "X = 2\n"}, "elsewhere")
    _commit(repo, {"adaserve/technique/cli.py": "def register() -> None: ...\n"}, "its command line")
    assert _verdict(repo).changed == ()

    _commit(repo, {"adaserve/technique/core.py": CORE.replace("x + 1", "x + 2")}, "the technique changes")
    verdict = _verdict(repo)
    assert verdict.stale and verdict.changed == ("adaserve/technique/",) and not verdict.recorded
    assert describe(verdict).startswith("demo.json: STALE (committed at ")


def test_a_harness_change_is_told_apart_from_a_stale_result(repo: Path) -> None:
    _commit(
        repo,
        {"adaserve/bench/__init__.py": "RATE = 2\n", "benchmarks/helper.py": "from adaserve import bench\n\n"},
        "h",
    )
    _commit(repo, {"benchmarks/demo.py": FILES["benchmarks/demo.py"] + "ROWS = 3\n"}, "harness")
    verdict = _verdict(repo)
    assert not verdict.stale and verdict.changed == ("adaserve/bench/", "benchmarks/demo.py")
    assert "harness changed" in describe(verdict)


def test_a_recorded_commit_is_counted_from_rather_than_the_files_own(repo: Path) -> None:
    ran_at = _commit(repo, {"adaserve/technique/core.py": CORE.replace("x + 1", "x + 3")}, "before the run")
    _commit(repo, {"benchmarks/results/late.json": _result(ran_at)}, "the result, committed later")
    assert _verdict(repo, "late.json").changed == ()
    _commit(repo, {"benchmarks/results/early.json": _result(_git(repo, "rev-parse", "HEAD~2"))}, "an older run")
    early = _verdict(repo, "early.json")
    assert early.stale and early.recorded and "ran at" in describe(early)


def test_an_uncommitted_result_has_nothing_to_count_from(repo: Path) -> None:
    (repo / "benchmarks/results/new.json").write_text(_result())
    assert describe(_verdict(repo, "new.json")) == "new.json: not committed yet"


def test_results_record_the_commit_and_whether_the_tree_had_changes() -> None:
    version = code_version()
    assert len(version["commit"]) == 40 and isinstance(version["dirty"], bool)
