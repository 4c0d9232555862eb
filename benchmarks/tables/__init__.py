"""Markdown of the committed results under benchmarks/results/, for the documentation site (its MkDocs hook renders
each benchmark page's result at build time) and the README's figures (`python -m benchmarks.tables --readme`).

A result's tables are its benchmark's own: where the benchmark prints Markdown tables or summary lines for its
record, those are captured here (as the run printed them); the others have theirs in `summaries`.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks import stale
from benchmarks.tables import summaries
from benchmarks.tables.serving import elastic_batching, serving_overhead

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"

Renderer = Callable[[dict[str, Any]], str]


def printed(show: Callable[[], object]) -> str:
    """What `show` prints, as Markdown: its tables as they are, its other lines as a text block; the lines that
    say where the run wrote its files left out."""
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        show()
    blocks: list[tuple[bool, list[str]]] = []
    for line in buffer.getvalue().splitlines():
        if line.startswith("wrote ") or "; wrote " in line or not line.strip():
            if blocks and blocks[-1][1]:
                blocks.append((False, []))
            continue
        table = line.startswith("|")
        if not blocks or blocks[-1][0] != table or not blocks[-1][1]:
            blocks.append((table, []))
        blocks[-1][1].append(line)
    return "\n\n".join(
        "\n".join(lines) if table else "```text\n" + "\n".join(lines) + "\n```" for table, lines in blocks if lines
    )


def _module_printer(module: str, function: str = "_print") -> Renderer:
    """A benchmark's own printer, called as the benchmark calls it at the end of a run: `(report, output)`."""

    def render(report: dict[str, Any]) -> str:
        show = getattr(importlib.import_module(module), function)
        return printed(lambda: show(report, Path(f"{report['benchmark']}.json")))

    return render


def _per_model(module: str) -> Renderer:
    """GATI's benchmarks print a summary per model of `report["models"]`."""

    def render(report: dict[str, Any]) -> str:
        show = importlib.import_module(module).print_model
        text = printed(lambda: [show(name, result) for name, result in report["models"].items()])
        bars = report.get("bars")
        return text + "\n\n" + summaries.listed_bars(bars) if isinstance(bars, list) else text

    return render


def _packrat_speedup(report: dict[str, Any]) -> str:
    from benchmarks.packrat.speedup import markdown

    return markdown(report)


def _planner(report: dict[str, Any]) -> str:
    from benchmarks.planner.replanning import print_summary

    return printed(lambda: print_summary(report))


def _slo_nns(report: dict[str, Any]) -> str:
    from benchmarks.slo_nns.run import _print

    return printed(lambda: _print(report, Path("slo_nns.json"), []))


RENDERERS: dict[str, Renderer] = {
    "serving_overhead": serving_overhead,
    "elastic_batching": elastic_batching,
    **{
        name: _module_printer(f"benchmarks.{name}")
        for name in (
            "shared_memory",
            "trace_overhead",
            "tls_overhead",
            "response_cache",
            "versus_ray",
            "versus_kserve",
            "versus_torchserve",
            "http_compression",
            "shared_cores",
            "hardening",
            "latency_profile",
            "grpc_loops",
            "footprint",
        )
    },
    "packrat_reconfiguration": _module_printer("benchmarks.packrat.reconfiguration"),
    "packrat_default": _module_printer("benchmarks.packrat.default"),
    "cluster_fleet": _module_printer("benchmarks.cluster.fleet"),
    "cluster_scaling": _module_printer("benchmarks.cluster.scaling"),
    "cluster_forwarding": _module_printer("benchmarks.cluster.forwarding"),
    "cluster_versus_ray_serve": _module_printer("benchmarks.cluster.versus_ray_serve"),
    "packrat_speedup": _packrat_speedup,
    "gati_explore": _per_model("benchmarks.gati.explore"),
    "gati_fit_data": _per_model("benchmarks.gati.fit_data"),
    "gati_early_exit": _per_model("benchmarks.gati.early_exit"),
    "gati_locality": _module_printer("benchmarks.gati.locality"),
    "planner_replanning": _planner,
    "slo_nns": _slo_nns,
    **summaries.RENDERERS,
}


def render_result(path: Path, plots: str) -> str:
    """A result file's page section: where and when it ran, whether the code has moved on since, its tables and
    its plots (linked under `plots`, the results folder relative to the page). A benchmark added before its first
    full run has no result yet: the page says so, and the site still builds."""
    if not path.is_file():
        return f"No result yet: `benchmarks/results/{path.name}` is written by the command above."
    report = json.loads(path.read_text())
    renderer = RENDERERS.get(report["benchmark"])
    if renderer is None:
        raise KeyError(f"{path.name}: no tables for benchmark {report['benchmark']!r} (benchmarks/tables)")
    images = sorted(RESULTS.glob(f"{path.stem}.png")) + sorted(RESULTS.glob(f"{path.stem}.*.png"))
    return "\n\n".join(
        [
            provenance(path, report),
            renderer(report),
            *(f"![{image.stem}]({plots}/{image.name})" for image in images),
        ]
    )


def provenance(path: Path, report: dict[str, Any]) -> str:
    """Where and when a result ran, the command that repeats it, and whether the code it measures changed since."""
    machine = report.get("machine") or {}
    when = str(report.get("started_at") or report.get("created") or "").replace("T", " ").replace("+0000", " UTC")
    where = f"{machine.get('cpu_model', '?')}, {machine.get('cores', '?')} cores"
    if machine.get("gpu"):
        where += f", {machine['gpu']}"
    verdict = stale.verdict(ROOT, path)
    facts = [f"`benchmarks/results/{path.name}`", *([f"started {when}"] if when else []), where]
    if verdict.since:
        facts.append(f"{'ran at' if verdict.recorded else 'committed at'} `{verdict.since[:7]}`")
    text = " · ".join(facts) + f"\n\n```sh\n{report.get('command', '')}\n```"
    if verdict.changed:
        kind = "Older than the code it measures" if verdict.stale else "Its harness changed since"
        paths = ", ".join(f"`{changed}`" for changed in verdict.changed)
        text += f'\n\n!!! warning "{kind}"\n    Changed since it ran: {paths} (`python -m benchmarks.stale`).'
    return text


def headline(results: Path = RESULTS) -> str:
    """The figures that matter most, one row each, as the README and the site's front page show them."""
    rows = ["| technique | what is compared | measured | bar | from |", "|---|---|---|---|---|"]
    for technique, compared, measured, bar, name in summaries.headline_rows(results):
        rows.append(f"| {technique} | {compared} | {measured} | {bar} | `{name}` |")
    return "\n".join(rows)


#: Where the README holds the headline table; `with_headline` rewrites what lies between.
README_FIGURES = re.compile(
    r"(<!-- figures: python -m benchmarks.tables --readme -->\n)(?:.*?\n)?(<!-- /figures -->)", re.S
)


def with_headline(readme: str, results: Path = RESULTS) -> str:
    """The README's text with its figures table rendered afresh from the committed results."""
    if not README_FIGURES.search(readme):
        raise ValueError("the README has no figures markers")
    return README_FIGURES.sub(lambda match: match.group(1) + headline(results) + "\n" + match.group(2), readme)


__all__ = ["RENDERERS", "headline", "printed", "provenance", "render_result", "with_headline"]
