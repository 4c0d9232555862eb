"""`benchmarks/hardening.py` at its smallest: two attacks for a second each against a real server, to check that
it runs and what it records (its figures are the benchmark's, not this test's)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.server_utils import ROOT


def test_the_hardening_benchmark_runs_and_records_each_attack(tmp_path: Path) -> None:
    output = tmp_path / "hardening.json"
    command = [sys.executable, "-m", "benchmarks.hardening", "--attacks", "malformed,gzip_members", "--seconds", "1"]
    done = subprocess.run([*command, "--output", str(output)], cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(output.read_text())
    assert list(report["attacks"]) == ["malformed", "gzip_members"]
    for row in report["attacks"].values():
        assert row["attack"]["server_alive"] and row["attack"]["failed"] == 0
        assert row["alone"]["requests"] > 10 and row["attack"]["requests"] > 10
        assert row["p99_ratio"] > 0 and "rss_growth_bytes" in row
    assert output.with_suffix(".png").exists() and "| malformed |" in done.stdout
