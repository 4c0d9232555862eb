"""`python -m benchmarks.tables`: the command that prints a result's tables and rewrites the README's figures; the
headline and tables of results judged over seeds."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from benchmarks.gati import early_exit
from benchmarks.slo_nns import run as slo_nns
from benchmarks.tables import RENDERERS, RESULTS, summaries, with_headline
from benchmarks.tables import __main__ as tables
from tests.bench.factories import gati_seed


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


def test_the_headline_and_tables_read_results_judged_over_seeds(tmp_path: Path) -> None:
    for path in RESULTS.glob("*.json"):
        shutil.copy(path, tmp_path)
    gati = json.loads((tmp_path / "gati_early_exit.json").read_text())
    seeds = [gati_seed(ms) | {"seed": seed, "build_s": 9.0, "rows": 200} for seed, ms in enumerate((0.5, 0.4, 0.6))]
    for seed in seeds:
        seed["figures"] = early_exit.seed_figures(seed["methods"])
    gati["models"]["resnet"]["seeds"] = seeds
    gati["bars"] = early_exit.bars(gati["models"]["resnet"])
    slo = json.loads((tmp_path / "slo_nns.json").read_text())
    slo["seeds"] = [slo_nns._seed_record(seed, slo["models"]) for seed in (0, 1, 2)]
    slo["bars"] = slo_nns._bars(slo["seeds"])
    for name, report in (("gati_early_exit", gati), ("slo_nns", slo)):
        (tmp_path / f"{name}.json").write_text(json.dumps(report))
    rows = {row[-1]: row for row in summaries.headline_rows(tmp_path)}
    assert "median of 3 seeds" in rows["gati_early_exit.json"][1] and rows["gati_early_exit.json"][2].startswith(
        "3.00×"
    )
    assert "median of 3 seeds" in rows["slo_nns.json"][1]
    assert "seed 2: built in 9 s" in RENDERERS["gati_early_exit"](gati)
    assert "seed 2: mlp112 activator built in" in RENDERERS["slo_nns"](slo)
