"""Reports on disk, the printed table, and `compare`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from adaserve.bench.compare import compare, format_comparison, workload_differences
from adaserve.bench.plots import plot_all
from adaserve.bench.report import format_summary, write_report
from adaserve.bench.results import BenchResult, ResultError, Status, read_result
from adaserve.bench.summary import summarize
from tests.bench.factories import record, result

PNG = b"\x89PNG\r\n\x1a\n"


def _run(latency_ms: float, **workload: Any) -> BenchResult:
    records = [record(i, i * 0.05, latency_ms=latency_ms + i % 7) for i in range(40)]
    records.append(record(40, 2.0, status=Status.ERROR, kind="http_503", latency_ms=3.0))
    return result(records, window_s=2.0, **workload)


def test_report_writes_json_and_three_pngs_and_reads_back(tmp_path: Path) -> None:
    original = _run(10.0)
    original.records[0].parameters = {"exit_layer": 2}
    files = write_report(original, tmp_path / "run.json")
    assert [f.name for f in files] == ["run.json", "run.cdf.png", "run.timeline.png", "run.throughput.png"]
    for png in files[1:]:
        assert png.read_bytes()[:8] == PNG
    loaded = read_result(tmp_path / "run.json")
    assert loaded.summary == original.summary
    assert loaded.records[0].parameters == {"exit_layer": 2}
    assert loaded.records[40].status is Status.ERROR
    assert loaded.machine.cores >= 1 and loaded.config["workload"]["load"]["kind"] == "poisson"


def test_no_plots_and_nothing_to_plot(tmp_path: Path) -> None:
    assert write_report(_run(10.0), tmp_path / "a.json", plots=False) == [tmp_path / "a.json"]
    assert write_report(result([], window_s=0.0), tmp_path / "b.json") == [tmp_path / "b.json"]


def test_summary_table_names_every_figure() -> None:
    text = format_summary(_run(10.0))
    for words in (
        "mlp over http at 127.0.0.1:1: poisson (rate=10.0, seed=0), 1 s",
        "41 (41 sent, 40 ok, 1 errors",
        "asked 10.0/s",
        "p50 ",
        "p99.9 ",
        "http_503 1",
        "µs CPU/request",
        "lateness",
        "verdict     valid",
    ):
        assert words in text


def test_summary_table_gives_each_request_kind_its_latency_and_what_it_lost() -> None:
    run = _run(10.0)
    for r in run.records:
        r.kind = r.id % 2  # the refused request (id 40) is of kind 0
    run.summary = summarize(
        run.records,
        open_loop=True,
        asked_requests=20.0,
        window_s=2.0,
        cpu_s=0.01,
        wall_s=2.0,
        max_lateness_ms=10.0,
        kinds=["mlp priority=1", "mlp"],
    )
    lines = format_summary(run).splitlines()
    (first,) = [line for line in lines if line.strip().startswith("0: mlp priority=1")]
    (second,) = [line for line in lines if line.strip().startswith("1: mlp ")]
    assert first.endswith("; 1 not answered") and "not answered" not in second


def test_unreadable_results_are_refused(tmp_path: Path) -> None:
    (tmp_path / "x.json").write_text('{"hello": 1}')
    with pytest.raises(ResultError, match="not an adaserve bench result"):
        read_result(tmp_path / "x.json")
    with pytest.raises(ResultError, match="cannot read result"):
        read_result(tmp_path / "absent.json")


def test_compare_gives_the_ratio_of_every_figure(tmp_path: Path) -> None:
    a, b = _run(10.0), _run(20.0)
    b.summary.errors_by_kind = {"timeout": 2}
    rows = {row.figure: row for row in compare(a, b)}
    p50_a, p50_b = a.summary.latency.p50_ms, b.summary.latency.p50_ms
    assert p50_a is not None and p50_b is not None
    assert rows["latency.p50_ms"].ratio == pytest.approx(p50_b / p50_a)
    assert rows["throughput_rps"].a == a.summary.throughput_rps
    assert rows["errors_by_kind.http_503"].b == 0 and rows["errors_by_kind.http_503"].ratio == 0
    assert rows["errors_by_kind.timeout"].a == 0 and rows["errors_by_kind.timeout"].ratio is None
    assert "per_model.mlp.p99_ms" in rows and "generator.cpu_per_request_us" in rows
    table = format_comparison(list(rows.values()), ("base", "new"))
    assert table.splitlines()[0].split() == ["figure", "base", "new", "B/A"]
    files = plot_all([("base", a), ("new", b)], tmp_path / "cmp")
    assert all(f.read_bytes()[:8] == PNG for f in files)


def test_workload_differences_are_named() -> None:
    assert workload_differences(_run(1.0), _run(2.0)) == []
    assert workload_differences(_run(1.0), _run(1.0, duration_s=2.0)) == ["workload.duration_s: 1.0 vs 2.0"]
