"""`adaserve bench` and `adaserve bench compare`: flags become a `Workload` and a `BenchConfig`, results a report.

Exit codes: 0 a valid run; 1 a run that finished but is not valid (the generator fell behind, connections failed);
2 bad input (flags, workload file, trace file); 3 the server or a model could not be reached (nothing measured).
The report is written whenever anything ran, so a failed run still shows what was measured.
"""

from __future__ import annotations

import argparse
import sys
from datetime import datetime
from enum import IntEnum
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from adaserve.arguments import add_url_argument, input_file, server_url
from adaserve.bench.client import client_tls
from adaserve.bench.compare import compare, format_comparison, workload_differences
from adaserve.bench.plots import plot_all
from adaserve.bench.report import format_summary, write_report
from adaserve.bench.results import ResultError, read_result
from adaserve.bench.runner import BenchConfig, run_bench
from adaserve.bench.schedules import ScheduleError
from adaserve.bench.traces import TraceError
from adaserve.bench.workload import WorkloadError, parse_workload, read_workload_file

#: Load kinds whose arrivals are drawn at random, so `--seed` applies to them.
_SEEDED = ("poisson", "step", "burst", "diurnal")


class ExitCode(IntEnum):
    OK = 0
    NOT_VALID = 1
    BAD_INPUT = 2
    UNREACHABLE = 3


class UsageError(ValueError):
    """Flags that do not describe a run; the message says which."""


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add `bench` (with a nested `compare`) to the `adaserve` command line."""
    parser = subparsers.add_parser(
        "bench",
        help="measure a running server's latency and throughput under a load you choose (JSON + PNG report)",
        description="Send a bounded workload to a KServe V2 server and report every request. "
        "Exit codes: 0 valid run, 1 run not valid, 2 bad input, 3 server or model unreachable.",
    )
    _add_run_arguments(parser)
    parser.set_defaults(func=run_command)
    nested = parser.add_subparsers(title="subcommands", dest="bench_command", metavar="{compare}")
    comparer = nested.add_parser("compare", help="two runs of one workload side by side: ratios and overlaid plots")
    comparer.add_argument("a", type=Path, help="result JSON of run A (the baseline)")
    comparer.add_argument("b", type=Path, help="result JSON of run B")
    comparer.add_argument("--output", type=Path, help="write STEM.{cdf,timeline,throughput}.png (default: none)")
    comparer.add_argument("--labels", nargs=2, metavar=("A", "B"), help="names for the runs (default: file names)")
    comparer.add_argument("--force", action="store_true", help="compare even if the workloads differ")
    comparer.set_defaults(func=compare_command)


def add_client_tls_arguments(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """A client's TLS files (`adaserve bench`, `adaserve infer`); `client_tls` reads them."""
    parser.add_argument("--ca-cert", type=Path, metavar="PEM", help="TLS: the CA the server's certificate is from")
    parser.add_argument("--client-cert", type=Path, metavar="PEM", help="TLS: the client's certificate (mutual TLS)")
    parser.add_argument("--client-key", type=Path, metavar="PEM", help="TLS: the client's private key")


def _add_run_arguments(parser: argparse.ArgumentParser) -> None:
    target = parser.add_argument_group("target")
    add_url_argument(target, "the server: host:port of its HTTP or gRPC port, or https://host:port")
    target.add_argument("--protocol", choices=["http", "grpc"], default="http", help="the protocol (default http)")
    target.add_argument(
        "--tls", action="store_true", help="connect over TLS, trusting the system's CAs (an https:// URL implies it)"
    )
    add_client_tls_arguments(target)
    target.add_argument(
        "--compression",
        choices=["gzip", "deflate"],
        help="compress requests and ask for compressed answers (HTTP: each body compressed once before the run; "
        "gRPC: the channel's compression)",
    )
    what = parser.add_argument_group("requests (or --workload FILE)")
    what.add_argument("--workload", type=Path, help="YAML/JSON workload file (flags below override its load/bound)")
    what.add_argument("--model", action="append", default=[], help="model to send to (repeatable: an even mix)")
    what.add_argument(
        "--sequence", type=Path, help="CSV of time_s,model rows: request i goes to model i (then --model is optional)"
    )
    what.add_argument(
        "--input", action="append", default=[], type=input_file, metavar="NAME=FILE.npy", help="input from .npy"
    )
    what.add_argument("--rows", type=int, help="with --input: send this many rows per request, cycling the file")
    what.add_argument(
        "--shape", action="append", default=[], metavar="NAME=D1,D2", help="random input of this full shape"
    )
    what.add_argument("--batch", type=int, default=1, help="batch of random inputs shaped by metadata (default 1)")
    what.add_argument("--param", action="append", default=[], metavar="KEY=VALUE", help="request parameter")
    when = parser.add_argument_group("load (one of)")
    when.add_argument("--concurrency", type=int, help="closed loop with N clients")
    when.add_argument("--rate", type=float, help="open loop, Poisson at R/s (or the target rate of --trace)")
    when.add_argument("--constant", action="store_true", help="with --rate: evenly spaced instead of Poisson")
    when.add_argument("--trace", type=Path, help="with --rate: replay this CSV's timestamps scaled to mean R/s")
    when.add_argument("--skip-bad-lines", action="store_true", help="with --trace: skip and count bad lines")
    when.add_argument("--steps", metavar="T:R,T:R", help="open loop, rate R from time T (s), e.g. 0:10,30:50")
    when.add_argument("--burst", metavar="K=V,..", help="base_rate=,burst_rate=,burst_s=,every_s=[,first_s=]")
    when.add_argument("--diurnal", metavar="K=V,..", help="mean_rate=,period_s=[,amplitude=]")
    when.add_argument("--speedup", type=float, help="with --sequence: open loop at its times, X times faster")
    when.add_argument("--seed", type=int, help="seed of arrivals, mix and random inputs (default 0)")
    bound = parser.add_argument_group("bound (at least one)")
    bound.add_argument("--duration", type=float, help="seconds of sending")
    bound.add_argument("--requests", type=int, help="requests to send")
    limits = parser.add_argument_group("generator")
    limits.add_argument("--timeout", type=float, default=30.0, help="per-request timeout, s (default 30)")
    limits.add_argument("--drain", type=float, default=10.0, help="wait for answers after sending, s (default 10)")
    limits.add_argument("--max-outstanding", type=int, default=4096, help="open loop: in flight before skipping")
    limits.add_argument("--max-lateness-ms", type=float, default=10.0, help="open loop: p99 send lateness allowed")
    output = parser.add_argument_group("output")
    output.add_argument("--output", type=Path, help="result JSON (default bench-YYYYmmdd-HHMMSS.json)")
    output.add_argument("--no-plots", action="store_true", help="write the JSON only")
    output.add_argument("--quiet", action="store_true", help="no progress bar")


def run_command(args: argparse.Namespace) -> int:
    """`adaserve bench ...`: run, write the report, print the summary, return the exit code."""
    try:
        config = build_config(args)
        result = run_bench(config, progress=not args.quiet and sys.stderr.isatty(), command=sys.argv)
    except (UsageError, WorkloadError, TraceError, ScheduleError, ValidationError) as exc:
        return _fail(str(exc), ExitCode.BAD_INPUT)
    output = args.output or Path(datetime.now().strftime("bench-%Y%m%d-%H%M%S.json"))
    files = write_report(result, output, plots=not args.no_plots)
    print(format_summary(result))
    print("wrote " + ", ".join(map(str, files)))
    if result.failure is not None:
        return _fail(result.failure, ExitCode.UNREACHABLE)
    if not result.valid:
        return _fail("the run is not valid: " + "; ".join(result.summary.problems), ExitCode.NOT_VALID)
    return ExitCode.OK


def compare_command(args: argparse.Namespace) -> int:
    """`adaserve bench compare A.json B.json`: the ratio table, and overlaid plots with --output."""
    try:
        a, b = read_result(args.a), read_result(args.b)
    except ResultError as exc:
        return _fail(str(exc), ExitCode.BAD_INPUT)
    differences = workload_differences(a, b)
    if differences and not args.force:
        listed = "\n  ".join(differences)
        return _fail(
            f"the runs used different workloads (pass --force to compare anyway):\n  {listed}", ExitCode.BAD_INPUT
        )
    labels = tuple(args.labels) if args.labels else (args.a.stem, args.b.stem)
    print(format_comparison(compare(a, b), (labels[0], labels[1])))
    for difference in differences:
        print(f"warning: workloads differ: {difference}", file=sys.stderr)
    if args.output:
        files = plot_all([(labels[0], a), (labels[1], b)], args.output)
        print("wrote " + ", ".join(map(str, files)))
    return ExitCode.OK


def build_config(args: argparse.Namespace) -> BenchConfig:
    """The run the flags describe; raises UsageError or WorkloadError."""
    if args.workload is not None:
        if args.model or args.input or args.shape or args.param:
            raise UsageError("give the requests in --workload or with --model/--input/--shape/--param, not both")
        data = read_workload_file(args.workload)
        base = args.workload.parent
    else:
        if not args.model and args.sequence is None:
            raise UsageError("--model (or --workload) is required, or a --sequence")
        if not args.model and (args.input or args.shape or args.param or args.batch != 1):
            raise UsageError("--input, --shape, --param and --batch apply to the --model(s) named")
        data = {"requests": [_request(args, model) for model in args.model]}
        base = Path.cwd()
    if args.sequence is not None:
        data["sequence"] = args.sequence.absolute()
    load = _load(args)
    if load is not None:
        data["load"] = load
    elif "load" not in data:
        raise UsageError("say how to send: --concurrency, --rate, --steps, --burst, --diurnal or --speedup")
    elif args.seed is not None and isinstance(data["load"], dict) and data["load"].get("kind") in _SEEDED:
        data["load"]["seed"] = args.seed
    for key, value in (("duration_s", args.duration), ("max_requests", args.requests), ("seed", args.seed)):
        if value is not None:
            data[key] = value
    workload = parse_workload(data, base=base, source=str(args.workload or "flags"))
    return BenchConfig(
        url=server_url(args.url, args.protocol),
        protocol=args.protocol,
        workload=workload,
        timeout_s=args.timeout,
        drain_s=args.drain,
        max_outstanding=args.max_outstanding,
        max_lateness_ms=args.max_lateness_ms,
        tls=client_tls(args.tls, args.ca_cert, args.client_cert, args.client_key),
        compression=args.compression,
    )


def _request(args: argparse.Namespace, model: str) -> dict[str, Any]:
    inputs: list[dict[str, Any]] = []
    for item in args.input:
        if item.name is None:
            raise UsageError(f"--input {str(item.path)!r}: expected NAME=FILE.npy")
        inputs.append({"name": item.name, "npy": str(item.path), **({"rows": args.rows} if args.rows else {})})
    for item in args.shape:
        name, dims = _split(item, "--shape", "NAME=D1,D2")
        inputs.append({"name": name, "shape": _numbers(dims, "--shape", int)})
    if args.rows and not args.input:
        raise UsageError("--rows applies to --input files")
    parameters = dict(_split(item, "--param", "KEY=VALUE") for item in args.param)
    return {
        "model": model,
        "inputs": inputs,
        "batch": args.batch,
        "parameters": {key: _scalar(value) for key, value in parameters.items()},
    }


def _load(args: argparse.Namespace) -> dict[str, Any] | None:
    """The load spec the flags ask for, or None when they ask for none (the workload file's then)."""
    chosen = [
        flag
        for flag, value in (
            ("--concurrency", args.concurrency),
            ("--rate", args.rate),
            ("--steps", args.steps),
            ("--burst", args.burst),
            ("--diurnal", args.diurnal),
            ("--speedup", args.speedup),
        )
        if value is not None
    ]
    if len(chosen) > 1:
        raise UsageError(f"choose one load: {' and '.join(chosen)} were both given")
    if (args.constant or args.trace) and args.rate is None:
        raise UsageError("--constant and --trace need --rate")
    if args.constant and args.trace:
        raise UsageError("--constant and --trace do not combine")
    if args.skip_bad_lines and not args.trace:
        raise UsageError("--skip-bad-lines applies to --trace")
    seed = {} if args.seed is None else {"seed": args.seed}
    if args.concurrency is not None:
        return {"kind": "closed", "concurrency": args.concurrency}
    if args.rate is not None:
        if args.trace:
            return {"kind": "trace", "path": args.trace, "rate": args.rate, "skip_bad_lines": args.skip_bad_lines}
        return (
            {"kind": "constant", "rate": args.rate} if args.constant else {"kind": "poisson", "rate": args.rate, **seed}
        )
    if args.steps is not None:
        steps = [_numbers(step, "--steps", float, sep=":") for step in args.steps.split(",")]
        return {"kind": "step", "steps": steps, **seed}
    if args.burst is not None:
        return {"kind": "burst", **_pairs(args.burst, "--burst"), **seed}
    if args.diurnal is not None:
        return {"kind": "diurnal", **_pairs(args.diurnal, "--diurnal"), **seed}
    if args.speedup is not None:
        return {"kind": "sequence", "speedup": args.speedup}
    return None


def _split(item: str, flag: str, form: str) -> tuple[str, str]:
    name, sep, value = item.partition("=")
    if not sep or not name or not value:
        raise UsageError(f"{flag} {item!r}: expected {form}")
    return name, value


def _numbers(text: str, flag: str, kind: type[int] | type[float], sep: str = ",") -> list[Any]:
    try:
        return [kind(part) for part in text.split(sep)]
    except ValueError:
        raise UsageError(f"{flag} {text!r}: expected numbers separated by {sep!r}") from None


def _pairs(text: str, flag: str) -> dict[str, float]:
    pairs = [_split(item, flag, "KEY=VALUE,...") for item in text.split(",")]
    try:
        return {key: float(value) for key, value in pairs}
    except ValueError:
        raise UsageError(f"{flag} {text!r}: values must be numbers") from None


def _scalar(text: str) -> bool | int | float | str:
    """A parameter value typed as it reads: true/false, an integer, a number, else a string."""
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def _fail(message: str, code: int) -> int:
    print(f"adaserve bench: error: {message}", file=sys.stderr)
    return code
