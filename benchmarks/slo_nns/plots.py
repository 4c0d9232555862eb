"""The benchmark's three figures: accuracy against computed nodes (paper Fig. 4), ACLO speedup per input (Fig. 5),
and LCAO under co-located load."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import figure


def plot_all(report: dict[str, Any], stem: Path) -> list[Path]:
    paths = [stem.with_suffix(".accuracy.png"), stem.with_suffix(".aclo.png"), stem.with_suffix(".lcao.png")]
    _accuracy(report, paths[0])
    _aclo(report, paths[1])
    _lcao(report, paths[2])
    return paths


def _accuracy(report: dict[str, Any], path: Path) -> None:
    models = report["models"]
    fig = figure(5.5 * len(models), 4.2)
    for index, (name, model) in enumerate(models.items()):
        curves = model["accuracy_curves"]
        ax = fig.add_subplot(1, len(models), index + 1)
        nodes = 100 * np.asarray(curves["computed_nodes"]) / curves["hidden_nodes"]
        for key, label, style in (
            ("lsh", "LSH node activator", "o-"),
            ("global", "static global ranking", "s--"),
            ("random", "random dropout (3 seeds)", "^:"),
            ("serving_plan_lsh", "serving plan at k (a layer with few active inputs: all nodes)", "x-"),
        ):
            ax.plot(nodes, 100 * np.asarray(curves[key]), style, label=label, markersize=4)
        ax.axhline(100 * curves["dense"], color="gray", linewidth=0.8, label="dense")
        ax.set_xlabel("k: hidden nodes computed (%)")
        ax.set_ylabel("test accuracy (%)")
        ax.set_title(f"{name} ({'-'.join(map(str, model['sizes']))})")
        ax.set_ylim(max(0.0, 100 * curves["dense"] - 40), 100 * curves["dense"] + 3)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def _aclo(report: dict[str, Any], path: Path) -> None:
    models = report["models"]
    fig = figure(5.5 * len(models), 4.2)
    for index, (name, model) in enumerate(models.items()):
        rows = [r for r in model["aclo"]["rows"] if r["method"].startswith("aclo_") or r["method"] == "exact"]
        ax = fig.add_subplot(1, len(models), index + 1)
        labels = [
            ("exact k=100%" if r["method"] == "exact" else f"≤{100 * r['budget']:.1f}%")
            + f"\nloss {100 * r['loss']:.2f}%"
            for r in rows
        ]
        positions = np.arange(len(rows))
        mean = np.array([r["speedup_vs_dense_mean"] for r in rows])
        low = mean - np.array([r["speedup_vs_dense_min"] for r in rows])
        high = np.array([r["speedup_vs_dense_max"] for r in rows]) - mean
        ax.bar(positions, mean, yerr=[low, high], capsize=3, color="tab:blue", alpha=0.8, label="vs tuned dense kernel")
        ax.plot(positions, [r["speedup_vs_torch_mean"] for r in rows], "o", color="tab:orange", label="mean vs torch")
        ax.axhline(1.0, color="gray", linewidth=0.8)
        ax.set_xticks(positions, labels, fontsize=6)
        ax.set_xlabel("calibrated accuracy-loss budget (measured loss on the unseen half)")
        ax.set_ylabel("per-input speedup (mean, bar: min-max)")
        ax.set_title(f"ACLO, {name}")
        ax.set_yscale("log")
        ax.grid(alpha=0.3, axis="y")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def _lcao(report: dict[str, Any], path: Path) -> None:
    """Each method's misses against its own τ (dense: the dense p50), and its accuracy, per busy level."""
    models = report["models"]
    fig = figure(5.5 * len(models), 6.5)
    for index, (name, model) in enumerate(models.items()):
        runs, taus = model["lcao"]["runs"], model["lcao"]["taus_ms"]
        betas = [run["busy_processes"] for run in runs]
        methods = list(runs[0]["methods"])
        miss = fig.add_subplot(2, len(models), index + 1)
        accuracy = fig.add_subplot(2, len(models), len(models) + index + 1)
        width = 0.8 / len(methods)
        accuracies = []
        for offset, method in enumerate(methods):
            tau = runs[0]["methods"][method].get("tau", "dense_p50")
            label = "dense" if method == "dense" else f"LCAO, τ = {tau.replace('_', ' ')} ({taus[tau]:.3f} ms)"
            positions = np.arange(len(betas)) + (offset - (len(methods) - 1) / 2) * width
            values = [100 * run["methods"][method]["accuracy"] for run in runs]
            accuracies += values
            miss.bar(positions, [100 * run["methods"][method]["miss_rate"][tau] for run in runs], width, label=label)
            accuracy.bar(positions, values, width, label=label)
        for ax in (miss, accuracy):
            ax.set_xticks(np.arange(len(betas)), [f"{b} busy" for b in betas])
            ax.grid(alpha=0.3, axis="y")
        miss.set_ylabel("SLO misses (%)")
        miss.set_title(f"LCAO, {name}: dense against τ = dense p50 ({taus['dense_p50']:.3f} ms)", fontsize=9)
        miss.legend(fontsize=7)
        accuracy.set_ylim(min(accuracies) - 2, max(accuracies) + 1)
        accuracy.set_ylabel("test accuracy (%)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
