"""GATI on a GPU: the ResNet-style benchmark CNN at batch 1 (or `--batch`) with its cache set's default composition,
the lookups inline (`auto`) and on a side stream (`caches.lookup: stream`), beside the base model, on the same
requests.

The GPU machine has neither this repository's Fashion-MNIST nor its trained weights, so the run is in two steps:

    .venv/bin/python -m benchmarks.gati.gpu --pack DIR       # here, after benchmarks.gati.early_exit has built them
    python -m benchmarks.gati.gpu --packed DIR               # on the GPU machine

`--pack` copies what the run needs: the base network's weights, the cache set's manifest and the default
composition's caches, and the evaluate rows (held out from every fit and threshold); agreement is with the base's
labels, computed on the GPU.
The run builds the network from `benchmarks.gati.models` with those weights (so no exported program has to cross
torch versions), splits it into the blocks the cache set was built for, and interleaves, one request per row in a
fresh random order per row (`runs.interleave`): the base model whole as the server runs a CUDA model (one CUDA graph)
and eagerly, the base model's block chain, and `EarlyExit` with the lookups inline and on the side stream, each
block by block and as a worker with `cuda_graphs` runs it (each segment between two exits a CUDA graph). Every
method copies its row to the GPU and its answer back, inside the timing.

`--device cpu` runs the same on the lent machine's CPU, one intra-op thread, with the lookups inline and beside
the model (`caches.lookup: process`: the rest of the chain in a model process on another core) instead of the side
stream: the paper's CPU form, a lookup off the row's path, with cores to spare:

    python -m benchmarks.gati.gpu --packed DIR --device cpu --output benchmarks/results/gati_cpu16.json

Writes results/gati_gpu.json (or --output). `--plot` draws every results/gati_gpu*.json (one panel per file, in
batch order: mean, p50 and p99 per method) into results/gati_gpu.png, and every results/gati_cpu*.json into
gati_cpu.png; it needs no GPU.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

from adaserve.adaptive.gati.blocks import split_model
from adaserve.adaptive.gati.cacheset import MANIFEST, CacheSet, Manifest
from adaserve.adaptive.gati.runtime import EarlyExit, ExitPlan
from adaserve.datasets import load_fashion_mnist
from adaserve.engine.streams import GraphedForward, on_stream
from benchmarks.common import RESULTS, SCRATCH, command_line, figure, machine, write_json
from benchmarks.gati.models import CLASSES, NETS, ROW_SHAPE, WEIGHTS
from benchmarks.gati.runs import Method, early_exit, interleave, plain, summary

CACHE_SET = SCRATCH / "gati" / "repo" / "resnet" / "caches" / "v1"
TARGET = 0.99


def pack(directory: Path, weights: str) -> None:
    """Copy the run's inputs into `directory` (see the module docstring)."""
    directory.mkdir(parents=True, exist_ok=True)
    shutil.copy(WEIGHTS / weights, directory / "base.pt")
    cache_set = CacheSet(CACHE_SET, 1, Manifest.model_validate_json((CACHE_SET / MANIFEST).read_bytes()))
    exits = cache_set.composition(TARGET).exits
    caches = directory / "caches"
    caches.mkdir(exist_ok=True)
    shutil.copy(CACHE_SET / MANIFEST, caches / MANIFEST)
    for exit in exits:
        shutil.copy(CACHE_SET / f"{exit.key}.pt", caches / f"{exit.key}.pt")
    images, _ = load_fashion_mnist("test")
    rows = cache_set.scores()["evaluate_rows"]
    np.savez_compressed(directory / "rows.npz", x=images[rows].reshape(-1, *ROW_SHAPE).astype(np.float32))
    print(f"packed {weights}, {len(exits)} caches, {len(rows)} rows into {directory}")


def run(directory: Path, output: Path, limit: int, device: torch.device, batch: int) -> dict[str, Any]:
    module = NETS["resnet"].base()
    module.load_state_dict(torch.load(directory / "base.pt", weights_only=True))
    module = module.eval().to(device)
    manifest = Manifest.model_validate_json((directory / "caches" / MANIFEST).read_bytes())
    chain = split_model(module, manifest.blocks)
    cache_set = CacheSet(directory / "caches", 1, manifest)
    composition = cache_set.composition(TARGET)
    caches = [cache.to(device) for cache in cache_set.caches(composition)]
    plan = ExitPlan(TARGET, {cache.exit.block_index: cache for cache in caches})
    with np.load(directory / "rows.npz") as archive:
        rows = archive["x"][:limit]

    methods: dict[str, Method] = {}
    stream = torch.cuda.Stream(device) if device.type == "cuda" else None
    if stream is not None:
        graphed = GraphedForward(module.forward, batch, stream)

        def whole_graph(x: torch.Tensor) -> torch.Tensor:
            with torch.cuda.stream(stream):
                return graphed(x.to(device, non_blocking=True))[0].cpu()

        methods["base (CUDA graph)"] = plain(whole_graph)
    methods["base (eager)"] = plain(lambda x: module(x.to(device)).cpu())
    methods["base chain (eager)"] = plain(lambda x: chain.run(x.to(device)).cpu())
    if device.type == "cpu":
        torch.set_num_threads(1)  # one core for the model, one for the lookups: as a batch-1 worker of one thread
    for lookup in ("inline", "stream") if device.type == "cuda" else ("inline", "process"):
        runtime = EarlyExit(chain, [plan], 0.0, f"lookups {lookup}", lookup, device)
        with torch.inference_mode():
            runtime.warm_up(1, ROW_SHAPE, torch.float32)
        methods[f"gati ({lookup})"] = early_exit(runtime, CLASSES)
        if stream is not None:  # as a worker with cuda_graphs runs it: each segment between exits a graph
            graphs = runtime.for_worker(batch, stream)
            with torch.inference_mode(), on_stream(stream):
                graphs.warm_up(batch, ROW_SHAPE, torch.float32)
            methods[f"gati ({lookup}, CUDA graphs)"] = on(stream, early_exit(graphs, CLASSES))
    with torch.inference_mode():
        parts = [module(torch.from_numpy(rows[i : i + 500]).to(device)) for i in range(0, len(rows), 500)]
    labels = torch.cat(parts).argmax(1).cpu().numpy()
    samples = interleave(methods, rows, batch)
    base = next(iter(methods))  # the graph on a GPU
    base_mean_s = float(np.mean(samples[base].latency_s))
    results = {name: summary(s, labels, base_mean_s) for name, s in samples.items()}
    report = {
        "benchmark": "gati_gpu",
        "command": command_line(),
        "machine": machine(),
        "torch": torch.__version__,
        "composition": {"target": TARGET, "exits": [e.key for e in composition.exits]},
        "rows": len(rows),
        "batch": batch,
        "methods": results,
        "speedup_over": base,
    }
    write_json(report, output)
    print(json.dumps({k: v for k, v in report.items() if k != "machine"}, indent=1))
    return report


def on(stream: torch.cuda.Stream, method: Method) -> Method:
    """`method` run on `stream`, the one its graphs were captured on (as a worker replays them on its own)."""

    def run(rows: np.ndarray) -> tuple[list[tuple[float, int, str | None]], float]:
        with on_stream(stream):
            return method(rows)

    return run


def plot(reports: list[Path], output: Path) -> None:
    """One panel per result file, in batch order: mean, p50 and p99 latency per method, agreement in the labels."""
    loaded = sorted(
        ({**json.loads(path.read_text()), "file": path.stem} for path in reports), key=lambda r: r.get("batch", 1)
    )
    fig = figure(6 * len(loaded), 4.5)
    for column, report in enumerate(loaded, start=1):
        axes = fig.add_subplot(1, len(loaded), column)
        methods = report["methods"]
        positions = np.arange(len(methods))
        for offset, key in ((-0.27, "mean_ms"), (0.0, "p50_ms"), (0.27, "p99_ms")):
            axes.bar(positions + offset, [m[key] for m in methods.values()], 0.27, label=key.removesuffix("_ms"))
        labels = [f"{name}\nagree {m['agreement']:.4f}" for name, m in methods.items()]
        axes.set_xticks(positions, labels, fontsize=7, rotation=30, ha="right")
        axes.set_ylabel("latency per request (ms)")
        device = report["machine"].get("gpu") if report["file"].startswith("gati_gpu") else "CPU"
        title = f"{report['file']}: {device}, batch {report.get('batch', 1)}, {report['rows']} rows"
        axes.set_title(f"{title}, torch {report['torch']}", fontsize=8)
        axes.legend(fontsize=8)
    fig.suptitle("GATI, exits after " + ", ".join(loaded[0]["composition"]["exits"]), fontsize=9)
    fig.tight_layout()
    fig.savefig(output, dpi=110)
    print(f"wrote {output}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pack", type=Path, help="copy the inputs of a GPU run into this folder, and stop")
    parser.add_argument("--weights", default="resnet-base-b8a2855cada6.pt", help="the base's weights (--pack)")
    parser.add_argument("--packed", type=Path, help="run on the GPU from this folder")
    parser.add_argument("--rows", type=int, default=4000, help="evaluate rows to send (default: all 4,000)")
    parser.add_argument("--batch", type=int, default=1, help="rows per batch, one request each (default 1)")
    parser.add_argument(
        "--device", default="cuda", help="cuda (default); cpu: the lookups inline and beside the model (docstring)"
    )
    parser.add_argument("--output", type=Path, default=RESULTS / "gati_gpu.json")
    parser.add_argument("--plot", action="store_true", help="draw results/gati_{gpu,cpu}*.json into PNGs, and stop")
    args = parser.parse_args()
    if args.plot:
        for kind in ("gpu", "cpu"):
            plot(sorted(RESULTS.glob(f"gati_{kind}*.json")), RESULTS / f"gati_{kind}.png")
    elif args.pack:
        pack(args.pack, args.weights)
    elif args.packed:
        run(args.packed, args.output, args.rows, torch.device(args.device), args.batch)
    else:
        parser.error("give --pack DIR (here), --packed DIR (on the GPU machine) or --plot")


if __name__ == "__main__":
    main()
