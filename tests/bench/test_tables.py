"""`python -m benchmarks.tables`: the command that prints a result's tables and rewrites the README's figures."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.tables import RESULTS, with_headline
from benchmarks.tables import __main__ as tables


def test_prints_each_result_with_where_it_ran(capsys: pytest.CaptureFixture[str]) -> None:
    assert tables.main([str(RESULTS / "footprint.json"), str(RESULTS / "serving_overhead.json")]) == 0
    out = capsys.readouterr().out
    assert out.count("```sh\n") == 2 and "`benchmarks/results/footprint.json`" in out
    assert "python -m benchmarks.footprint" in out and "benchmarks.serving_overhead" in out


def test_readme_option_rewrites_only_the_figures(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    readme = tmp_path / "README.md"
    stale = "# adaserve\n\n<!-- figures: python -m benchmarks.tables --readme -->\n| old |\n<!-- /figures -->\n\nrest\n"
    readme.write_text(stale)
    monkeypatch.setattr(tables, "ROOT", tmp_path)
    assert tables.main(["--readme"]) == 0
    text = readme.read_text()
    assert text == with_headline(stale) and "| old |" not in text
    assert text.startswith("# adaserve\n") and text.endswith("\nrest\n") and "`footprint.json`" in text
