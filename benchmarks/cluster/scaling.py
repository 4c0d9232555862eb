"""Node servers on one machine: throughput with 1, 2 and 4 `adaserve serve --reuse-port` sharing the ports, each on
a group of cores of its own.

A frontend process spends 0.2-0.9 ms of one core per request, so on a machine of many cores one server's frontend,
not its workers, caps a small model. This measures what sharing the ports buys: the usable cores (or
`--server-cpus`) are cut into `--groups` groups by `adaserve.cpu.groups.core_groups` (one per NUMA node when they
match, else contiguous), and a run with k servers starts k of them, server i with `--reuse-port --cpus` group i. One
server therefore has one group's cores, not the machine's: adding a server adds its cores and its frontend, which
is the scaling a machine split into node servers gets.

Each server count takes two cases from Triton's C++ perf_analyzer, closed loop at `--concurrency` (default 16 per
group: enough to keep every server busy), batch 1: the example `cnn` over REST and the example `mlp` over gRPC.
perf_analyzer's gRPC client shares one channel (one connection) among up to 6 of its contexts; here every context
has its own (`TRITON_CLIENT_GRPC_CHANNEL_MAX_SHARE_COUNT=1`), so that the kernel, which spreads connections and not
requests, spreads the load. Each server's CPU over each run is recorded, which shows how evenly it was spread. The
server counts are interleaved over `--repeats` (servers started afresh each time); a case's figure is the median of
its repeats that perf_analyzer could measure (a repeat whose windows never agreed within 25% is counted as unstable,
and left out), and its ratio is over one server's median from the same run.

The issue's bar (issue 51, benchmark 3): on a 16-core machine, 4 groups of 4 cores, 4 servers' throughput at least
3.5× one server's for both cases. Where the machine has fewer than 16 cores, or the groups are not of 4, the result
says the bar was not measured. perf_analyzer runs on the same cores unless `--client-cpus` puts it elsewhere.

    benchmarks/perf_analyzer_env.sh                       # once: Triton's perf_analyzer in .venv-perf
    .venv/bin/python -m benchmarks.cluster.scaling        # ~4 minutes on 2 cores; --quick for a smoke run

Writes `benchmarks/results/cluster_scaling-{N}cores.json` and `.png`, N the CPUs the servers were cut from (with
--quick: under `benchmarks/results/tmp/`).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import shutil
import statistics
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from adaserve.cpu.groups import core_groups, format_cpus, parse_cpus
from adaserve.cpu.topology import SYSFS, read_topology
from benchmarks.common import (
    RESULTS,
    SCRATCH,
    TreeCPU,
    figure,
    finish_report,
    load_average,
    ms_text,
    pinned,
    process_command,
    report_head,
)
from benchmarks.perf_load import PerfAnalyzer
from benchmarks.serving_overhead import perf_parser, perf_run
from tests.server_utils import ServerHandle, free_ports, link_example, running_server

#: Each case: (model, protocol, perf_analyzer's --shape for its input).
CASES: dict[str, tuple[str, str, str]] = {
    "cnn_rest": ("cnn", "http", "image:1,28,28"),
    "mlp_grpc": ("mlp", "grpc", "image:784"),
}
#: The issue's bar: 4 servers of 4 cores each against one.
BAR_SERVERS, BAR_GROUP_CORES, BAR_RATIO = 4, 4, 3.5
#: perf_analyzer's concurrency per group of cores, by default.
CONCURRENCY_PER_GROUP = 16


def main() -> int:
    args = _parse_args()
    perf = PerfAnalyzer.find(args.perf_venv, judge_stability=not args.quick)
    topology = read_topology(SYSFS, args.server_cpus or os.sched_getaffinity(0))
    groups = core_groups(args.groups or min(BAR_SERVERS, len(topology.cpus)), topology)
    counts = args.servers or [k for k in (1, 2, 4) if k <= len(groups)]
    if max(counts) > len(groups):
        raise SystemExit(f"--servers {max(counts)} needs as many groups; --groups gives {len(groups)}")
    concurrency = args.concurrency or CONCURRENCY_PER_GROUP * len(groups)
    output: Path = args.output or (
        SCRATCH / "cluster_scaling-quick.json"
        if args.quick
        else RESULTS / f"cluster_scaling-{len(topology.cpus)}cores.json"
    )
    work = SCRATCH / "cluster_scaling"
    shutil.rmtree(work, ignore_errors=True)
    for model, _, _ in CASES.values():
        link_example(work / "repo", model)
    settings = {
        "server_cpus": format_cpus(topology.ids),
        "client_cpus": format_cpus(args.client_cpus) if args.client_cpus else None,
        "groups": [format_cpus(group) for group in groups],
        "servers": counts,
        "cases": {name: {"model": m, "protocol": p} for name, (m, p, _) in CASES.items()},
        "concurrency": concurrency,
        "measurement_request_count": args.request_count,
        "repeats": args.repeats,
        "grpc_channel_max_share_count": 1,
    }
    report = report_head("cluster_scaling", settings)
    report["server_commands"], report["runs"] = {}, []
    grpc_perf = dataclasses.replace(perf, env={**perf.env, "TRITON_CLIENT_GRPC_CHANNEL_MAX_SHARE_COUNT": "1"})
    for repeat in range(args.repeats):
        for k in counts if repeat % 2 == 0 else counts[::-1]:
            with node_servers(work / "repo", groups[:k]) as servers:
                report["server_commands"][str(k)] = [process_command(server.pid) for server in servers]
                for case, (model, protocol, shape) in CASES.items():
                    client = grpc_perf if protocol == "grpc" else perf
                    run = _run(client, servers, model, protocol, shape, concurrency, repeat, args)
                    report["runs"].append({"servers": k, "case": case, **run})
    report["load_end"] = load_average()
    report["cases"] = _cases(report["runs"], counts)
    report["bar"] = _bar(report["cases"], groups, counts)
    return finish_report(report, output, _plot, _print)


def _parse_args() -> argparse.Namespace:
    parser = perf_parser(__doc__, request_count=4000)
    parser.add_argument("--groups", type=int, help="groups the server CPUs are cut into (default: 4, or each CPU)")
    parser.add_argument(
        "--servers", type=lambda s: [int(k) for k in s.split(",")], help="server counts (default 1,2,4 up to groups)"
    )
    parser.add_argument("--concurrency", type=int, help=f"perf_analyzer's (default {CONCURRENCY_PER_GROUP} per group)")
    parser.add_argument("--server-cpus", type=parse_cpus, help="the CPUs to cut into groups (default: every usable)")
    parser.add_argument("--client-cpus", type=parse_cpus, help="run perf_analyzer on these CPUs (default: any)")
    args = parser.parse_args()
    args.repeats = args.repeats or (1 if args.quick else 3)
    args.request_count = args.request_count or (1000 if args.quick else 4000)
    return args


@contextlib.contextmanager
def node_servers(repository: Path, groups: list[list[int]]) -> Iterator[list[ServerHandle]]:
    """A server per group on the same two ports (`--reuse-port`), each on its group's cores (`--cpus`)."""
    http_port, grpc_port = free_ports(2)
    with contextlib.ExitStack() as stack:
        servers = [
            stack.enter_context(
                running_server(repository, "--reuse-port", "--cpus", format_cpus(group), ports=(http_port, grpc_port))
            )
            for group in groups
        ]
        yield servers


def _run(
    perf: PerfAnalyzer,
    servers: list[ServerHandle],
    model: str,
    protocol: str,
    shape: str,
    concurrency: int,
    repeat: int,
    args: argparse.Namespace,
) -> dict[str, Any]:
    """One perf_analyzer run through the shared ports: its figures, and each server's CPU over it (perf_run counts
    the first server's alone)."""
    cpu = [TreeCPU(server.pid) for server in servers]
    before = [tree.sample() for tree in cpu]
    with pinned(args.client_cpus or None):  # perf_analyzer, started now, inherits it
        name = f"scaling{len(servers)}"
        run = perf_run(perf, servers[0], protocol, concurrency, repeat, args.request_count, name, model=model,
                       shape=shape)  # fmt: skip
    each = [(tree.sample() - start) / run["wall_s"] for tree, start in zip(cpu, before, strict=True)]
    run["server_cores_each"] = each
    run["other_cores"] += run["server_cores"] - sum(each)
    run["server_cores"] = sum(each)
    cores = " + ".join(f"{c:.2f}" for c in each)
    print(
        f"  {len(servers)} server(s): {cores} cores; others (all servers counted) {run['other_cores']:.2f}", flush=True
    )
    return run


def _cases(runs: list[dict[str, Any]], counts: list[int]) -> dict[str, Any]:
    """Per case and server count: the median req/s and p50 of the repeats, every repeat's req/s, the servers' CPU,
    each server's (by its place), and the req/s over one server's."""
    cases: dict[str, Any] = {}
    for case in CASES:
        entries: dict[str, Any] = {}
        for k in counts:
            done = [r for r in runs if r["case"] == case and r["servers"] == k and "throughput_rps" in r]
            entries[str(k)] = {
                "repeats": sum(r["case"] == case and r["servers"] == k for r in runs),
                "repeats_ok": len(done),
                "throughput_rps": statistics.median(r["throughput_rps"] for r in done) if done else None,
                "throughput_rps_all": [r["throughput_rps"] for r in done],
                "p50_ms": statistics.median(r["p50_ms"] for r in done) if done else None,
                "server_cores": statistics.median(r["server_cores"] for r in done) if done else None,
                "server_cores_each": [statistics.median(r["server_cores_each"][i] for r in done) for i in range(k)]
                if done
                else [],
                "other_cores": statistics.median(r["other_cores"] for r in done) if done else None,
            }
        one = entries.get("1", {}).get("throughput_rps")
        for entry in entries.values():
            entry["ratio"] = entry["throughput_rps"] / one if one and entry["throughput_rps"] else None
        cases[case] = entries
    return cases


def _bar(cases: dict[str, Any], groups: list[list[int]], counts: list[int]) -> dict[str, Any]:
    """The issue's bar, judged only where it was run as stated: 4 servers of 4 cores each against one."""
    target = f">= {BAR_RATIO}x one server's req/s with {BAR_SERVERS} servers of {BAR_GROUP_CORES} cores each"
    measured = {case: entries.get(str(BAR_SERVERS), {}).get("ratio") for case, entries in cases.items()}
    if BAR_SERVERS not in counts or any(len(group) != BAR_GROUP_CORES for group in groups[:BAR_SERVERS]):
        sizes = sorted({len(group) for group in groups})
        why = f"not measured: {len(groups)} group(s) of {'/'.join(map(str, sizes))} core(s) here"
        return {"target": target, "measured": measured, "pass": None, "note": why}
    passed = all(ratio is not None and ratio >= BAR_RATIO for ratio in measured.values())
    return {"target": target, "measured": measured, "pass": passed}


def _plot(report: dict[str, Any], path: Path) -> None:
    fig = figure(11, 4.5)
    axes = fig.subplots(1, len(CASES))
    for ax, (case, entries) in zip(axes, report["cases"].items(), strict=True):
        counts = [int(k) for k in entries]
        x = np.arange(len(counts))
        medians = [entries[str(k)]["throughput_rps"] or 0.0 for k in counts]
        ax.bar(x, medians, color="C0", alpha=0.8, label="median")
        for i, k in enumerate(counts):
            points = entries[str(k)]["throughput_rps_all"]
            ax.plot([i] * len(points), points, "k.", markersize=5)
            ratio = entries[str(k)]["ratio"]
            if ratio is not None:
                ax.annotate(f"{ratio:.2f}×", (i, medians[i]), ha="center", va="bottom", fontsize=9)
        if medians and medians[0]:
            ax.plot(x, [medians[0] * k for k in counts], "C3--", label="k × one server")
        groups = report["settings"]["groups"]
        ax.set_xticks(x, [f"{k} server{'s' * (k > 1)}\nCPUs {' | '.join(groups[:k])}" for k in counts], fontsize=8)
        model, protocol = report["settings"]["cases"][case].values()
        ax.set_title(f"{model} over {'REST' if protocol == 'http' else 'gRPC'}")
        ax.set_ylabel("req/s (median; dots: repeats)")
        ax.legend(fontsize="small")
    machine = report["machine"]
    fig.suptitle(
        f"Node servers sharing the ports, perf_analyzer c={report['settings']['concurrency']} — "
        f"{machine['cpu_model']}, {machine['cores_usable']} usable CPUs"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def _print(report: dict[str, Any], output: Path) -> None:
    settings = report["settings"]
    print(
        "\n| case | servers | their CPUs | req/s (median) | each repeat | × one server | p50 ms | server cores (each) |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for case, entries in report["cases"].items():
        for k, entry in entries.items():
            if entry["throughput_rps"] is None:
                print(f"| {case} | {k} | {', '.join(settings['groups'][: int(k)])} | failed | | | | |")
                continue
            each = " + ".join(f"{c:.2f}" for c in entry["server_cores_each"])
            print(
                f"| {case} | {k} | {', '.join(settings['groups'][: int(k)])} | {entry['throughput_rps']:,.0f} | "
                + ", ".join(f"{t:,.0f}" for t in entry["throughput_rps_all"])
                + (
                    f" ({entry['repeats'] - entry['repeats_ok']} unstable)"
                    if entry["repeats_ok"] < entry["repeats"]
                    else ""
                )
                + f" | {_times(entry['ratio'])} | {ms_text(entry['p50_ms'])} | {entry['server_cores']:.2f} ({each}) |"
            )
    bar = report["bar"]
    verdict = {True: "PASS", False: "FAIL", None: bar.get("note", "")}[bar["pass"]]
    ratios = ", ".join(f"{case} {_times(r)}" for case, r in bar["measured"].items())
    print(f"\nbar: {bar['target']}: {ratios}: {verdict}")
    print(f"load average {report['load_start']} → {report['load_end']}; wrote {output}")


def _times(ratio: float | None) -> str:
    """A ratio for the table, or "-" where a run perf_analyzer could not measure left none (a busy machine)."""
    return "-" if ratio is None else f"{ratio:.2f}×"


if __name__ == "__main__":
    raise SystemExit(main())
