"""Ebird's §VI-B check on this server's own stream workers: do N batches of M rows run side by side on N streams
cost what one batch of N·M rows does?

Ebird's GPU form rests on that premise: its FakeNet (a cuDNN convolution 50 times) finished 256 inferences in the
same time whether one worker ran them as one batch or up to 64 workers ran them concurrently, so the elastic
scheduler lets every idle stream start at once. This benchmark asks the same of a real model served the way
`adaserve.engine.streams` serves it: R rows (default 16) are split over N workers of batch M = R / N, each worker a
thread of one process with a CUDA stream of its own replaying `GraphedForward`'s CUDA graph of its size (captured
exactly as a server worker captures it). The threads wait at a barrier, each replays its graph once and synchronizes
its stream; the figure is the wall time from the barrier to the last stream done, the median of `--repeats`. Beside
it, one worker's batch of M rows alone: what each worker's share would cost if the GPU took streams one at a time.

    python -m benchmarks.stream_concurrency            # on a GPU machine; results/stream_concurrency.json
    .venv/bin/python -m benchmarks.stream_concurrency --device cpu --repeats 3   # a smoke run of the code path

On a CPU (`--device cpu`) the workers run eagerly on threads with no streams: a check that the script runs, whose
figures say nothing about a GPU.
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
from pathlib import Path
from typing import Any

import torch

from adaserve.config import TensorSpec
from adaserve.engine.streams import GraphedForward
from benchmarks.common import RESULTS, report_head, write_json
from benchmarks.packrat.models import REFERENCES


class Worker:
    """One stream worker: its stream and its graphed model of granularity `rows`, and a batch of inputs."""

    def __init__(self, model: torch.nn.Module, spec: TensorSpec, rows: int, device: torch.device) -> None:
        self.stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        self.inputs = torch.randn((rows, *spec.shape[1:]), device=device)
        self.forward: Any = model
        if self.stream is not None:
            self.forward = GraphedForward(model, rows, self.stream)
        self.run()  # captures the graphs (the server's warm-up)

    def run(self) -> None:
        with torch.inference_mode():
            if self.stream is None:
                self.forward(self.inputs)
                return
            with torch.cuda.stream(self.stream):
                self.forward(self.inputs)
            self.stream.synchronize()


def together_ms(workers: list[Worker]) -> float:
    """Every worker runs its batch once, all released at one barrier: ms until the last is done."""
    barrier = threading.Barrier(len(workers) + 1)
    done: list[float] = []

    def serve(worker: Worker) -> None:
        barrier.wait()
        worker.run()
        done.append(time.perf_counter())

    threads = [threading.Thread(target=serve, args=(worker,)) for worker in workers]
    for thread in threads:
        thread.start()
    barrier.wait()
    began = time.perf_counter()
    for thread in threads:
        thread.join()
    return (max(done) - began) * 1e3


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=["resnet50", "resnet18"], default="resnet50")
    parser.add_argument("--rows", type=int, default=16, help="rows split over the workers (a power of two)")
    parser.add_argument("--repeats", type=int, default=50, help="runs per split; the median is reported")
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--output", type=Path, default=RESULTS / "stream_concurrency.json")
    args = parser.parse_args()
    device = torch.device(args.device)
    reference = REFERENCES[args.model]
    torch.manual_seed(0)
    model = reference.build().eval().to(device)
    spec = TensorSpec(**reference.inputs[0])
    settings = {"model": reference.description, "rows": args.rows, "repeats": args.repeats, "device": args.device}
    report = report_head("stream_concurrency", settings)
    splits = []
    for workers in [n for n in (1, 2, 4, 8, 16) if n <= args.rows]:
        rows = args.rows // workers
        pool = [Worker(model, spec, rows, device) for _ in range(workers)]
        alone = statistics.median(_timed(pool[0].run) for _ in range(args.repeats))
        together = statistics.median(together_ms(pool) for _ in range(args.repeats))
        splits.append({"workers": workers, "rows_each": rows, "together_ms": together, "one_alone_ms": alone})
        print(f"{workers:2d} × {rows:2d} rows: together {together:7.3f} ms, one batch of {rows} alone {alone:7.3f} ms")
        del pool
    whole = splits[0]["together_ms"]
    for split in splits:
        split["vs_one_batch"] = split["together_ms"] / whole  # Ebird's premise: about 1
        split["vs_one_at_a_time"] = split["together_ms"] / (split["workers"] * split["one_alone_ms"])
    write_json({**report, "splits": splits}, args.output)
    return 0


def _timed(run: Any) -> float:
    began = time.perf_counter()
    run()
    return (time.perf_counter() - began) * 1e3


if __name__ == "__main__":
    raise SystemExit(main())
