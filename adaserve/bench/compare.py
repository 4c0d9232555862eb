"""Two runs of one workload side by side: every numeric summary figure, both values and their ratio B/A."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgspec

from adaserve.bench.results import BenchResult


@dataclass(frozen=True)
class Row:
    """One summary figure in both runs; `ratio` is B/A, None where A is zero or either is missing."""

    figure: str
    a: float | None
    b: float | None
    ratio: float | None


def compare(a: BenchResult, b: BenchResult) -> list[Row]:
    """Every numeric figure of the two summaries, in the order of A's summary (then figures only B has)."""
    figures_a = _flatten(msgspec.to_builtins(a.summary))
    figures_b = _flatten(msgspec.to_builtins(b.summary))
    # Kinds of error or models that only one run has: the other run had none of them.
    for figures, other in ((figures_a, figures_b), (figures_b, figures_a)):
        for name in other:
            if name.startswith("errors_by_kind.") and name not in figures:
                figures[name] = 0
    names = list(dict.fromkeys([*figures_a, *figures_b]))
    return [
        Row(name, figures_a.get(name), figures_b.get(name), _ratio(figures_a.get(name), figures_b.get(name)))
        for name in names
    ]


def workload_differences(a: BenchResult, b: BenchResult) -> list[str]:
    """Where the two runs' workloads differ (`path: A vs B`); empty when they ran the same workload."""
    return _differences(a.config.get("workload"), b.config.get("workload"), "workload")


def format_comparison(rows: list[Row], labels: tuple[str, str]) -> str:
    """An aligned table: figure, A, B, B/A."""
    table = [("figure", *labels, "B/A")]
    table += [
        (row.figure, _number(row.a), _number(row.b), "-" if row.ratio is None else f"{row.ratio:.3f}") for row in rows
    ]
    widths = [max(len(line[i]) for line in table) for i in range(4)]
    return "\n".join(
        f"{line[0]:<{widths[0]}}  " + "  ".join(f"{cell:>{w}}" for cell, w in zip(line[1:], widths[1:], strict=True))
        for line in table
    )


def _flatten(data: Any, prefix: str = "") -> dict[str, float | None]:
    """Numeric leaves (not booleans) of nested dicts, keyed by dotted path; None leaves are kept as missing."""
    figures: dict[str, float | None] = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            figures.update(_flatten(value, f"{name}."))
        elif value is None or (isinstance(value, int | float) and not isinstance(value, bool)):
            figures[name] = value
    return figures


def _ratio(a: float | None, b: float | None) -> float | None:
    return b / a if a is not None and b is not None and a != 0 else None


def _number(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.0f}" if float(value).is_integer() and abs(value) >= 1 else f"{value:.4g}"


def _differences(a: Any, b: Any, path: str) -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        return [d for key in dict.fromkeys([*a, *b]) for d in _differences(a.get(key), b.get(key), f"{path}.{key}")]
    return [] if a == b else [f"{path}: {a!r} vs {b!r}"]
