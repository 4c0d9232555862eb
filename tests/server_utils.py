"""Run a real `adaserve serve` in a subprocess on loopback for tests, and build small test repositories.

Servers listen on 127.0.0.1 only, on ports the OS picks free, and are stopped by their PID.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import torch
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import yaml
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples" / "models"


@dataclass(frozen=True)
class ServerHandle:
    http_url: str  # "127.0.0.1:PORT", as tritonclient takes it
    grpc_url: str
    pid: int
    log: Path


class Clients:
    """The tritonclient clients a test opens, closed together when it ends (the `clients` fixture, or a `with`
    block), in its thread.

    Why: any error tritonclient raises puts its client in a reference cycle (the traceback holds the frames that
    hold the client), so a client left open outlives its test and is finalized by the cyclic garbage collector on
    whatever thread allocates next. Its `__del__` then calls `close()`, which waits on a gevent pool from that
    foreign thread; on a gevent resolver thread this raises (gevent#1961: '_Threadlocal' object has no attribute
    'loop') and leaves the socket unclosed, an unraisable exception that failed an unrelated test in CI (stop 46 of
    test_packrat). A client closed explicitly has a harmless `__del__`."""

    def __init__(self) -> None:
        self._stack = contextlib.ExitStack()

    def http(self, url: str, **options: Any) -> httpclient.InferenceServerClient:
        return self._stack.enter_context(httpclient.InferenceServerClient(url, **options))

    def grpc(self, url: str, **options: Any) -> grpcclient.InferenceServerClient:
        return self._stack.enter_context(grpcclient.InferenceServerClient(url, **options))

    def of(self, server: ServerHandle, protocol: str) -> Any:
        """A client of `server` over `protocol`, "http" or "grpc"."""
        if protocol not in ("http", "grpc"):
            raise ValueError(f"no tritonclient protocol {protocol!r}")
        return self.http(server.http_url) if protocol == "http" else self.grpc(server.grpc_url)

    def close(self) -> None:
        """Closes every client opened here (all of them, even if one's close raises)."""
        self._stack.close()

    def __enter__(self) -> Clients:
        return self

    def __exit__(self, *exception: object) -> None:
        self.close()


#: Tests that need a GPU (CI has none; a lent GPU machine runs them).
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def logged_errors(server: ServerHandle) -> int:
    """How many error lines the server has logged so far."""
    return sum('"level": "error"' in line for line in server.log.read_text().splitlines())


def logged_serving(server: ServerHandle) -> bool:
    """Whether the server has logged that it serves (its models loaded: it is ready)."""
    return '"msg": "serving"' in server.log.read_text()


def worker_pids(client: httpclient.InferenceServerClient, model: str) -> list[int]:
    """The PIDs of a served model's workers, as its config's `workers` parameter lists them."""
    workers = json.loads(client.get_model_config(model)["parameters"]["workers"]["string_value"])
    return [w["pid"] for w in workers]


def restarts(server: ServerHandle, model: str) -> float:
    """`adaserve_worker_restarts_total` of a model, from /metrics."""
    return metric(server, f'adaserve_worker_restarts_total{{model="{model}"')


def metric(server: ServerHandle, series: str) -> float:
    """The value of the first /metrics line that starts with `series` (a name, and labels or their start)."""
    return metrics(server, series)[0]


def metrics(server: ServerHandle, *series: str) -> list[float]:
    """The value of each series, as `metric` finds it, from one scrape: values that hold at one moment."""
    with urllib.request.urlopen(f"http://{server.http_url}/metrics", timeout=10) as response:
        lines = response.read().decode().splitlines()
    values = []
    for start in series:
        found = next((line for line in lines if line.startswith(start)), None)
        if found is None:
            raise AssertionError(f"no {start} in /metrics")
        values.append(float(found.rsplit(" ", 1)[1]))
    return values


def free_ports(count: int) -> list[int]:
    """`count` distinct loopback ports, free now: all are held until all are picked, or two picks could repeat."""
    with contextlib.ExitStack() as stack:
        sockets = [stack.enter_context(socket.socket()) for _ in range(count)]
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [int(sock.getsockname()[1]) for sock in sockets]


def free_port() -> int:
    return free_ports(1)[0]


def without_packages(directory: Path, *names: str) -> dict[str, str]:
    """An environment for a subprocess (and every process it starts) in which importing any of the top-level
    packages `names` fails as it does when they are not installed: stand-ins that raise, first on PYTHONPATH."""
    for name in names:
        (directory / name).mkdir(parents=True, exist_ok=True)
        (directory / name / "__init__.py").write_text(
            f"raise ModuleNotFoundError({f'No module named {name!r} (blocked by the test)'!r}, name={name!r})\n"
        )
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(directory), str(ROOT)])}


@contextlib.contextmanager
def running_server(
    repository: Path,
    *extra_args: str,
    ready_timeout_s: float = 180.0,
    https: ssl.SSLContext | None = None,
    env: dict[str, str] | None = None,
    ports: tuple[int, int] | None = None,
    pass_fds: tuple[int, ...] = (),
) -> Iterator[ServerHandle]:
    """Start `adaserve serve` on `repository`, wait until it is ready, stop it (SIGTERM, then SIGKILL) after.
    `https`: the server's HTTP is TLS, and readiness is asked with this client context; `env`: the server's
    environment (default: this process's); `ports`: its HTTP and gRPC ports (default: free ones). On ports given,
    which other servers may share (`--reuse-port`), another server could answer the readiness endpoint: readiness
    is read from this server's own log instead. `pass_fds`: descriptors it inherits."""
    http_port, grpc_port = ports or free_ports(2)
    log = repository.parent / f"server-{http_port}.log"
    for copy in itertools.count(2):  # servers sharing a port each keep a log of their own
        if not log.exists():
            break
        log = repository.parent / f"server-{http_port}-{copy}.log"
    command = serve_command(repository, http_port, grpc_port, *extra_args)
    with log.open("wb") as out:
        process = subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, pass_fds=pass_fds
        )
    handle = ServerHandle(f"127.0.0.1:{http_port}", f"127.0.0.1:{grpc_port}", process.pid, log)
    try:
        if ports is None:
            _wait_ready(handle, process, ready_timeout_s, https)
        else:
            wait_until_ready(handle, process, ready_timeout_s, lambda: logged_serving(handle))
        yield handle
    finally:
        stop_server(process)


def serve_command(repository: Path, http_port: int, grpc_port: int, *extra_args: str) -> list[str]:
    """`adaserve serve` on `repository`, listening on 127.0.0.1 only."""
    return [
        sys.executable,
        "-m",
        "adaserve",
        "serve",
        "--model-repository",
        str(repository),
        "--host",
        "127.0.0.1",
        "--http-port",
        str(http_port),
        "--grpc-port",
        str(grpc_port),
        *extra_args,
    ]


def stop_server(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        os.kill(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.kill(process.pid, signal.SIGKILL)
            process.wait()


def _wait_ready(
    handle: ServerHandle, process: subprocess.Popen[bytes], timeout_s: float, https: ssl.SSLContext | None = None
) -> None:
    url = f"{'https' if https else 'http'}://{handle.http_url}/v2/health/ready"

    def ready() -> bool:
        try:
            with urllib.request.urlopen(url, timeout=2, context=https) as response:
                return bool(response.status == 200)
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            return False

    wait_until_ready(handle, process, timeout_s, ready)


def wait_until_ready(
    handle: ServerHandle, process: subprocess.Popen[bytes], timeout_s: float, ready: Callable[[], bool]
) -> None:
    """Poll `ready` until it says so; the server exiting first, or the time running out, raises with its log."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"server exited with {process.returncode}:\n{handle.log.read_text()[-3000:]}")
        if ready():
            return
        time.sleep(0.2)
    raise TimeoutError(f"server not ready after {timeout_s} s:\n{handle.log.read_text()[-3000:]}")


def write_config(directory: Path, config: dict[str, object]) -> None:
    """A model with no `workers` line does not profile in the background unless the test asks for it
    (`packrat.background_profile`): a profile that settles mid-test would switch the worker set under the test."""
    if "workers" not in config:
        packrat = config.get("packrat") or {}
        assert isinstance(packrat, dict)
        config = {**config, "packrat": {"background_profile": False, **packrat}}
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.yaml").write_text(yaml.safe_dump(config))


#: What serving the examples writes into their folders (`link_example` leaves it behind).
LEFT_BEHIND = ("profile.json", "stream_profile.json", "footprint.json")


def link_example(repository: Path, name: str, as_name: str | None = None, **overrides: object) -> Path:
    """A model of the example repository in `repository`, its artifacts linked, its other files (labels) copied
    (the server reads class names only from files inside the repository) and its config overridden. The profiles
    and footprint.json that serving the examples wrote are left behind: a test's model is profiled only if the test
    says so, and its footprint is its own."""
    source, target = EXAMPLES / name, repository / (as_name or name)
    config = yaml.safe_load((source / "config.yaml").read_text())
    config.update(overrides, name=as_name or name)
    write_config(target, config)
    for entry in source.iterdir():
        if entry.is_file() and entry.name not in ("config.yaml", *LEFT_BEHIND):
            shutil.copyfile(entry, target / entry.name)
        elif entry.is_dir():
            (target / entry.name).mkdir(exist_ok=True)
            for artifact in entry.iterdir():
                (target / entry.name / artifact.name).symlink_to(artifact)
    return target


class Spin(torch.nn.Module):
    """A model that is slow on purpose: `rounds` matmuls of 256×256 per row, deterministic compute."""

    def __init__(self, rounds: int) -> None:
        super().__init__()
        self.rounds = rounds
        self.weight = torch.nn.Parameter(torch.eye(256) * 0.5, requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        state = x.repeat(1, 64)
        for _ in range(self.rounds):
            state = torch.tanh(state @ self.weight)
        return x + 0 * state[:, :4]


def spin_rounds(seconds: float) -> int:
    """How many `Spin` rounds take about `seconds` on a row here now: a model slow by a time, not by a count of
    rounds, which took 0.13 s on one VM and 1.4 s on another."""
    spin = torch.jit.script(Spin(2_000))
    row = torch.ones(1, 4)
    spin(row)  # the first call compiles
    started = time.perf_counter()
    spin(row)
    return max(1, round(2_000 * seconds / (time.perf_counter() - started)))


def write_slow_model(repository: Path, name: str = "slow", *, rounds: int = 400, **overrides: object) -> Path:
    """A TorchScript model (input `x` FP32 [-1, 4], output `y` = x) that takes tens of ms per batch."""
    config: dict[str, object] = {
        "name": name,
        "max_batch_size": 1,
        "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 4]}],
        "outputs": [{"name": "y", "datatype": "FP32", "shape": [-1, 4]}],
        "workers": [{"batch": 1, "threads": 1}],
    }
    config.update(overrides)
    directory = repository / name
    write_config(directory, config)
    (directory / "1").mkdir(exist_ok=True)
    torch.jit.save(torch.jit.script(Spin(rounds)), str(directory / "1" / "model.pt"))
    return directory


class Fussy(torch.nn.Module):
    """Doubles its input, and refuses negative values: a model error that depends on the request."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if bool((x < 0).any()):
            raise ValueError("negative input")
        return x * 2


def write_fussy_model(repository: Path, name: str = "fussy", **overrides: object) -> Path:
    """A TorchScript model (input `x` FP32 [-1, 4], output `y` = 2x) that raises on negative input."""
    config: dict[str, object] = {
        "name": name,
        "max_batch_size": 4,
        "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 4]}],
        "outputs": [{"name": "y", "datatype": "FP32", "shape": [-1, 4]}],
        "workers": [{"batch": 4, "threads": 1}],
        "batching": {"policy": "fixed-timeout", "max_queue_delay_us": 200_000},
    }
    config.update(overrides)
    directory = repository / name
    write_config(directory, config)
    (directory / "1").mkdir(exist_ok=True)
    torch.jit.save(torch.jit.script(Fussy()), str(directory / "1" / "model.pt"))
    return directory


def write_broken_model(repository: Path, name: str = "broken") -> Path:
    """A valid config beside an artifact that is not one: the model fails to load with a clear cause."""
    broken = repository / name
    write_config(
        broken,
        {
            "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 4]}],
            "outputs": [{"name": "y", "datatype": "FP32", "shape": [-1, 4]}],
        },
    )
    (broken / "1").mkdir()
    (broken / "1" / "model.pt2").write_bytes(b"this is not a torch.export archive")
    return broken


def process_stat(pid: int) -> list[str] | None:
    """Fields of /proc/PID/stat after the command's name (state first); None once the process is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except FileNotFoundError:
        return None


def parent_pid(pid: int) -> int | None:
    """The parent's PID, or None for a process already gone."""
    fields = process_stat(pid)
    return None if fields is None else int(fields[1])


def renice_tree(pid: int, niceness: int) -> None:
    """Set the niceness of every thread of `pid` and of its descendants (Linux nice values are per thread)."""
    for task in Path(f"/proc/{pid}/task").glob("*"):
        with contextlib.suppress(ProcessLookupError, FileNotFoundError):
            os.setpriority(os.PRIO_PROCESS, int(task.name), niceness)
            for child in (task / "children").read_text().split():
                renice_tree(int(child), niceness)


class OtlpReceiver(ThreadingHTTPServer):
    """An OTLP/HTTP trace receiver on loopback (what a server in OpenTelemetry trace mode exports to): keeps every
    span it is sent with its resource's attributes, or with `keep=False` only counts the spans (a benchmark's
    collector, which should cost the machine little)."""

    def __init__(self, keep: bool = True) -> None:
        super().__init__(("127.0.0.1", 0), _OtlpHandler)
        self.keep = keep
        self.spans: list[tuple[dict[str, Any], Any]] = []
        self.exports = 0
        self.lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/v1/traces"

    def wait_for(self, request_id: str, count: int, timeout_s: float = 30.0) -> list[Any]:
        """The spans of a request, once `count` have come."""
        deadline = time.monotonic() + timeout_s
        while True:
            with self.lock:
                mine = [span for _, span in self.spans if span_attributes(span).get("request_id") == request_id]
            if len(mine) >= count:
                return mine
            if time.monotonic() > deadline:
                raise AssertionError(f"{len(mine)} spans of {request_id} after {timeout_s} s, expected {count}")
            time.sleep(0.1)


class _OtlpHandler(BaseHTTPRequestHandler):
    server: OtlpReceiver

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        with self.server.lock:
            self.server.exports += 1
        if self.server.keep:
            request = ExportTraceServiceRequest.FromString(body)
            with self.server.lock:
                for resource_spans in request.resource_spans:
                    resource = span_attributes(resource_spans.resource)
                    for scope_spans in resource_spans.scope_spans:
                        self.server.spans += [(resource, span) for span in scope_spans.spans]
        answer = ExportTraceServiceResponse().SerializeToString()
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, format: str, *args: Any) -> None:
        pass


def span_attributes(item: Any) -> dict[str, Any]:
    """An OTLP span's (or resource's) attributes as a dict."""
    values = {}
    for attribute in item.attributes:
        kind = attribute.value.WhichOneof("value")
        values[attribute.key] = getattr(attribute.value, kind) if kind else None
    return values


@contextlib.contextmanager
def otlp_receiver(keep: bool = True) -> Iterator[OtlpReceiver]:
    """An OtlpReceiver serving on a thread of this process while the block runs."""
    server = OtlpReceiver(keep)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def openssl(*args: str | Path) -> None:
    subprocess.run(["openssl", *map(str, args)], check=True, capture_output=True)


def make_certificates(directory: Path) -> Path:
    """Certificates for TLS tests, made by openssl into `directory` (returned): a CA `ca`, the server's `server`
    for 127.0.0.1 and localhost and a client's `client` signed by it, and `stranger`, a client's signed by another
    CA (`other-ca`). Each NAME as NAME.pem and NAME.key."""
    _make_ca(directory, "ca")
    _make_ca(directory, "other-ca")
    _make_certificate(directory, "server", "ca", "IP:127.0.0.1,DNS:localhost")
    _make_certificate(directory, "client", "ca")
    _make_certificate(directory, "stranger", "other-ca")
    return directory


def _make_ca(directory: Path, name: str) -> None:
    key, certificate = directory / f"{name}.key", directory / f"{name}.pem"
    openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-days", "2",
            "-subj", f"/CN={name}", "-keyout", key, "-out", certificate)  # fmt: skip


def _make_certificate(directory: Path, name: str, ca: str, names: str = "") -> None:
    """`name`.pem and .key, signed by the CA `ca`; `names`: its subjectAltName."""
    key, request, certificate = (directory / f"{name}.{kind}" for kind in ("key", "csr", "pem"))
    openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-subj", f"/CN={name}",
            "-keyout", key, "-out", request)  # fmt: skip
    extensions = directory / f"{name}.ext"
    extensions.write_text(f"subjectAltName={names}\n" if names else "")
    openssl("x509", "-req", "-in", request, "-CA", directory / f"{ca}.pem", "-CAkey", directory / f"{ca}.key",
            "-CAcreateserial", "-days", "2", "-out", certificate, "-extfile", extensions)  # fmt: skip
