"""GATI's exploration and composition on the example CNN and MLP (Fashion-MNIST), batch 1, one thread, in-process.

For each model it builds a cache set exactly as `adaserve caches build MODEL --data fashion-mnist` does (the example
artifacts are copied to benchmarks/results/tmp/gati/ first, so examples/ stays untouched), then reports:

- per (block, variant) at each target: hit rate and agreement of the learned selector and of a plain max-softmax
  threshold (both set on the calibrate split, measured on the evaluate split), lookup latency, memory;
- the compositions: the paper's MILP (per-cache thresholds) and the overall-target composition (the default, tuned
  on half the calibrate split and certified on the other half at a risk of 0.05), and beside it the overall
  composition certified at risks of 0.2 and 0.5;
- a chain study of agreement alone: after every exit block, the variant that hits most on its own, chained with
  each cache's own threshold (the paper's per-cache filter) and with thresholds certified for the overall target — on
  these small models the one-lookup-in-flight rule leaves room for one exit only, so this is where chaining shows;
- for each composition, the expected mean latency (lookups costed on the rows' path, as the CPU runtime runs them
  inline) and, measured
  here on the evaluate split's rows one at a time, interleaved in a random order on the same row: the model whole
  (as a worker serves it), the block chain without caches (both from one loaded program, sharing its weights),
  and the block chain with the composition's caches run synchronously on the same thread (lookups on the critical
  path: an upper bound of what the asynchronous runtime will cost), with the agreement with the whole model's
  argmax actually achieved.

Usage: .venv/bin/python -m benchmarks.gati.explore [--quick] [--models cnn mlp] [--targets 0.99 0.97]
Writes benchmarks/results/gati_explore.json and .png (--quick: under benchmarks/results/tmp/).
"""

from __future__ import annotations

import argparse
import math
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from adaserve.adaptive.gati.blocks import BlockChain, split_model
from adaserve.adaptive.gati.cacheset import CacheSet, CompositionRecord, LearnedCache, Manifest
from adaserve.adaptive.gati.compose import Candidate, certified_exits, compose, simulate
from adaserve.adaptive.gati.explore import ExploreSettings, build_cache_set, load_data
from adaserve.adaptive.gati.selectors import HitRates, choose_threshold
from adaserve.repository import ModelRepository
from benchmarks.common import (
    RESULTS,
    ROOT,
    SCRATCH,
    command_line,
    figure,
    load_window,
    machine,
    shown_path,
    wait_for_quiet,
    write_json,
)

EXAMPLES = ROOT / "examples" / "models"
#: The study compositions beside the built ones: label → compose() keyword arguments.
STUDIES: dict[str, dict[str, Any]] = {"risk 0.2": {"risk": 0.2}, "risk 0.5": {"risk": 0.5}}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the --quick exploration; results under tmp/")
    parser.add_argument("--models", nargs="+", default=["cnn", "mlp"])
    parser.add_argument("--targets", nargs="+", type=float, default=[0.99, 0.97])
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    out = (SCRATCH if args.quick else RESULTS) / "gati_explore.json"
    record: dict[str, Any] = {
        "benchmark": "gati_explore",
        "command": command_line(),
        "machine": machine(),
        "settings": {"quick": args.quick, "targets": args.targets, "threads": 1, "batch": 1},
        "models": {},
    }
    with load_window(record):
        for name in args.models:
            record["models"][name] = run_model(name, args.targets, args.quick)
    write_json(record, out)
    plot(record, out.with_suffix(".png"))
    print(f"wrote {out} and {out.with_suffix('.png')}")


def run_model(name: str, targets: list[float], quick: bool) -> dict[str, Any]:
    repository = SCRATCH / "gati" / "models"
    shutil.rmtree(repository / name, ignore_errors=True)
    shutil.copytree(EXAMPLES / name, repository / name)
    spec = ModelRepository(repository).read(name)
    began, cpu = time.perf_counter(), time.process_time()
    cache_set = build_cache_set(
        spec, "fashion-mnist", ExploreSettings.for_run(quick=quick), targets=targets, progress=False
    )
    build = {"wall_s": round(time.perf_counter() - began, 1), "cpu_s": round(time.process_time() - cpu, 1)}
    manifest = cache_set.manifest
    arrays = cache_set.scores()
    compositions = [("built", c) for c in manifest.compositions]
    for label, options in STUDIES.items():
        study = compose(manifest, arrays, targets, **options).compositions
        compositions += [(label, c) for c in study if c.method == "overall"]
    studies = {f"{target:g}": chain_study(manifest, arrays, target) for target in targets}
    wait = wait_for_quiet(30.0)
    x, _ = load_data("fashion-mnist", spec.config)
    rows = x[arrays["evaluate_rows"]]
    whole, chain = load_shared(spec.artifact)
    measured = measure(whole, chain, cache_set, compositions, rows)
    result = {
        "build": build | {"directory": shown_path(cache_set.directory)},
        "manifest": summary(manifest),
        "evaluate_rows": len(rows),
        "quiet_wait": wait,
        "chain_study": studies,
        "whole": measured.pop("whole"),
        "chain_without_caches": measured.pop("chain"),
        "compositions": [
            composition_record(label, c, manifest, measured[f"{label}|{c.target}|{c.method}"])
            for label, c in compositions
        ],
    }
    print_model(name, result)
    return result


def load_shared(artifact: Path) -> tuple[Callable[[torch.Tensor], torch.Tensor], BlockChain]:
    """The whole model as a worker runs it (`load_artifact`'s settings) and its block chain, from one program, so
    both read the same weight tensors: with a copy each, whichever ran less often would find its weights cold in
    the CPU caches (on the MLP that made the whole model look 1.8× slower than the chain)."""
    program = torch.export.load(str(artifact))
    whole: Any = program.module(check_guards=False)
    whole.validate_inputs = False
    return whole, split_model(program)


def measure(
    whole: Callable[[torch.Tensor], torch.Tensor],
    chain: BlockChain,
    cache_set: CacheSet,
    compositions: list[tuple[str, CompositionRecord]],
    rows: np.ndarray,
) -> dict[str, dict[str, Any]]:
    """Per row, interleaved in a random order: the whole model, the bare chain, and the chain with each
    composition's caches."""
    paths = {f"{label}|{c.target}|{c.method}": cache_set.caches(c) for label, c in compositions}
    times: dict[str, list[float]] = {key: [] for key in ["whole", "chain", *paths]}
    answers: dict[str, list[tuple[int, int]]] = {key: [] for key in paths}  # (exit position or -1, class)
    base_classes = []
    keys = ["whole", "chain", *paths]
    shuffle = np.random.default_rng(0)
    with torch.no_grad():
        for row in rows:
            x = torch.from_numpy(row[None])
            for key in shuffle.permutation(keys):  # a fresh order per row: no path always follows another
                began = time.perf_counter()
                if key == "whole":
                    base_classes.append(int(whole(x).argmax(1)))
                elif key == "chain":
                    chain.run(x)
                else:
                    answers[key].append(run_with_caches(chain, paths[key], x))
                times[key].append(time.perf_counter() - began)
    result: dict[str, dict[str, Any]] = {key: latency_summary(times[key]) for key in ("whole", "chain")}
    for key, caches in paths.items():
        exits = np.array([a[0] for a in answers[key]])
        agree = np.array([a[1] for a in answers[key]]) == np.array(base_classes)
        result[key] = latency_summary(times[key]) | {
            "agreement": float(agree.mean()),
            "exit_rates": [float(np.mean(exits == p)) for p in range(len(caches))],
        }
    return result


def run_with_caches(chain: BlockChain, caches: tuple[LearnedCache, ...], x: torch.Tensor) -> tuple[int, int]:
    """One row block by block, consulting each cache after its block: (exit position or −1, predicted class)."""
    at = {cache.exit.block_index: (p, cache) for p, cache in enumerate(caches)}
    for index, block in enumerate(chain.blocks):
        x = block(x)
        if index in at:
            position, cache = at[index]
            hit, logits, _ = cache(x)
            if bool(hit[0]):
                return position, int(logits.argmax(1))
    return -1, int(x.argmax(1))


def chain_study(manifest: Manifest, arrays: dict[str, np.ndarray], target: float) -> dict[str, Any]:
    """Agreement only (lookups counted free): after every exit block the variant that hits most on its own, chained
    once with each cache's own threshold (the per-cache filter) and once with thresholds certified for the overall
    target at the default risk on the calibrate split; both measured on the evaluate split."""
    cal = arrays["calibrate_scores"], arrays["calibrate_agrees"].astype(bool)
    ev = arrays["evaluate_scores"], arrays["evaluate_agrees"].astype(bool)
    free = [Candidate(v.block_index, 0.0, v.memory_bytes) for v in manifest.variants]
    own = [choose_threshold(cal[0][i], cal[1][i], target) for i in range(len(free))]
    best: dict[int, tuple[float, int]] = {}
    for i, variant in enumerate(manifest.variants):
        hit_rate = HitRates.at(cal[0][i], cal[1][i], own[i]).hit_rate
        best[variant.block_index] = max(best.get(variant.block_index, (-1.0, i)), (hit_rate, i))
    chosen = [i for _, (_, i) in sorted(best.items())]
    certified = dict(certified_exits([tuple(chosen)], free, cal, manifest.block_latency_s, target, inline=False).exits)
    tuned = [certified.get(i, math.inf) for i in chosen]
    result: dict[str, Any] = {"exits": [manifest.variants[i].key for i in chosen]}
    for label, thresholds in (("per_cache", [own[i] for i in chosen]), ("overall", list(tuned))):
        exits = list(zip(chosen, thresholds, strict=True))
        result[label] = {
            "thresholds": [t if math.isfinite(t) else None for t in thresholds],
            "calibrate": simulate(exits, free, *cal, manifest.block_latency_s, inline=False).model_dump(),
            "evaluate": simulate(exits, free, *ev, manifest.block_latency_s, inline=False).model_dump(),
        }
    return result


def latency_summary(seconds: list[float]) -> dict[str, float]:
    us = np.array(seconds) * 1e6
    return {"mean_us": float(us.mean()), "p50_us": float(np.percentile(us, 50)), "p99_us": float(np.percentile(us, 99))}


def summary(manifest: Manifest) -> dict[str, Any]:
    return {
        "blocks": list(manifest.blocks),
        "block_latency_us": [t * 1e6 for t in manifest.block_latency_s],
        "base_latency_us": manifest.base_latency_s * 1e6,
        "data": manifest.data.model_dump(),
        "settings": manifest.settings,
        "variants": [
            {
                "block": v.block,
                "variant": v.variant,
                "lookup_us": v.lookup_latency_s * 1e6,
                "memory_mb": v.memory_bytes / 1e6,
                "targets": {t: r.model_dump() for t, r in v.targets.items()},
            }
            for v in manifest.variants
        ],
    }


def composition_record(
    label: str, c: CompositionRecord, manifest: Manifest, measured: dict[str, Any]
) -> dict[str, Any]:
    blocks_sum_us = sum(manifest.block_latency_s) * 1e6
    return {
        "label": label,
        "method": c.method,
        "target": c.target,
        "alpha": c.alpha,
        "default": c.default and label == "built",
        "exits": [{"cache": e.key, "threshold": e.threshold} for e in c.exits],
        "memory_mb": c.memory_bytes / 1e6,
        "calibrate": c.calibrate.model_dump(),
        "expected": c.evaluate.model_dump() | {"speedup": blocks_sum_us / (c.evaluate.mean_latency_s * 1e6)},
        "meets_target": c.meets_target,
        "measured_sync": measured,
    }


def print_model(name: str, result: dict[str, Any]) -> None:
    m, whole, bare = result["manifest"], result["whole"], result["chain_without_caches"]
    print(
        f"\n== {name}: build {result['build']['wall_s']} s wall, {result['build']['cpu_s']} s CPU; over "
        f"{result['evaluate_rows']} evaluate rows, whole model mean {whole['mean_us']:.0f} µs / p50 "
        f"{whole['p50_us']:.0f} / p99 {whole['p99_us']:.0f}; bare chain mean {bare['mean_us']:.0f} / p50 "
        f"{bare['p50_us']:.0f} / p99 {bare['p99_us']:.0f}"
    )
    for target in sorted({c["target"] for c in result["compositions"]}, reverse=True):
        key = f"{target:g}"
        print(f"target {key}:   block/variant        sel hit  agree | softmax hit  agree | lookup µs  MB")
        for v in m["variants"]:
            sel, soft = v["targets"][key]["selector"], v["targets"][key]["softmax"]
            print(
                f"  {v['block']:>8}/{v['variant']:<11} {sel['hit_rate']:>7.3f} {sel['agreement']:.4f} | "
                f"{soft['hit_rate']:>11.3f} {soft['agreement']:.4f} | {v['lookup_us']:>9.0f} {v['memory_mb']:.3f}"
            )
        for c in (c for c in result["compositions"] if c["target"] == target):
            e, s = c["expected"], c["measured_sync"]
            print(
                f"  {c['label'][:12]:>12} {c['method']:>7}{'*' if c['default'] else ' '} expected "
                f"{e['mean_latency_s'] * 1e6:4.0f} µs ({e['speedup']:.2f}×) agree {e['agreement']:.4f} | sync p50 "
                f"{s['p50_us']:4.0f} µs ({whole['p50_us'] / s['p50_us']:.2f}× whole, "
                f"{bare['p50_us'] / s['p50_us']:.2f}× chain) p99 {s['p99_us']:.0f} agree {s['agreement']:.4f} | "
                f"{', '.join(x['cache'] for x in c['exits']) or 'none'}"
            )
        study = result["chain_study"][key]
        print(f"  chain study (lookups free) {' → '.join(study['exits'])}:")
        for label in ("per_cache", "overall"):
            ev, cal = study[label]["evaluate"], study[label]["calibrate"]
            print(
                f"    {label:>9} thresholds {study[label]['thresholds']}: agreement calibrate {cal['agreement']:.4f} "
                f"evaluate {ev['agreement']:.4f}, exits {[round(r, 3) for r in ev['exit_rates']]}"
            )


def plot(record: dict[str, Any], path: Path) -> None:
    """Per model: hit rates of each cache alone; speedups of each composition; the chained-threshold study."""
    models = record["models"]
    fig = figure(18, 4.4 * len(models))
    top = f"{max(record['settings']['targets']):g}"
    for row, (name, result) in enumerate(models.items()):
        variants = result["manifest"]["variants"]
        left = fig.add_subplot(len(models), 3, 3 * row + 1)
        positions = np.arange(len(variants))
        for offset, kind in ((-0.2, "selector"), (0.2, "softmax")):
            left.bar(positions + offset, [v["targets"][top][kind]["hit_rate"] for v in variants], 0.4, label=kind)
        left.set_xticks(positions, [f"{v['block']}\n{v['variant']}" for v in variants], fontsize=7)
        left.set_ylabel(f"hit rate at {top} agreement")
        left.set_title(f"{name}: each cache alone (evaluate split)")
        left.legend(fontsize=8)

        middle = fig.add_subplot(len(models), 3, 3 * row + 2)
        whole_p50, bare_p50 = result["whole"]["p50_us"], result["chain_without_caches"]["p50_us"]
        bars = [("bare chain", None, whole_p50 / bare_p50, 1.0, None)]
        for c in result["compositions"]:
            sync = c["measured_sync"]
            tag = f"{c['target']:g} {c['method']}\n{c['label']}"
            bars.append(
                (
                    tag,
                    c["expected"]["speedup"],
                    whole_p50 / sync["p50_us"],
                    bare_p50 / sync["p50_us"],
                    sync["agreement"],
                )
            )
        positions = np.arange(len(bars))
        kinds = ("expected (async lookups, mean)", "sync p50 vs whole model", "sync p50 vs bare chain")
        for k, (offset, kind) in enumerate(zip((-0.27, 0, 0.27), kinds, strict=True)):
            middle.bar(positions + offset, [b[1 + k] or 0 for b in bars], 0.27, label=kind)
        middle.axhline(1.0, color="black", linewidth=0.8)
        for p, bar in enumerate(bars):
            if bar[4] is not None:
                middle.annotate(f"{bar[4]:.3f}", (p, max(bar[1] or 0, bar[2], bar[3])), ha="center", fontsize=6)
        middle.set_xticks(positions, [b[0] for b in bars], fontsize=6, rotation=60, ha="right")
        middle.set_ylabel("speedup, batch 1")
        middle.set_title(f"{name}: compositions (labels: agreement measured)")
        middle.legend(fontsize=7, loc="lower left")

        right = fig.add_subplot(len(models), 3, 3 * row + 3)
        studies = result["chain_study"]
        positions = np.arange(len(studies))
        for offset, label in ((-0.2, "per_cache"), (0.2, "overall")):
            values = [studies[t][label]["evaluate"]["agreement"] for t in studies]
            right.bar(positions + offset, values, 0.4, label=f"{label.replace('_', '-')} thresholds")
        for p, target in enumerate(studies):
            right.hlines(float(target), p - 0.45, p + 0.45, color="black", linewidth=1)
        right.set_xticks(positions, [f"target {t}" for t in studies])
        right.set_ylim(min(float(t) for t in studies) - 0.02, 1.0)
        right.set_ylabel("agreement, evaluate split")
        right.set_title(f"{name}: best cache after every exit, chained")
        right.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
