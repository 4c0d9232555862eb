"""What compressing requests and answers costs and saves: the same requests with and without gzip, over loopback and
over links of 1 Gbit/s and 100 Mbit/s.

Real Fashion-MNIST test images (Debian's `dataset-fashion-mnist`): the example `mlp` at batch 1 (binary tensor
data) and the example `cnn` at batch 16 (binary, and as JSON numbers over HTTP), sent by tritonclient at concurrency
1 over HTTP and gRPC, each plain and with gzip both ways (HTTP: `request_compression_algorithm` and
`response_compression_algorithm`, answered at the server's `content_coding.COMPRESSION_LEVEL`; gRPC: the client's
`compression_algorithm` and a server started with `--grpc-infer-response-compression-level low`, gRPC's own choice
of algorithm). Plain cases go to a plain server, compressed ones to the compressing one; both serve the same
repository. tritonclient compresses a request with Python's gzip at its default level (9): that is the client's
cost, inside the latency measured here.

The links are shaped in a network namespace of the benchmark's own (`unshare -rn`, so no privileges and nothing
outside it is touched): loopback's MTU set to Ethernet's 1,500 bytes and a token bucket (`tc qdisc ... tbf`) at the
link's rate. Both directions share the bucket, which on a closed loop at concurrency 1 is what a full-duplex link of
that rate gives. Bytes on the wire are loopback's own counter in that namespace, so they are exactly this traffic.

It also times zlib at levels 1, 6 and 9 on each case's HTTP request body, in-process: why the server answers at
level 1.

    .venv/bin/python -m benchmarks.http_compression     # ~6 minutes; --quick for a smoke run

Writes `benchmarks/results/http_compression.json` and `.png` (with --quick: under `benchmarks/results/tmp/`).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import time
import zlib
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from adaserve.datasets import load_fashion_mnist
from adaserve.engine.machine_cpu import process_cpu_s
from adaserve.server.content_coding import COMPRESSION_LEVEL
from benchmarks.common import (
    RESULTS,
    ROWS,
    SCRATCH,
    TreeCPU,
    figure,
    finish_report,
    load_average,
    report_head,
    rerun_in_own_network_namespace,
)
from tests.server_utils import ServerHandle, link_example, running_server

#: Link rates in Mbit/s; None: loopback as it is.
LINKS: tuple[int | None, ...] = (None, 1000, 100)
CODINGS = ("none", "gzip")
ZLIB_LEVELS = (1, 6, 9)
#: What each run records, and each cell keeps the median of.
RUN_FIGURES = (
    "p50_ms",
    "mean_ms",
    "p99_ms",
    "frontend_cpu_us_per_request",
    "server_cpu_us_per_request",
    "wire_bytes_per_request",
)


@dataclass(frozen=True)
class Case:
    name: str
    model: str
    protocol: str
    rows: int
    binary: bool


CASES = (
    Case("mlp b1 binary", "mlp", "http", 1, True),
    Case("cnn b16 binary", "cnn", "http", 16, True),
    Case("cnn b16 JSON", "cnn", "http", 16, False),
    Case("mlp b1", "mlp", "grpc", 1, True),
    Case("cnn b16", "cnn", "grpc", 16, True),
)


def main() -> int:
    args = _parse_args()
    outer = rerun_in_own_network_namespace("benchmarks.http_compression")  # a loopback of our own to shape
    if outer is not None:
        return outer
    subprocess.run(["ip", "link", "set", "lo", "mtu", "1500"], check=True)
    output: Path = args.output or (
        SCRATCH / "http_compression-quick.json" if args.quick else RESULTS / "http_compression.json"
    )
    repository = SCRATCH / "http_compression" / "repo"
    shutil.rmtree(repository, ignore_errors=True)
    for model in ROWS:
        link_example(repository, model)
    images, _ = load_fashion_mnist("test")
    settings = {
        "requests_per_run": args.requests,
        "repeats": args.repeats,
        "links_mbit": list(LINKS),
        "server_zlib_level": COMPRESSION_LEVEL,
        "client": "tritonclient, one connection, concurrency 1",
        "mtu": 1500,
    }
    report = report_head("http_compression", settings)
    report["zlib_levels"] = [_zlib_levels(case, images) for case in CASES if case.protocol == "http"]
    with (
        running_server(repository) as plain,
        running_server(repository, "--grpc-infer-response-compression-level", "low") as compressing,
    ):
        runs = []
        for repeat in range(args.repeats):
            for link in LINKS:
                _shape(link)
                for case in CASES:
                    for coding in CODINGS:
                        server = plain if coding == "none" else compressing
                        runs.append(_run(server, case, coding, link, repeat, images, args.requests))
                        _progress(runs[-1])
        _shape(None)
    report["runs"] = runs
    report["load_end"] = load_average()
    report["cells"] = _cells(runs)
    return finish_report(report, output, _plot, _print)


def _parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="one repeat of 30 requests (a smoke run)")
    parser.add_argument("--repeats", type=int, help="runs of each cell, interleaved (default 3; --quick 1)")
    parser.add_argument("--requests", type=int, help="requests per run (default 300; --quick 30)")
    parser.add_argument("--output", type=Path, help="result JSON (the PNG goes beside it)")
    args = parser.parse_args()
    args.repeats = args.repeats or (1 if args.quick else 3)
    args.requests = args.requests or (30 if args.quick else 300)
    return args


def _shape(mbit: int | None) -> None:
    """Loopback at `mbit`, or unshaped. The token bucket holds an eighth of a millisecond's bytes, and at least two
    packets: a larger bucket lets a whole request of tens of kilobytes through at once (one of a millisecond's
    bytes at 1 Gbit/s did, and that link measured as loopback), a smaller one costs rate on the kernel's timers."""
    subprocess.run(["tc", "qdisc", "del", "dev", "lo", "root"], check=False, capture_output=True)
    if mbit is not None:
        burst = max(2 * 1514, mbit * 1_000_000 // 8 // 8000)
        rule = ["rate", f"{mbit}mbit", "burst", str(burst), "latency", "2s"]
        subprocess.run(["tc", "qdisc", "add", "dev", "lo", "root", "tbf", *rule], check=True)


def _loopback_bytes() -> int:
    """Bytes loopback has carried in this namespace (each byte sent is counted once)."""
    for line in Path("/proc/net/dev").read_text().splitlines():
        name, _, counters = line.partition(":")
        if name.strip() == "lo":
            return int(counters.split()[0])
    raise RuntimeError("no loopback in /proc/net/dev")


def _batches(case: Case, images: np.ndarray, count: int) -> list[np.ndarray]:
    """`count` batches of consecutive test images (`load_fashion_mnist`'s: FP32 in [0, 1], as the example models
    were trained)."""
    rows = images[: count * case.rows].reshape(count, case.rows, *ROWS[case.model])
    return list(rows)


def _run(
    server: ServerHandle, case: Case, coding: str, link: int | None, repeat: int, images: np.ndarray, count: int
) -> dict[str, Any]:
    batches = _batches(case, images, count)
    send, client = _sender(server, case, coding)
    with client:
        send(batches[0])  # connect and warm up, not counted
        cpu = TreeCPU(server.pid)
        cpu_before, frontend_before, wire_before = cpu.sample(), process_cpu_s(server.pid), _loopback_bytes()
        latencies = []
        for batch in batches:
            began = time.perf_counter()
            send(batch)
            latencies.append(time.perf_counter() - began)
        cpu_after, frontend_after, wire_after = cpu.sample(), process_cpu_s(server.pid), _loopback_bytes()
    return {
        "case": case.name,
        "protocol": case.protocol,
        "coding": coding,
        "link_mbit": link,
        "repeat": repeat,
        "requests": count,
        "p50_ms": statistics.median(latencies) * 1e3,
        "mean_ms": statistics.fmean(latencies) * 1e3,
        "p99_ms": float(np.quantile(latencies, 0.99)) * 1e3,
        "frontend_cpu_us_per_request": (frontend_after - frontend_before) / count * 1e6,
        "server_cpu_us_per_request": (cpu_after - cpu_before) / count * 1e6,
        "wire_bytes_per_request": (wire_after - wire_before) / count,
    }


def _sender(
    server: ServerHandle, case: Case, coding: str
) -> tuple[Callable[[np.ndarray], np.ndarray], AbstractContextManager[Any]]:
    """A function that sends one batch and returns its logits, and the client to close after."""
    gzip = None if coding == "none" else coding
    if case.protocol == "http":
        http = httpclient.InferenceServerClient(server.http_url)
        wanted = [httpclient.InferRequestedOutput("logits", binary_data=case.binary)]

        def send_http(batch: np.ndarray) -> np.ndarray:
            tensor = httpclient.InferInput("image", list(batch.shape), "FP32")
            tensor.set_data_from_numpy(batch, binary_data=case.binary)
            result = http.infer(
                case.model,
                [tensor],
                outputs=wanted,
                request_compression_algorithm=gzip,
                response_compression_algorithm=gzip,
            )
            return result.as_numpy("logits")

        return send_http, http
    grpc = grpcclient.InferenceServerClient(server.grpc_url)

    def send_grpc(batch: np.ndarray) -> np.ndarray:
        tensor = grpcclient.InferInput("image", list(batch.shape), "FP32")
        tensor.set_data_from_numpy(batch)
        return grpc.infer(case.model, [tensor], compression_algorithm=gzip).as_numpy("logits")

    return send_grpc, grpc


def _zlib_levels(case: Case, images: np.ndarray) -> dict[str, Any]:
    """zlib at each level on the case's HTTP request body: the compressed share and the time to compress it."""
    batch = _batches(case, images, 1)[0]
    tensor = httpclient.InferInput("image", list(batch.shape), "FP32")
    tensor.set_data_from_numpy(batch, binary_data=case.binary)
    body, _ = httpclient.InferenceServerClient.generate_request_body([tensor])
    levels = {}
    for level in ZLIB_LEVELS:
        times = []
        for _ in range(30):
            began = time.perf_counter()
            compressed = zlib.compress(body, level)
            times.append(time.perf_counter() - began)
        levels[str(level)] = {"ratio": len(compressed) / len(body), "us": statistics.median(times) * 1e6}
    return {"case": case.name, "bytes": len(body), "levels": levels}


def _cells(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per case and link: each coding's medians over the repeats, and gzip against plain."""
    cells = []
    for case in CASES:
        for link in LINKS:
            cell: dict[str, Any] = {"case": case.name, "protocol": case.protocol, "link_mbit": link}
            for coding in CODINGS:
                mine = [r for r in runs if (r["case"], r["link_mbit"], r["coding"]) == (case.name, link, coding)]
                cell[coding] = {key: statistics.median(r[key] for r in mine) for key in RUN_FIGURES}
                cell[coding]["p50_ms_all"] = [r["p50_ms"] for r in mine]
            plain, packed = cell["none"], cell["gzip"]
            cell["p50_ratio"] = packed["p50_ms"] / plain["p50_ms"]
            cell["wire_ratio"] = packed["wire_bytes_per_request"] / plain["wire_bytes_per_request"]
            for part in ("frontend", "server"):  # the frontend process alone, and with its workers
                key = f"{part}_cpu_us_per_request"
                cell[f"{part}_cpu_us_added"] = packed[key] - plain[key]
            cells.append(cell)
    return cells


def _link_name(link: int | None) -> str:
    return "loopback" if link is None else f"{link:,} Mbit/s"


def _progress(run: dict[str, Any]) -> None:
    print(
        f"{run['protocol']} {run['case']:<15} {run['coding']:<5} {_link_name(run['link_mbit']):<13} "
        f"p50 {run['p50_ms']:7.3f} ms, {run['wire_bytes_per_request']:9,.0f} B/request, "
        f"frontend {run['frontend_cpu_us_per_request']:5.0f} µs/request",
        flush=True,
    )


def _plot(report: dict[str, Any], path: Path) -> None:
    fig = figure(13, 4.5)
    axes = fig.subplots(1, len(LINKS), sharey=True)
    names = [f"{case.protocol} {case.name}" for case in CASES]
    x = np.arange(len(names))
    for ax, link in zip(axes, LINKS, strict=True):
        cells = [c for c in report["cells"] if c["link_mbit"] == link]
        for offset, coding in ((-0.2, "none"), (0.2, "gzip")):
            ax.bar(x + offset, [c[coding]["p50_ms"] for c in cells], width=0.4, label=coding)
            for i, cell in enumerate(cells):
                points = cell[coding]["p50_ms_all"]
                ax.plot([x[i] + offset] * len(points), points, "k.", markersize=3)
        ax.set_xticks(x, names, rotation=30, ha="right", fontsize=8)
        ax.set_yscale("log")
        ax.set_title(_link_name(link))
    axes[0].set_ylabel("p50 latency (ms, log); dots: each repeat")
    axes[0].legend()
    fig.suptitle(f"gzip both ways against plain, concurrency 1 — {report['machine']['cpu_model']}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def _print(report: dict[str, Any], output: Path) -> None:
    print("\n| case | link | plain: p50 ms / bytes | gzip: p50 ms / bytes | p50 ratio | bytes | frontend CPU added |")
    print("|---|---|---|---|---|---|---|")
    for cell in report["cells"]:
        plain, packed = cell["none"], cell["gzip"]
        print(
            f"| {cell['protocol']} {cell['case']} | {_link_name(cell['link_mbit'])} "
            f"| {plain['p50_ms']:.3f} / {plain['wire_bytes_per_request']:,.0f} "
            f"| {packed['p50_ms']:.3f} / {packed['wire_bytes_per_request']:,.0f} "
            f"| {cell['p50_ratio']:.2f}× | {cell['wire_ratio']:.2f}× | {cell['frontend_cpu_us_added']:+.0f} µs |"
        )
    print("\n| HTTP request body | bytes | " + " | ".join(f"zlib {level}: share / µs" for level in ZLIB_LEVELS) + " |")
    print("|---|---|" + "---|" * len(ZLIB_LEVELS))
    for entry in report["zlib_levels"]:
        levels = " | ".join(
            f"{entry['levels'][str(level)]['ratio']:.2f} / {entry['levels'][str(level)]['us']:.0f}"
            for level in ZLIB_LEVELS
        )
        print(f"| {entry['case']} | {entry['bytes']:,} | {levels} |")
    print(f"\nwrote {output}")


if __name__ == "__main__":
    raise SystemExit(main())
