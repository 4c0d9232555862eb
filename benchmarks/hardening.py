"""What an attack costs the other clients: a normal client's p99 latency during each attack against its p99 alone,
and the server's peak RSS, on one server with default settings (and `--allow-client-shm`).

Each attack is one row of issue 54, run in a process of its own (at nice 19: an attacker's CPU is not the
server's) at a bounded rate for `--seconds`, while a normal client in this process sends the example `mlp` one row
as JSON on a fresh connection every 20 ms and checks each answer. Before each attack the same client runs alone for
as long, so each ratio compares two phases a few seconds apart on the same server. The server's RSS is sampled
every 50 ms.

    .venv/bin/python -m benchmarks.hardening             # ~5 minutes; --quick: 2 s phases, under results/tmp/
    .venv/bin/python -m benchmarks.hardening --attacks gzip_bomb,slowloris

Bar (issue 54): for every attack, p99 within 2x of alone, peak RSS within 200 MB of alone, no normal request failed.
Writes `benchmarks/results/hardening.json` and `.png`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gzip
import http.client
import json
import multiprocessing as mp
import os
import resource
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator
from multiprocessing import shared_memory
from pathlib import Path
from typing import Any

import grpc
import numpy as np
from tritonclient.grpc import service_pb2

from benchmarks.common import RESULTS, SCRATCH, figure, finish_report, report_head
from tests.server_utils import ServerHandle, link_example, running_server

#: The normal client's pace, and the bars.
NORMAL_EVERY_S = 0.02
P99_BAR, RSS_BAR_BYTES = 2.0, 200 * 1024 * 1024
INFER = "/v2/models/mlp/infer"


# -- the attacks: each runs until `until` (time.monotonic()), at a bounded rate ------------------------------------
def post(server: ServerHandle, path: str, body: bytes, headers: dict[str, str] | None = None) -> int:
    """One request on a fresh connection; its status (0 when the connection failed)."""
    host, port = server.http_url.split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=60)
    try:
        connection.request("POST", path, body, headers or {})
        answer = connection.getresponse()
        answer.read()
        return answer.status
    except OSError:
        return 0
    finally:
        connection.close()


def in_threads(count: int, until: float, every_s: float, step: Callable[[], object]) -> None:
    """`step` in a loop on each of `count` threads, once per `every_s` at most, until `until`."""

    def loop() -> None:
        while time.monotonic() < until:
            began = time.monotonic()
            step()
            time.sleep(max(0.0, every_s - (time.monotonic() - began)))

    threads = [threading.Thread(target=loop) for _ in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def gzip_bomb(server: ServerHandle, until: float) -> None:
    """Row 1: 16 clients, each sending a 64 KB gzip body that inflates to 63 MiB of JSON numbers, 5 a second."""
    numbers = b'{"inputs":[{"name":"image","datatype":"FP32","shape":[1,784],"data":[' + b"1.0," * (63 << 18)
    bomb = gzip.compress(numbers + b"1.0]}]}", 9)
    in_threads(16, until, 0.2, lambda: post(server, INFER, bomb, {"Content-Encoding": "gzip"}))


def grpc_typed_contents(server: ServerHandle, until: float) -> None:
    """Row 1: 60 MB of typed fp32_contents in a gRPC request, from 2 clients, 2 a second each."""
    message = service_pb2.ModelInferRequest(model_name="mlp")
    tensor = message.inputs.add(name="image", datatype="FP32", shape=[19_200, 784])
    tensor.contents.fp32_contents.extend(np.zeros(15_000_000, np.float32))
    payload = message.SerializeToString()
    with grpc.insecure_channel(server.grpc_url, options=[("grpc.max_send_message_length", -1)]) as channel:
        infer = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer", lambda raw: raw, lambda raw: raw)

        def send() -> None:
            with contextlib.suppress(grpc.RpcError):
                infer(payload, timeout=60)

        in_threads(2, until, 0.5, send)


def gzip_members(server: ServerHandle, until: float) -> None:
    """Row 2: 4 MiB of empty gzip members (their cost grew with the square of their count), 2 clients, 5 a second."""
    members = gzip.compress(b"") * ((4 << 20) // len(gzip.compress(b"")))
    in_threads(2, until, 0.2, lambda: post(server, "/v2/repository/index", members, {"Content-Encoding": "gzip"}))


def held_bodies(server: ServerHandle, until: float) -> None:
    """Row 3: 30 connections at once, each sending all but the last byte of a 60 MiB body, then holding it; to a
    route the server's limit holds (64 MiB), as an inference route refuses what its model cannot take at once."""
    host, port = server.http_url.split(":")
    size, chunk = 60 << 20, b"1" * (1 << 20)

    def hold() -> None:
        with socket.create_connection((host, int(port)), timeout=5) as sock:
            try:
                head = f"POST /v2/repository/index HTTP/1.1\r\nhost: x\r\ncontent-length: {size}\r\n\r\n"
                sock.sendall(head.encode())
                for _ in range(size // len(chunk) - 1):
                    sock.sendall(chunk)
                sock.sendall(chunk[:-1])
            except OSError:
                return  # refused: its 503, then closed
            time.sleep(max(0.0, until - time.monotonic()))

    in_threads(30, until, until, hold)  # once each: `every_s` outlasts the attack


def slowloris(server: ServerHandle, until: float) -> None:
    """Row 4: 6,000 connections, each sending one header byte every 5 s; a connection closed is opened again."""
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    host, port = server.http_url.split(":")
    head = b"GET /v2/health/live HTTP/1.1\r\nhost: x\r\nx-a: " + b"a" * 10_000

    async def one(index: int) -> None:
        await asyncio.sleep(index * 0.001)
        while time.monotonic() < until:
            try:
                _, writer = await asyncio.open_connection(host, int(port))
            except OSError:
                await asyncio.sleep(0.5)
                continue
            with contextlib.suppress(OSError):
                for byte in head:
                    if time.monotonic() >= until or writer.is_closing():
                        break
                    writer.write(bytes([byte]))
                    await writer.drain()
                    await asyncio.sleep(5.0)
            writer.close()

    async def every() -> None:
        await asyncio.gather(*(one(index) for index in range(6000)))

    asyncio.run(every())


def shm_truncate(server: ServerHandle, until: float) -> None:
    """Row 6: register a shared memory region, truncate its file, infer from it, unregister; 20 a second."""
    block = shared_memory.SharedMemory(name=f"adaserve_hardening_bench_{os.getpid()}", create=True, size=1 << 16)
    descriptor = os.open(f"/dev/shm/{block.name}", os.O_RDWR)
    placed = {"shared_memory_region": "shrunk", "shared_memory_byte_size": 784 * 4}
    document = {"inputs": [{"name": "image", "datatype": "FP32", "shape": [1, 784], "parameters": placed}]}
    register = json.dumps({"key": block.name, "offset": 0, "byte_size": 784 * 4 * 4}).encode()

    def step() -> None:
        os.ftruncate(descriptor, 1 << 16)  # whole again, to be registered
        post(server, "/v2/systemsharedmemory/region/shrunk/register", register)
        os.ftruncate(descriptor, 100)
        post(server, INFER, json.dumps(document).encode())
        post(server, "/v2/systemsharedmemory/region/shrunk/unregister", b"")

    try:
        in_threads(1, until, 0.05, step)
    finally:
        os.close(descriptor)
        block.close()
        block.unlink()


def unread_streams(server: ServerHandle, until: float) -> None:
    """Row 7: 4 gRPC ModelStreamInfer calls over raw HTTP/2 that send requests and never grant flow control for the
    answers."""
    import h2.config
    import h2.connection

    host, port = server.grpc_url.split(":")
    message = service_pb2.ModelInferRequest(model_name="mlp")
    message.inputs.add(name="image", datatype="FP32", shape=[1, 784])
    message.raw_input_contents.append(np.zeros((1, 784), np.float32).tobytes())
    payload = message.SerializeToString()
    frame = b"\0" + struct.pack(">I", len(payload)) + payload
    path = "/inference.GRPCInferenceService/ModelStreamInfer"

    def stream() -> None:
        with socket.create_connection((host, int(port)), timeout=5) as sock:
            sock.settimeout(0.05)
            connection = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
            connection.initiate_connection()
            stream_id = connection.get_next_available_stream_id()
            headers = [(":method", "POST"), (":scheme", "http"), (":path", path), (":authority", server.grpc_url)]
            connection.send_headers(stream_id, [*headers, ("content-type", "application/grpc"), ("te", "trailers")])
            while time.monotonic() < until:
                with contextlib.suppress(Exception):  # out of send window: wait for the server
                    if connection.local_flow_control_window(stream_id) >= len(frame):
                        connection.send_data(stream_id, frame)
                with contextlib.suppress(OSError):
                    sock.sendall(connection.data_to_send())
                    data = sock.recv(1 << 16)
                    if data:
                        connection.receive_data(data)  # DATA is never acknowledged: no window update goes out

    in_threads(4, until, 0.0, stream)


def malformed(server: ServerHandle, until: float) -> None:
    """Row 8: names, versions and shapes no model has (a NUL, '²', [0, 2^63]), 4 clients, 50 a second each."""
    shape = {"inputs": [{"name": "image", "datatype": "FP32", "shape": [0, 2**63], "data": []}]}
    requests = [
        ("/v2/repository/models/%00/load", b"{}"),
        ("/v2/models/mlp/versions/%C2%B2/infer", b"{}"),
        (INFER, json.dumps(shape).encode()),
    ]
    sent = iter(range(1 << 62))
    in_threads(4, until, 0.02, lambda: post(server, *requests[next(sent) % len(requests)]))


def connection_burst(server: ServerHandle, until: float) -> None:
    """Row 9: 1,500 connections opened at once, every 2 s, then closed (the backlog was 100, not 2,048)."""
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    host, port = server.http_url.split(":")
    while time.monotonic() < until:
        sockets = []
        for _ in range(1500):
            sock = socket.socket()
            sock.setblocking(False)
            with contextlib.suppress(BlockingIOError, OSError):
                sock.connect((host, int(port)))
            sockets.append(sock)
        time.sleep(1.0)
        for sock in sockets:
            sock.close()
        time.sleep(1.0)


ATTACKS: dict[str, Callable[[ServerHandle, float], None]] = {
    "gzip_bomb": gzip_bomb,
    "grpc_typed_contents": grpc_typed_contents,
    "gzip_members": gzip_members,
    "held_bodies": held_bodies,
    "slowloris": slowloris,
    "shm_truncate": shm_truncate,
    "unread_streams": unread_streams,
    "malformed": malformed,
    "connection_burst": connection_burst,
}


# -- measuring ---------------------------------------------------------------------------------------------------
def normal_client(server: ServerHandle, seconds: float) -> dict[str, Any]:
    """One row to `mlp` on a fresh connection every NORMAL_EVERY_S for `seconds`: latencies, and failures (a status
    other than 200, or a connection that failed) with their first reason."""
    body = json.dumps(
        {"inputs": [{"name": "image", "datatype": "FP32", "shape": [1, 784], "data": [0.5] * 784}]}
    ).encode()
    latencies, failed, reason = [], 0, ""
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        began = time.monotonic()
        status = post(server, INFER, body)
        latencies.append(time.monotonic() - began)
        if status != 200:
            failed += 1
            reason = reason or f"status {status}"
        time.sleep(max(0.0, NORMAL_EVERY_S - (time.monotonic() - began)))
    return {
        "requests": len(latencies),
        "failed": failed,
        "first_failure": reason,
        "p50_ms": float(np.percentile(latencies, 50) * 1e3),
        "p99_ms": float(np.percentile(latencies, 99) * 1e3),
        "max_ms": float(max(latencies) * 1e3),
    }


@contextlib.contextmanager
def peak_rss(pid: int) -> Iterator[list[int]]:
    """The process's RSS sampled every 50 ms while the block runs; its peak is the list's one item after."""
    peak, stop = [0], threading.Event()

    def sample() -> None:
        while not stop.is_set():
            status = Path(f"/proc/{pid}/status").read_text()
            rss = int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmRSS:"))) * 1024
            peak[0] = max(peak[0], rss)
            stop.wait(0.05)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        yield peak
    finally:
        stop.set()
        sampler.join()


def phase(server: ServerHandle, seconds: float, attack: str | None) -> dict[str, Any]:
    """The normal client for `seconds`, alone or beside `attack` (started half a second before it)."""
    with peak_rss(server.pid) as peak:
        attacker = None
        if attack is not None:
            context = mp.get_context("spawn")
            until = time.monotonic() + seconds + 0.5
            attacker = context.Process(target=_attack, args=(attack, server, until))
            attacker.start()
            time.sleep(0.5)
        result = normal_client(server, seconds)
        if attacker is not None:
            attacker.join(timeout=120)
            if attacker.is_alive():
                attacker.kill()  # our own attack process, by its handle
                attacker.join()
    return {**result, "peak_rss_bytes": peak[0], "server_alive": _alive(server.pid)}


def _attack(name: str, server: ServerHandle, until: float) -> None:
    """An attack, at the lowest CPU priority: an attacker's CPU is its own machine's, not the server's, and on two
    cores an attack process at the server's priority took a share of the cores the other client's requests need."""
    os.nice(19)
    ATTACKS[name](server, until)


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def run(attacks: list[str], seconds: float, work: Path) -> dict[str, Any]:
    repository = work / "models"
    link_example(repository, "mlp")
    rows: dict[str, Any] = {}
    with running_server(repository, "--allow-client-shm") as server:
        for name in attacks:
            alone = phase(server, seconds, None)
            during = phase(server, seconds, name)
            p99_ratio = during["p99_ms"] / alone["p99_ms"]
            rss_growth = during["peak_rss_bytes"] - alone["peak_rss_bytes"]
            rows[name] = {
                "alone": alone,
                "attack": during,
                "p99_ratio": p99_ratio,
                "rss_growth_bytes": rss_growth,
                "bar_holds": p99_ratio <= P99_BAR
                and rss_growth <= RSS_BAR_BYTES
                and during["failed"] == 0
                and during["server_alive"],
            }
            print(
                f"{name:20s} p99 {alone['p99_ms']:7.2f} -> {during['p99_ms']:7.2f} ms ({p99_ratio:4.2f}x)  "
                f"RSS +{rss_growth / 2**20:6.1f} MiB  failed {during['failed']}",
                flush=True,
            )
            if not during["server_alive"]:
                break
    return rows


def plot(report: dict[str, Any], path: Path) -> None:
    names = list(report["attacks"])
    ratios = [report["attacks"][name]["p99_ratio"] for name in names]
    growth = [report["attacks"][name]["rss_growth_bytes"] / 2**20 for name in names]
    fig = figure(11, 4.5)
    left, right = fig.subplots(1, 2)
    left.barh(names, ratios, color=["tab:green" if r <= P99_BAR else "tab:red" for r in ratios])
    left.axvline(P99_BAR, color="black", linestyle="--", linewidth=1)
    left.set_xlabel("normal client's p99, attack / alone (bar: 2x)")
    right.barh(names, growth, color=["tab:green" if g <= RSS_BAR_BYTES / 2**20 else "tab:red" for g in growth])
    right.axvline(RSS_BAR_BYTES / 2**20, color="black", linestyle="--", linewidth=1)
    right.set_xlabel("server's peak RSS, attack - alone (MiB; bar: 200)")
    right.set_yticks([])
    fig.suptitle("adaserve under attack (issue 54), example mlp, default settings")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def _print(report: dict[str, Any], path: Path) -> None:
    """The result as a Markdown table: each attack's normal p99 alone and during it, the server's RSS growth."""
    print("| attack | p99 alone (ms) | p99 during (ms) | ratio | peak RSS growth (MiB) | normal failed | bar |")
    print("|---|---|---|---|---|---|---|")
    for name, row in report["attacks"].items():
        alone, during = row["alone"], row["attack"]
        print(
            f"| {name} | {alone['p99_ms']:.2f} | {during['p99_ms']:.2f} | {row['p99_ratio']:.2f}x | "
            f"{row['rss_growth_bytes'] / 2**20:.1f} | {during['failed']} of {during['requests']} | "
            f"{'holds' if row['bar_holds'] else '**missed**'} |"
        )
    held = sum(row["bar_holds"] for row in report["attacks"].values())
    print(
        f"\nbar (p99 within 2x of alone, RSS within 200 MB, none failed) holds for {held} of {len(report['attacks'])}"
    )
    print(f"wrote {path}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--attacks", default=",".join(ATTACKS), help="comma-separated, of: " + ", ".join(ATTACKS))
    parser.add_argument("--seconds", type=float, help="each phase's length (default 15; 2 with --quick)")
    parser.add_argument("--quick", action="store_true", help="short phases, written under benchmarks/results/tmp/")
    parser.add_argument("--output", type=Path)
    args = parser.parse_args()
    attacks = args.attacks.split(",")
    unknown = sorted(set(attacks) - set(ATTACKS))
    if unknown:
        parser.error(f"unknown attacks {unknown}; they are: {', '.join(ATTACKS)}")
    seconds = args.seconds or (2.0 if args.quick else 15.0)
    output = args.output or (SCRATCH / "hardening-quick.json" if args.quick else RESULTS / "hardening.json")
    work = SCRATCH / "hardening"
    work.mkdir(parents=True, exist_ok=True)
    report = report_head(
        "hardening", {"attacks": attacks, "phase_s": seconds, "normal_every_s": NORMAL_EVERY_S, "model": "mlp"}
    )
    report["attacks"] = run(attacks, seconds, work / str(os.getpid()))
    return finish_report(report, output, plot, _print)


if __name__ == "__main__":
    raise SystemExit(main())
