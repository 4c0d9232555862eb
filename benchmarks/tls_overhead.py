"""What TLS on the frontends costs: the same requests to a plain server and to one serving HTTP and gRPC over TLS.

The example `mlp` takes batch-1 requests from Triton's C++ perf_analyzer (closed loop, concurrency 1 and 8, HTTP
and gRPC; over TLS with `--ssl-https-ca-certificates-file` and `--ssl-grpc-use-ssl`, the certificates made by
openssl for the run: an EC P-256 CA and a server certificate for 127.0.0.1). Two servers run side by side, one plain
and one started with `--http-use-ssl` and `--grpc-use-ssl`; every case runs `--repeats` times, the servers and
cases interleaved, and the median is reported beside each repeat. perf_analyzer keeps its connections open, so this
measures encryption on a warm connection, not the handshake.

    benchmarks/perf_analyzer_env.sh                     # once: Triton's perf_analyzer in .venv-perf
    .venv/bin/python -m benchmarks.tls_overhead         # ~4 minutes; --quick for one repeat

Writes `benchmarks/results/tls_overhead.json` and `.png` (with --quick: under `benchmarks/results/tmp/`).
"""

from __future__ import annotations

import argparse
import dataclasses
import shutil
import ssl
from pathlib import Path
from typing import Any

from benchmarks.common import (
    RESULTS,
    SCRATCH,
    finish_report,
    load_average,
    process_command,
    report_head,
)
from benchmarks.perf_load import PerfAnalyzer
from benchmarks.serving_overhead import MODEL, paired_case, paired_plot, perf_parser, perf_run
from tests.server_utils import ServerHandle, link_example, make_certificates, running_server

PROTOCOLS = ("http", "grpc")
CONCURRENCIES = (1, 8)
SERVERS = ("plain", "tls")


def main() -> int:
    args = perf_parser(__doc__, request_count=3000).parse_args()
    args.repeats = args.repeats or (1 if args.quick else 3)
    args.request_count = args.request_count or (500 if args.quick else 3000)
    output: Path = args.output or (SCRATCH / "tls_overhead-quick.json" if args.quick else RESULTS / "tls_overhead.json")
    perf = PerfAnalyzer.find(args.perf_venv, judge_stability=not args.quick)
    work = SCRATCH / "tls_overhead"
    shutil.rmtree(work, ignore_errors=True)
    (work / "certs").mkdir(parents=True)
    certs = make_certificates(work / "certs")
    link_example(work / "repo", MODEL)
    settings = {"model": MODEL, "repeats": args.repeats, "measurement_request_count": args.request_count}
    report = report_head("tls_overhead", settings)
    tls = [
        f"--{protocol}-{flag}"
        for protocol in PROTOCOLS
        for flag in ("use-ssl", f"server-cert={certs / 'server.pem'}", f"server-key={certs / 'server.key'}")
    ]
    with (
        running_server(work / "repo") as plain,
        running_server(work / "repo", *tls, https=ssl.create_default_context(cafile=certs / "ca.pem")) as secure,
    ):
        report["server_commands"] = {"plain": process_command(plain.pid), "tls": process_command(secure.pid)}
        report["runs"] = [
            _run(perf, plain if server == "plain" else secure, server, protocol, concurrency, repeat, args, certs)
            for repeat in range(args.repeats)
            for protocol in PROTOCOLS
            for concurrency in CONCURRENCIES
            for server in SERVERS
        ]
    report["load_end"] = load_average()
    report["cases"] = _cases(report["runs"])
    return finish_report(report, output, _plot, _print)


def _run(
    perf: PerfAnalyzer,
    server: ServerHandle,
    name: str,
    protocol: str,
    concurrency: int,
    repeat: int,
    args: argparse.Namespace,
    certs: Path,
) -> dict[str, Any]:
    extra: tuple[str, ...] = ()
    if name == "tls" and protocol == "http":
        server = dataclasses.replace(server, http_url=f"https://{server.http_url}")
        extra = ("--ssl-https-ca-certificates-file", str(certs / "ca.pem"))
    elif name == "tls":
        extra = ("--ssl-grpc-use-ssl", "true", "--ssl-grpc-root-certifications-file", str(certs / "ca.pem"))
    return perf_run(perf, server, protocol, concurrency, repeat, args.request_count, name, extra=extra)


def _cases(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per protocol and concurrency: each server's medians, TLS's ratio of req/s and its added p50."""
    cases: dict[str, Any] = {}
    for protocol in PROTOCOLS:
        for concurrency in CONCURRENCIES:
            mine = [r for r in runs if (r["protocol"], r["concurrency"]) == (protocol, concurrency)]
            case = paired_case(mine, SERVERS)
            if "p50_ratio" in case:
                case["p50_added_us"] = (case["tls"]["p50_ms"] - case["plain"]["p50_ms"]) * 1000
            cases[f"{protocol}_c{concurrency}"] = case
    return cases


def _plot(report: dict[str, Any], path: Path) -> None:
    paired_plot(report, path, SERVERS, "TLS on the frontends, the MLP at batch 1")


def _print(report: dict[str, Any], output: Path) -> None:
    print("\n| case | plain: p50 ms / req/s | TLS: p50 ms / req/s | req/s ratio |")
    print("|---|---|---|---|")
    for name, case in report["cases"].items():
        cells = [
            f"{case[s]['p50_ms']:.3f} / {case[s]['throughput_rps']:,.0f}" if case[s]["p50_ms"] else "failed"
            for s in SERVERS
        ]
        ratio = f"{case['throughput_ratio']:.2f}×" if "throughput_ratio" in case else "–"
        print(f"| {name} | " + " | ".join(cells) + f" | {ratio} |")
    print(f"\nload average {report['load_start']} → {report['load_end']}; wrote {output}")


if __name__ == "__main__":
    raise SystemExit(main())
