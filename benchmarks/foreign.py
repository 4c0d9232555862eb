"""Servers of other projects, started beside adaserve for a benchmark: each from its own venv, in a session of its
own, up once it answers its readiness route, and stopped with every process it started.

Ray, KServe and TorchServe bind every interface (TorchServe its gRPC ports) whatever they are asked: run them only in
a benchmark that has a network namespace of its own (`common.rerun_in_own_network_namespace`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from benchmarks.common import ROOT, ROWS, tree_cpu_s
from benchmarks.perf_load import PerfAnalyzer
from benchmarks.serving_overhead import paired_table, perf_run
from tests.server_utils import EXAMPLES, ServerHandle

#: How long a foreign server may take to start and deploy its model (Ray: a cluster, then a deployment).
START_S = 240.0


def venv_python(venv: Path, script: str) -> Path:
    """The Python of `venv`; SystemExit naming the script that makes it when it is missing."""
    python = venv / "bin" / "python"
    if not python.is_file():
        raise SystemExit(f"{python} not found: run {script} first")
    return python


def version_of(python: Path, package: str) -> str:
    """`package`'s version in the venv of `python`."""
    code = f"import importlib.metadata as m; print(m.version({package!r}))"
    return subprocess.run([str(python), "-c", code], capture_output=True, text=True, check=True).stdout.strip()


def perf_shape(model: str) -> str:
    """perf_analyzer's `--shape` for an example model's input."""
    return "image:" + ",".join(str(n) for n in ROWS[model])


def example_artifact(model: str) -> Path:
    """The artifact adaserve serves for an example model, which the foreign server loads too."""
    return EXAMPLES / model / "1" / "model.pt2"


def save_description(adaserve: ServerHandle, model: str, route: str, path: Path) -> Path:
    """adaserve's answer to `GET /v2/models/{model}{route}` (its metadata; with "/config" its config) saved at
    `path`, so the foreign server describes the model as adaserve does."""
    with urllib.request.urlopen(f"http://{adaserve.http_url}/v2/models/{model}{route}", timeout=10) as answer:
        path.write_bytes(answer.read())
    return path


@contextlib.contextmanager
def foreign_server(
    command: list[str],
    log: Path,
    port: int,
    name: str,
    grpc_port: int | None = None,
    ready_path: str = "/v2/health/ready",
) -> Iterator[ServerHandle]:
    """Run `command` (a server listening for HTTP on 127.0.0.1:`port`, and for gRPC on `grpc_port` if it serves
    gRPC) until the block ends; entered once `GET ready_path` answers 200."""
    with log.open("wb") as out:
        process = subprocess.Popen(command, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + START_S
        while not _ready(port, ready_path):
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{name} did not start; see {log}")
            time.sleep(1.0)
        grpc_url = "" if grpc_port is None else f"127.0.0.1:{grpc_port}"
        yield ServerHandle(f"127.0.0.1:{port}", grpc_url, process.pid, log)
    finally:
        _stop_session(process)


def idle_cores(pid: int, seconds: float = 5.0) -> float:
    """Cores a server's process tree keeps busy while nobody sends it anything."""
    before = tree_cpu_s(pid)
    time.sleep(seconds)
    return (tree_cpu_s(pid) - before) / seconds


def _ready(port: int, path: str) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as answer:
            return bool(answer.status == 200)
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return False


def _stop_session(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM the server (Ray's driver shuts Serve and Ray down; KServe's stops uvicorn), then SIGKILL whatever of its
    session is left: it was started in a session of its own, so its group holds only what this benchmark started."""
    if process.poll() is None:
        os.kill(process.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=60)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


#: How perf_analyzer speaks to one server: the input's shape (None: the input data file gives it) and its other
#: arguments.
Speech = tuple[str | None, tuple[str, ...]]


def paired_perf_runs(
    perf: PerfAnalyzer,
    servers: Mapping[str, ServerHandle],
    order: tuple[str, ...],
    concurrencies: tuple[int, ...],
    repeats: int,
    request_count: int,
    model: str,
    speech: Mapping[str, Speech],
) -> list[dict[str, Any]]:
    """perf_analyzer against each server in `order` at each concurrency, `repeats` rounds, interleaved so that slow
    spells of the machine fall on both servers alike."""
    return [
        perf_run(
            perf,
            servers[name],
            "http",
            concurrency,
            repeat,
            request_count,
            name,
            model=model,
            shape=speech[name][0],
            extra=speech[name][1],
        )
        for repeat in range(repeats)
        for concurrency in concurrencies
        for name in order
    ]


def print_pair(report: dict[str, Any], output: Path, order: tuple[str, str], labels: tuple[str, str]) -> None:
    """The paired table, then each server's cores while idle (`report["idle_server_cores"]`)."""
    paired_table(report, order, labels)
    idle = report["idle_server_cores"]
    print(f"\nidle: {labels[1]} {idle[order[1]]:.2f} cores, {labels[0]} {idle[order[0]]:.2f} cores")
    print(f"wrote {output}")
