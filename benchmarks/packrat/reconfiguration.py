"""Packrat's reconfiguration timeline (the paper's Figure 6): the load steps up so the estimated B goes from about 8
to about 64 and back, and a real server with `workers: auto` changes its worker set with no downtime.

The model (default: ResNet-18 at 3×64×64, whose cost per row halves from batch 4 to batch 32, so a larger set pays)
is exported and profiled as in the speedup benchmark. `max_batch_size` 32 with T threads caps the estimator at
B = T × 32 (64 on two cores). One server holds three entries of it: `<model>_auto` (`workers: auto`, `initial_batch`
8) and, for calibration, `<model>_set8` and `<model>_set64`, fixed to the plans for B = 8 and 64 as the server would
pin them, with the busy-thread limit Packrat gives its sets (T). Calibration: a closed loop keeping B rows in the
server (B / rows-per-request clients) on each fixed set measures what that set answers per second on this machine
now, HTTP and the generator included. The rates are low = `--low-fraction` (0.8) × the B = 8 set's and high =
`--high-fraction` (0.7) × the B = 64 set's: at the high rate the B = 8 set falls behind, its queue grows and the
estimator moves B, and the B = 64 set has room to drain what piled up meanwhile (at 0.85 it had none: Poisson
arrivals and the open loop's generator left it serving about what arrived, and the backlog stayed). Then
`<model>_auto` is loaded afresh and adaserve's load generator sends Poisson arrivals stepped low → high → low. The
estimator runs with the config's defaults (`ewma_alpha` 0.3, `window` 16, `reconfigure_timeout_s` 10,
`capacity_headroom` 1.5, `overload_factor` 4); `--capacity-headroom 0` is Packrat's estimator without the floor,
which flip-flops here, and `--overload-factor 0` moves only at the timeout (see adaserve/cpu/estimator.py).

Recorded: every request's latency and status (adaserve.bench), the server's /metrics every `--poll-s` (rows queued
and computing, the planned B, reconfigurations, failures), and each "worker set switched" line of the server's log
(when, to which set, how long the new set took to start). Failed requests are counted, not assumed away. The rates
sit close to what the sets can take, so other work on the machine changes the picture: a run during which others took
more than `--noise-cores` is made again (up to `--attempts`), the quietest kept, and the others' failures reported.

    .venv/bin/python -m benchmarks.packrat.reconfiguration           # ~4 minutes (up to 3 runs of 160 s if busy)
    .venv/bin/python -m benchmarks.packrat.reconfiguration --quick   # ~1.5 minutes, under results/tmp/

Writes `benchmarks/results/packrat_reconfiguration.json` and `.png` (with --quick: under `benchmarks/results/tmp/`).
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import shutil
import threading
import time
import urllib.request
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from adaserve.bench import BenchConfig, BenchResult, Status, parse_workload, run_bench, write_report
from adaserve.cpu.profiler import AutoPlanner, ProfileSettings
from adaserve.cpu.topology import machine_topology
from adaserve.repository import ModelSpec
from benchmarks.common import (
    RESULTS,
    SCRATCH,
    TreeCPU,
    add_noise_arguments,
    command_line,
    figure,
    load_average,
    load_window,
    machine,
    wait_for_quiet,
    write_json,
)
from benchmarks.packrat.models import REFERENCES, ensure_profile, export_model
from benchmarks.packrat.serving import link_model, reload, served_worker_set
from tests.server_utils import ServerHandle, running_server

#: The estimated batch sizes the issue asks to move between.
LOW_B, HIGH_B = 8, 64


def main() -> int:
    args = _parse_args()
    os.environ["OMP_WAIT_POLICY"] = args.omp_wait_policy  # the server's model processes and the profiler inherit it
    output: Path = args.output or (
        SCRATCH / "packrat_reconfiguration-quick.json" if args.quick else RESULTS / "packrat_reconfiguration.json"
    )
    report, spec, repository = _prepare(args, output.stem)
    name = report["model"]["name"]
    fixed = [entry for entry, batch in report["entries"].items() if batch is not None]
    with running_server(repository, *(f"--model={entry}" for entry in fixed)) as server:
        report["quiet_before_calibration"] = wait_for_quiet(args.quiet_s)
        report["calibration"] = _calibrate(server, report["entries"], args)
        steps = _steps(report, args)
        attempts: list[dict[str, Any]] = []
        while len(attempts) < args.attempts and (not attempts or attempts[-1]["other_cores"] > args.noise_cores):
            wait_for_quiet(args.quiet_s)
            # Loaded afresh, and the run starts at once: the estimator's first check is a reconfiguration timeout
            # after the load, so the timeline begins with the set planned for initial_batch.
            reload(server, repository, spec, name, report["auto_config"])
            attempts.append(_timeline_run(server, name, steps, args))
            print(f"run {len(attempts)}: other work took {attempts[-1]['other_cores']:.2f} cores", flush=True)
        report["server_log"] = str(server.log)
    kept = min(attempts, key=lambda a: a["other_cores"])
    result: BenchResult = kept.pop("result")
    write_report(result, args.scratch / f"{output.stem}-requests.json", plots=False)
    report.update(kept)
    report["switches"] = _switches(server.log, name, kept["wall_start"], kept["wall_end"])
    report["phases"] = _phases(result, steps, sum(args.phases_s))
    report["timeline"] = _timeline(result, sum(args.phases_s))
    # Every attempt counts for failures, not only the one kept.
    report["noisier_attempts"] = [
        {"other_cores": a["other_cores"], "failed_requests": a["failed_requests"], "summary": a["summary"]}
        for a in attempts
        if a is not kept
    ]
    write_json(report, output)
    _plot(report, output.with_suffix(".png"))
    _print(report, output)
    return 0


def _timeline_run(
    server: ServerHandle, name: str, steps: list[list[float]], args: argparse.Namespace
) -> dict[str, Any]:
    """One stepped run on the freshly loaded auto entry: the requests, the polls and what other work took."""
    record: dict[str, Any] = {"initial_worker_set": served_worker_set(server, name)}
    cpu = TreeCPU(os.getpid())  # the server, its workers (retired ones too) and the generator
    ours = cpu.sample()
    with load_window(record):
        result, polls, record["wall_start"] = _run(server, name, steps, sum(args.phases_s), args, cpu)
    record["wall_end"] = time.time()
    ours = (cpu.sample() - ours) / record["wall_s"]
    record["other_cores"] = round(max(0.0, record["machine_busy_cores"] - ours), 3)
    record["final_worker_set"] = served_worker_set(server, name)
    record["polls"] = polls
    record["failed_requests"] = {
        "client": result.summary.errors + result.summary.not_sent + result.summary.cancelled,
        "by_kind": result.summary.errors_by_kind,
        "server_failures": polls[-1]["failures"] - polls[0]["failures"] if polls else None,
    }
    record["summary"] = {
        "requests": result.summary.requests,
        "ok": result.summary.ok,
        "valid": result.summary.valid,
        "problems": result.summary.problems,
        "generator_cores": result.summary.generator.cpu_utilization,
    }
    record["result"] = result
    return record


def _prepare(args: argparse.Namespace, stem: str) -> tuple[dict[str, Any], ModelSpec, Path]:
    """Export and profile the model; write its `workers: auto` entry and, for the calibration, one entry per fixed
    set: the plans for B = 8 and B = 64 as the server would pin them."""
    topology = machine_topology()
    threads = args.threads or len(topology.cpus)
    reference = REFERENCES[args.model]
    spec, _ = export_model(args.scratch / "repo", reference, args.max_batch_size)
    settings = ProfileSettings.for_run(quick=args.quick)
    record, measured = ensure_profile(
        spec,
        threads,
        args.max_batch_size,
        settings,
        topology,
        attempts=args.attempts,
        noise_cores=args.noise_cores,
        quiet_s=args.quiet_s,
    )
    planner = AutoPlanner(spec, threads=threads, topology=topology)
    packrat = {
        "threads": threads,
        "initial_batch": LOW_B,
        "ewma_alpha": args.ewma_alpha,
        "window": args.window,
        "reconfigure_timeout_s": args.reconfigure_timeout_s,
        "sample_interval_s": args.sample_interval_s,
        "capacity_headroom": args.capacity_headroom,
        "overload_factor": args.overload_factor,
    }
    repository = args.scratch / f"{stem}-serve"
    shutil.rmtree(repository, ignore_errors=True)
    name = f"{spec.name}_auto"
    # A queue long enough for the high rate's backlog while the B = 8 set still serves (the default, 1024, refuses
    # requests beyond it: a 503 is a failed request here).
    auto_config = {"workers": "auto", "packrat": packrat, "max_queue_size": args.max_queue_size}
    link_model(spec, repository, name, auto_config)
    entries: dict[str, int | None] = {name: None}  # entry → the B of its fixed set
    plans: dict[str, Any] = {}
    for batch in (LOW_B, HIGH_B):
        chosen = planner.plan(batch)
        workers = [w.model_dump(mode="json") for w in chosen.workers]
        # The busy-thread limit `workers: auto` has (T: a plan's instances are meant to run at once), not a fixed
        # set's default (one less than the CPUs: on two cores one batch at a time, half the set's capacity).
        fixed = {"workers": workers, "batching": {"max_busy_threads": threads}}
        link_model(spec, repository, f"{spec.name}_set{batch}", fixed)
        entries[f"{spec.name}_set{batch}"] = batch
        plans[str(batch)] = {
            "plan": chosen.plan.triples,
            "workers": workers,
            "expected_latency_ms": chosen.plan.latency_s * 1e3,
            "rows_per_s_from_profile": batch / chosen.plan.latency_s,
        }
    report: dict[str, Any] = {
        "benchmark": "packrat_reconfiguration",
        "command": command_line(),
        "machine": machine(),
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "load_start": load_average(),
        "model": {"name": name, "description": reference.description, "max_batch_size": args.max_batch_size},
        "profile": {
            "how": measured.how,
            "other_cores_per_attempt": measured.other_cores,
            "created": record.created,
            "load_average": record.load_average,
            "latency_ms": {f"t={c.threads},b={c.batch}": c.mean_s * 1e3 for c in record.cells},
        },
        "packrat": packrat,
        "auto_config": auto_config,
        "plans": plans,
        "entries": entries,
        "settings": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "environment": {k: os.environ[k] for k in sorted(os.environ) if k.startswith(("OMP_", "GOMP_"))},
    }
    return report, spec, repository


def _calibrate(server: ServerHandle, entries: dict[str, int | None], args: argparse.Namespace) -> dict[str, Any]:
    """What the server answers per second with the fixed set for B when B rows are always waiting or computing: a
    closed loop of B / rows-per-request clients on that set's entry (the best of two short runs)."""
    calibration: dict[str, Any] = {}
    for entry, batch in entries.items():
        if batch is None:
            continue
        clients = max(1, batch // args.rows_per_request)
        workload = parse_workload(
            {
                "requests": [{"model": entry, "batch": args.rows_per_request}],
                "load": {"kind": "closed", "concurrency": clients},
                "duration_s": args.calibration_s,
                "seed": args.seed,
            }
        )
        runs = [run_bench(BenchConfig(url=server.http_url, workload=workload)).summary for _ in range(2)]
        best = max(runs, key=lambda s: s.throughput_rps)
        calibration[str(batch)] = {
            "entry": entry,
            "clients": clients,
            "requests_per_s": best.throughput_rps,
            "runs_requests_per_s": [s.throughput_rps for s in runs],
            "mean_ms": best.latency.mean_ms,
            "errors": sum(s.errors for s in runs),
        }
        print(f"calibration: B={batch} set, {clients} clients: {best.throughput_rps:.1f} req/s", flush=True)
    return calibration


def _steps(report: dict[str, Any], args: argparse.Namespace) -> list[list[float]]:
    """Low → high → low Poisson rates from the calibration (or as given), recorded in the report."""
    capacity = report["calibration"]
    low = args.low_rate or round(args.low_fraction * capacity[str(LOW_B)]["requests_per_s"], 1)
    high = args.high_rate or round(args.high_fraction * capacity[str(HIGH_B)]["requests_per_s"], 1)
    steps = [[0.0, low], [args.phases_s[0], high], [args.phases_s[0] + args.phases_s[1], low]]
    report["load"] = {
        "kind": "step",
        "steps": steps,
        "duration_s": sum(args.phases_s),
        "rows_per_request": args.rows_per_request,
        "rule": f"low = {args.low_fraction} × the B={LOW_B} set's calibrated rate, high = {args.high_fraction} × "
        f"the B={HIGH_B} set's (unless given as --low-rate / --high-rate)",
    }
    return steps


def _parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add = parser.add_argument
    add("--quick", action="store_true", help="shorter phases and a quick profile")
    add("--model", default="resnet18", choices=sorted(REFERENCES), help="default resnet18 (3×64×64)")
    add("--threads", type=int, help="T (default: every CPU this process may use)")
    add("--max-batch-size", type=int, default=32, help="the model's max_batch_size; B is capped at T × this")
    add("--max-queue-size", type=int, default=4096, help="the auto entry's max_queue_size (rows; default 4096)")
    add(
        "--phases-s",
        type=lambda s: [float(x) for x in s.split(",")],
        help="low,high,low phase lengths (default 40,80,40; --quick 15,40,15)",
    )
    add("--low-fraction", type=float, default=0.8, help="low rate as a fraction of the B=8 set's calibrated rate")
    add("--high-fraction", type=float, default=0.7, help="high rate as a fraction of the B=64 set's calibrated rate")
    add("--calibration-s", type=float, help="length of each calibration run (default 5 s; --quick 3)")
    add("--rows-per-request", type=int, default=1, help="rows each request carries (default 1)")
    add("--low-rate", type=float, help="low rate (req/s); default from --low-fraction")
    add("--high-rate", type=float, help="high rate (req/s); default from --high-fraction")
    add("--ewma-alpha", type=float, default=0.3, help="packrat.ewma_alpha (default 0.3, the config's)")
    add("--window", type=int, default=16, help="packrat.window: the mode of this many estimates (default 16)")
    add(
        "--capacity-headroom",
        type=float,
        default=1.5,
        help="packrat.capacity_headroom (default 1.5, the config's; 0: no floor, as the paper)",
    )
    add("--reconfigure-timeout-s", type=float, default=10.0, help="packrat.reconfigure_timeout_s (default 10)")
    add(
        "--overload-factor",
        type=float,
        default=4.0,
        help="packrat.overload_factor (default 4, the config's; 0: moves only at the timeout, as the paper)",
    )
    add("--sample-interval-s", type=float, default=0.1, help="packrat.sample_interval_s (default 0.1)")
    add_noise_arguments(parser, run="timeline run")
    add("--poll-s", type=float, default=0.25, help="how often /metrics is read during the run")
    # The high phase's backlog keeps both cores busy, and the generator shares them: at 350 req/s its p99 send
    # lateness was 10.4-12 ms, against requests that took 60-500 ms on average per phase.
    add(
        "--max-lateness-ms",
        type=float,
        default=25.0,
        help="the generator's p99 send lateness beyond which the run is not valid (default 25)",
    )
    add("--omp-wait-policy", choices=["PASSIVE", "ACTIVE"], default=os.environ.get("OMP_WAIT_POLICY", "PASSIVE"))
    add("--seed", type=int, default=1, help="seeds arrivals and inputs")
    add("--output", type=Path, help="result JSON (the PNG goes beside it)")
    args = parser.parse_args()
    args.phases_s = args.phases_s or ([15.0, 40.0, 15.0] if args.quick else [40.0, 80.0, 40.0])
    if len(args.phases_s) != 3:
        parser.error("--phases-s takes three lengths: low, high, low")
    args.calibration_s = args.calibration_s or (3.0 if args.quick else 5.0)
    args.scratch = SCRATCH / ("packrat-quick" if args.quick else "packrat")
    return args


def _run(
    server: ServerHandle,
    name: str,
    steps: list[list[float]],
    duration_s: float,
    args: argparse.Namespace,
    cpu: TreeCPU,
) -> tuple[BenchResult, list[dict[str, Any]], float]:
    """The stepped open-loop run with /metrics read (and `cpu` sampled) every `poll_s` beside it; returns the poll
    times on the run's clock (they start just before the generator's own, which first fetches the model's metadata:
    milliseconds)."""
    workload = parse_workload(
        {
            "requests": [{"model": name, "batch": args.rows_per_request}],
            "load": {"kind": "step", "steps": steps, "seed": args.seed},
            "duration_s": duration_s,
            "seed": args.seed,
        }
    )
    polls: list[dict[str, Any]] = []
    done = threading.Event()
    began, wall_start = time.perf_counter(), time.time()

    def poll() -> None:
        while not done.wait(args.poll_s):
            polls.append({"t_s": round(time.perf_counter() - began, 3), **_metrics(server, name)})
            cpu.sample()

    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    try:
        result = run_bench(
            BenchConfig(
                url=server.http_url,
                workload=workload,
                timeout_s=60.0,
                drain_s=60.0,
                max_lateness_ms=args.max_lateness_ms,
            ),
            command=[command_line()],
        )
    finally:
        done.set()
        poller.join()
    return result, polls, wall_start


def _metrics(server: ServerHandle, name: str) -> dict[str, Any]:
    """The model's gauges and counters from /metrics: rows queued and computing, planned B, switches, failures."""
    with urllib.request.urlopen(f"http://{server.http_url}/metrics", timeout=10) as response:
        text = response.read().decode()
    wanted = {
        "adaserve_queued_rows": "queued",
        "adaserve_inflight_rows": "inflight",
        "adaserve_worker_set_batch": "planned_batch",
        "adaserve_worker_set_reconfigurations": "reconfigurations",
        "adaserve_inference_request_failure": "failures",
    }
    values: dict[str, Any] = dict.fromkeys(wanted.values(), 0)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            key = wanted.get(sample.name.removesuffix("_total"))
            if key is not None and sample.labels.get("model") == name:
                values[key] = int(sample.value)
    return values


def _switches(log: Path, name: str, wall_start: float, wall_end: float) -> list[dict[str, Any]]:
    """Each "worker set switched" line of the server's log during the run, on the run's clock: activated at `t_s`,
    after the new set took `switch_s` to start beside the old one."""
    switches = []
    for line in log.read_text().splitlines():
        try:
            entry = json.loads(line)
        except json.JSONDecodeError:
            continue
        if entry.get("msg") != "worker set switched" or entry.get("model") != name:
            continue
        at = datetime.fromisoformat(entry["ts"].replace("Z", "+00:00")).timestamp() - wall_start
        if not 0 <= at <= wall_end - wall_start:
            continue
        details = entry.get("details", {})
        switches.append(
            {
                "t_s": round(at, 3),
                "switch_s": entry.get("switch_s"),
                "reason": entry.get("worker_set"),
                "instances": details.get("instances"),
                "expected_latency_ms": details.get("expected_latency_ms"),
                "batch": _planned_batch(entry.get("worker_set", "")),
            }
        )
    return switches


def _planned_batch(reason: str) -> int | None:
    """B from the reason text "Packrat plan ⟨..⟩ for B=64: ..."."""
    _, _, rest = reason.partition(" for B=")
    digits = rest.split(":", 1)[0]
    return int(digits) if digits.isdigit() else None


def _phases(result: BenchResult, steps: list[list[float]], duration_s: float) -> list[dict[str, Any]]:
    """Latency and answers per phase (requests assigned by scheduled time)."""
    bounds = [at for at, _ in steps] + [duration_s]
    phases = []
    for (start, rate), end in zip(steps, bounds[1:], strict=True):
        records = [r for r in result.records if start <= r.scheduled_s < end]
        ok = np.array([r.latency_ms for r in records if r.status is Status.OK and r.latency_ms is not None])
        p50, p99 = np.percentile(ok, (50, 99)) if ok.size else (math.nan, math.nan)
        phases.append(
            {
                "from_s": start,
                "to_s": end,
                "rate_rps": rate,
                "requests": len(records),
                "failed": len(records) - int(ok.size),
                "mean_ms": float(ok.mean()) if ok.size else None,
                "p50_ms": float(p50),
                "p99_ms": float(p99),
            }
        )
    return phases


def _timeline(result: BenchResult, duration_s: float, bin_s: float = 1.0) -> dict[str, list[Any]]:
    """Per second of the run: requests scheduled, their mean and p99 latency, and how many failed."""
    edges = np.arange(0.0, duration_s + bin_s, bin_s)
    scheduled = np.array([r.scheduled_s for r in result.records])
    latency = np.array([r.latency_ms if r.latency_ms is not None else math.nan for r in result.records])
    ok = np.array([r.status is Status.OK for r in result.records])
    rows: dict[str, list[Any]] = {"t_s": [], "requests": [], "mean_ms": [], "p99_ms": [], "failed": []}
    for low, high in itertools.pairwise(edges):
        inside = (scheduled >= low) & (scheduled < high)
        good = latency[inside & ok]
        rows["t_s"].append(float(low))
        rows["requests"].append(int(inside.sum()))
        rows["mean_ms"].append(float(good.mean()) if good.size else None)
        rows["p99_ms"].append(float(np.percentile(good, 99)) if good.size else None)
        rows["failed"].append(int((inside & ~ok).sum()))
    return rows


def _plot(report: dict[str, Any], path: Path) -> None:
    """Top: latency over time (per second, mean and p99) with the switches marked; bottom: queue depth and B."""
    fig = figure(12, 7)
    top, bottom = fig.subplots(2, 1, sharex=True)
    timeline = report["timeline"]
    t = np.array(timeline["t_s"]) + 0.5
    top.plot(t, [v or math.nan for v in timeline["mean_ms"]], "-", label="mean per second")
    top.plot(t, [v or math.nan for v in timeline["p99_ms"]], ":", label="p99 per second")
    polls = report["polls"]
    times = [p["t_s"] for p in polls]
    bottom.plot(times, [p["queued"] + p["inflight"] for p in polls], "-", color="C0", label="rows queued + computing")
    bottom.step(times, [p["planned_batch"] for p in polls], where="post", color="C3", label="B of the running set")
    for ax in (top, bottom):
        for at, rate in report["load"]["steps"]:
            ax.axvline(at, color="grey", linewidth=0.8)
            if ax is top:
                ax.annotate(
                    f"{rate:g} req/s",
                    (at, 1),
                    xycoords=("data", "axes fraction"),
                    xytext=(3, -12),
                    textcoords="offset points",
                    fontsize=8,
                    color="grey",
                )
        for switch in report["switches"]:
            start = switch["t_s"] - (switch["switch_s"] or 0)
            ax.axvspan(start, switch["t_s"], color="C2", alpha=0.2)
            ax.axvline(switch["t_s"], color="C2", linestyle="--")
            if ax is bottom:
                plan = " + ".join(f"⟨{i},{t},{b}⟩" for i, t, b in switch["instances"] or ())
                ax.annotate(
                    f"B={switch['batch']} {plan}",
                    (switch["t_s"], 0.97),
                    xycoords=("data", "axes fraction"),
                    rotation=90,
                    fontsize=7,
                    ha="right",
                    va="top",
                    color="C2",
                )
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize="small", loc="upper left")
    for ax in (top, bottom):
        ax.set_yscale("log")
    top.set_ylabel("latency (ms, log)")
    bottom.set_ylabel("rows (log)")
    bottom.set_xlabel("time since the run started (s)")
    failed = report["failed_requests"]["client"]
    fig.suptitle(
        f"{report['model']['name']}: {report['model']['description']}\n{len(report['switches'])} worker-set switches "
        f"(green: the new set starting beside the old, then taking over), {failed} failed requests; other work "
        f"took {report['other_cores']:.2f} cores",
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def _print(report: dict[str, Any], output: Path) -> None:
    for phase in report["phases"]:
        print(
            f"{phase['from_s']:>5.0f}–{phase['to_s']:<5.0f} s at {phase['rate_rps']:g} req/s: {phase['requests']} "
            f"requests, mean {phase['mean_ms']} ms, p99 {phase['p99_ms']:.1f} ms, failed {phase['failed']}"
        )
    for switch in report["switches"]:
        print(
            f"switch at {switch['t_s']:.1f} s to B={switch['batch']} {switch['instances']} "
            f"(new set started in {switch['switch_s']} s)"
        )
    print(
        f"failed requests: {report['failed_requests']}; other work took {report['other_cores']} cores; wrote {output}"
    )


if __name__ == "__main__":
    raise SystemExit(main())
