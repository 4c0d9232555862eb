"""The paper's microbenchmark (§5.1): planned worker instances run without a server, each in its own process.

Every instance is a fresh Python process that places itself with the server's own `adaserve.engine.worker.place`
(CPU affinity and torch intra-op threads), loads the artifact as a worker does (`adaserve.repository.load_artifact`)
and, when told, runs a batch of random rows made by `adaserve.cpu.profiler.random_inputs` (what the profile was
measured on). Instances are kept per (threads, CPUs) and reused across batch sizes: the fat instance ⟨1, T, B⟩ is
the process with T threads on the CPUs the core allocator gives it, and a Packrat plan runs on the processes for its
workers' (threads, CPUs). A run gives every instance its rows at once and lasts until the last one has answered, so
the fat instance and a plan pay the same messaging.

The child side is `python -m benchmarks.packrat.inprocess JOB_JSON`: commands (`{"rows": n}`) arrive one JSON
line each on stdin, answers leave on a pipe of their own so that library output on stdout cannot corrupt them.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from adaserve.config import WorkerSpec
from adaserve.repository import ModelSpec
from benchmarks.common import ROOT

#: How long an instance may take to import torch and load the model.
START_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class RunTiming:
    """One run: wall time until every instance answered, and each instance's own compute time."""

    wall_s: float
    compute_s: tuple[float, ...]


class _Instance:
    """The parent's handle on one instance process."""

    def __init__(self, process: subprocess.Popen[bytes], results: IO[str], log: Path) -> None:
        self.process = process
        self.results = results
        self.log = log
        self.ready: dict[str, Any] = {}

    def send(self, rows: int) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write((json.dumps({"rows": rows}) + "\n").encode())
        self.process.stdin.flush()

    def receive(self, deadline: float) -> dict[str, Any]:
        """The next answer; RuntimeError with the instance's log when it failed, died or passed `deadline`."""
        left = deadline - time.monotonic()
        readable, _, _ = select.select([self.results], [], [], max(0.0, left))
        line = self.results.readline() if readable else ""
        message: dict[str, Any] = json.loads(line) if line else {}
        if "error" in message or not message:
            reason = message.get("error") or ("timed out" if not readable else f"exited ({self.process.poll()})")
            raise RuntimeError(f"instance {self.process.pid}: {reason}\n{self.log.read_text()[-2000:]}")
        return message

    def close(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()  # the child exits at end of input
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.results.close()


class Instances:
    """Instance processes of one model, started on first use per (threads, CPUs) and stopped by `close`."""

    def __init__(self, spec: ModelSpec, log_dir: Path, environment: dict[str, str]) -> None:
        self.spec = spec
        self.log_dir = log_dir
        self.environment = environment
        self._instances: dict[tuple[int, tuple[int, ...]], _Instance] = {}

    def __enter__(self) -> Instances:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def run(self, assignments: Sequence[tuple[WorkerSpec, int]], timeout_s: float) -> RunTiming:
        """Give each worker its rows at once; the time until the last one has finished them."""
        self._start_missing([worker for worker, _ in assignments])
        instances = [(self._instances[_key(worker)], rows) for worker, rows in assignments]
        if len({id(instance) for instance, _ in instances}) != len(instances):
            raise ValueError(f"two workers of one run share (threads, CPUs): {list(assignments)}")
        began = time.perf_counter()
        for instance, rows in instances:
            instance.send(rows)
        deadline = time.monotonic() + timeout_s
        compute = tuple(float(instance.receive(deadline)["compute_s"]) for instance, _ in instances)
        return RunTiming(time.perf_counter() - began, compute)

    def placements(self) -> list[dict[str, Any]]:
        """What each started instance reported: pid, intra-op threads and the CPUs it may run on."""
        return [instance.ready for instance in self._instances.values()]

    def close(self) -> None:
        for instance in self._instances.values():
            instance.close()
        self._instances.clear()

    def _start_missing(self, workers: Sequence[WorkerSpec]) -> None:
        """Start the instances not running yet all at once (each imports torch and loads the model on its own CPUs,
        seconds apiece: at T = 16 a plan can need 16 new ones), then wait until every one is ready."""
        missing = {_key(worker): worker for worker in workers if _key(worker) not in self._instances}
        launched = {key: self._launch(worker) for key, worker in missing.items()}
        deadline = time.monotonic() + START_TIMEOUT_S
        for key, instance in launched.items():
            self._instances[key] = instance  # closed with the others, ready or not
        for key, instance in launched.items():
            worker = missing[key]
            instance.ready = instance.receive(deadline)
            placed = instance.ready
            if placed["threads"] != worker.threads or (worker.cpus and placed["cpus"] != list(worker.cpus)):
                raise RuntimeError(f"instance placed as {placed}, planned {worker}")

    def _launch(self, worker: WorkerSpec) -> _Instance:
        job = {
            "artifact": str(self.spec.artifact),
            "config": self.spec.config.model_dump(mode="json"),
            "threads": worker.threads,
            "cpus": list(worker.cpus or ()),
        }
        read_fd, write_fd = os.pipe()
        cpus = "-".join(map(str, worker.cpus or ())) or "any"
        log = self.log_dir / f"instance-{self.spec.name}-t{worker.threads}-cpus{cpus}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, **self.environment, "OMP_NUM_THREADS": str(worker.threads)}
        with log.open("wb") as out:
            process = subprocess.Popen(
                [sys.executable, "-m", "benchmarks.packrat.inprocess", json.dumps({**job, "result_fd": write_fd})],
                cwd=ROOT,
                env=env,
                stdin=subprocess.PIPE,
                stdout=out,
                stderr=subprocess.STDOUT,
                pass_fds=(write_fd,),
            )
        os.close(write_fd)
        return _Instance(process, os.fdopen(read_fd, "r"), log)


def _key(worker: WorkerSpec) -> tuple[int, tuple[int, ...]]:
    """Instances are kept per (threads, CPUs)."""
    return worker.threads, tuple(worker.cpus or ())


def _serve(job: dict[str, Any]) -> int:
    """The child: place, load, report ready, then run one batch per command until stdin closes."""
    import torch

    from adaserve.config import ModelConfig
    from adaserve.cpu.profiler import random_inputs
    from adaserve.engine.worker import place
    from adaserve.repository import load_artifact

    with os.fdopen(job["result_fd"], "w", buffering=1) as out:
        try:
            config = ModelConfig.model_validate(job["config"])
            cpus = place(job["threads"], job["cpus"] or None)
            model = load_artifact(Path(job["artifact"]), config.max_batch_size)
            out.write(json.dumps({"pid": os.getpid(), "threads": torch.get_num_threads(), "cpus": cpus}) + "\n")
            inputs: dict[int, list[Any]] = {}
            with torch.inference_mode():
                for line in sys.stdin:
                    rows = int(json.loads(line)["rows"])
                    batch = inputs.setdefault(rows, random_inputs(config, rows, seed=rows))
                    began = time.perf_counter()
                    model(*batch)
                    out.write(json.dumps({"compute_s": time.perf_counter() - began}) + "\n")
        except Exception as exc:
            out.write(json.dumps({"error": f"{type(exc).__name__}: {exc}"}) + "\n")
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(_serve(json.loads(sys.argv[1])))
