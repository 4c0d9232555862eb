"""mCache in simulation: every eviction policy × the paper's four workloads × cache sizes of 20-80%, on measured
figures of real models, against the paper's bars and the offline oracle.

    .venv/bin/python -m benchmarks.mcache.simulate                    # measures the models first (~5 minutes)
    .venv/bin/python -m benchmarks.mcache.simulate --models benchmarks/results/mcache_simulate.json   # reuse them
    .venv/bin/python -m benchmarks.mcache.simulate --quick            # 1 seed, 600 requests, under results/tmp/

The workload is the paper's §6.1 one (`adaserve.cache.workload`): the Azure Functions 2019 sample's HTTP functions
at or below the 90th popularity percentile, each given a model by random / round-robin / quantile / quantile-r
assignment, downsampled to --requests requests over the sample's 8 hours. Each cell is replayed twice through
`adaserve.cache.simulator`, which runs the same residency core and policy objects as the server:

* open loop at the trace's times: hit ratio, mean model-load time per request (the paper's "model loading time",
  0 for a hit), mean and p99 latency;
* closed loop, one client sending the same requests back to back: throughput, the requests a second one device
  sustains on the sequence. With the trace's own timing the device is idle most of the time and every policy's
  throughput is the arrival rate; the paper's throughput differences are those of a busy server.

Cache size is a share of the models' total size. Every figure is the mean over --seeds workload seeds (each seed
draws other invocation times, another downsample and another random assignment); the JSON keeps every seed.
The bars are the paper's, on the random workload as in its §6.3: IAM's throughput ≥ 1.5× LFU's at 40% and ≥ 2.39× at
80%; IAM's mean load time ≥ 27%, 43%, 62% below LFU's at 40%, 60%, 80%.

Beside every cell, the limit: the least load time any eviction schedule can have on its sequence
(`adaserve.cache.bound`), both as its LP relaxation (a lower bound) and as the exact optimum of the integer program
(`--milp-seconds` per cell; a cell that runs out reports the best schedule found and says so). In the closed loop
with one client a request's load and run follow one another, so the optimum gives exactly the most throughput any
policy, online or offline, can reach; in the open loop each load's own request waits at least the load, so it bounds
the mean load time. Each paper bar is reported with the most that the LP leaves possible over LFU: a bar above it
cannot be met on these sequences by any policy. `optimum_distance` gives each policy's load time (closed loop) and
throughput as ratios to the exact optimum's, and `optimum_bars` the issue's bars for IAM: throughput ≥ 0.85× the
optimum's, mean load time no more than GDSF's, and at least 14 / 23 / 35% below LRU's at 40 / 60 / 80%, each
against the better form of the baseline: as defined, one victim at a time, or taking its victims as a set as IAM
does ("gdsf-cover", "lru-cover").
`known_rate_bars` are the same bars for IAM given each model's true rate (`iam-known-rate`): how far IAM could go
with a perfect rate estimate, where `foresight` says what knowing each next request would give.

A sparse trace, each model requested hours apart, is the same workload with few requests: `--requests 60` puts
about 5 requests on each of the 11 models over the 8 hours.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from adaserve.cache.bound import DEFAULT_TIME_LIMIT_S, schedule_problem
from adaserve.cache.policies import POLICIES
from adaserve.cache.simulator import ModelFigures, models_from, simulate
from adaserve.cache.workload import ASSIGNMENTS, Request, build_workload
from benchmarks.common import RESULTS, ROOT, SCRATCH, command_line, figure, load_window, machine, write_json
from benchmarks.mcache.models import measure_models

TRACE = ROOT.parent / "shared" / "data" / "traces" / "azure-functions-2019" / "500_invocations.csv"
SHARES = (0.2, 0.4, 0.6, 0.8)
#: The paper's bars (§6.3, Table 3), random workload: IAM over LFU.
THROUGHPUT_BARS = {0.4: 1.5, 0.8: 2.39}
LOAD_TIME_BARS = {0.4: 0.27, 0.6: 0.43, 0.8: 0.62}
#: Issue 57's bars on the random workload: IAM's throughput over the exact optimum's, and its cut in mean load time
#: below LRU's.
OPTIMUM_THROUGHPUT_BAR = 0.85
LRU_LOAD_TIME_BARS = {0.4: 0.14, 0.6: 0.23, 0.8: 0.35}
METRICS = ("hit_ratio", "mean_load_wait_s", "loading_s", "throughput_rps", "mean_latency_s", "p99_latency_s")
#: The limit's figures, per cell.
LIMIT_KEYS = (
    "least_load_s",
    "most_throughput_rps",
    "least_mean_load_wait_s",
    "optimal_load_s",
    "optimal_bound_s",
    "optimal_throughput_rps",
    "optimal_mean_load_wait_s",
    "optimal_proven",
)


def run_cells(
    models: dict[str, ModelFigures],
    requests: int,
    seeds: list[int],
    log: Any = print,
    milp_seconds: float = DEFAULT_TIME_LIMIT_S,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """One row per seed × assignment × share × policy, open-loop and closed-loop figures side by side; and one per
    seed × assignment × share with the limit no policy passes (`limit`)."""
    total = sum(m.size_bytes for m in models.values())
    load_s = {name: m.load_s for name, m in models.items()}
    rows, limits = [], []
    for seed in seeds:
        for assign in ASSIGNMENTS:
            workload = build_workload(TRACE, load_s, assign=assign, requests=requests, seed=seed)
            for share in SHARES:
                budget = int(total * share)
                cell = {"seed": seed, "assign": assign, "share": share}
                limits.append({**cell, **limit(workload.requests, models, budget, milp_seconds)})
                for policy in POLICIES:
                    open_loop = simulate(workload.requests, models, budget, policy)
                    closed = simulate(workload.requests, models, budget, policy, clients=1)
                    rows.append(
                        {
                            "seed": seed,
                            "assign": assign,
                            "share": share,
                            "policy": policy,
                            "open_loop": _figures(open_loop.as_dict()),
                            "closed_loop": _figures(closed.as_dict()),
                        }
                    )
        log(f"seed {seed}: {len(rows)} cells so far")
    return rows, limits


def limit(
    requests: Sequence[Request],
    models: dict[str, ModelFigures],
    budget: int,
    milp_seconds: float = DEFAULT_TIME_LIMIT_S,
) -> dict[str, float]:
    """The least load time any schedule can have on the requests' sequence, as the LP's bound and the integer
    program's optimum, and what each leaves possible: the most throughput of the closed loop with one client
    (execution and loads one after the other), the least mean load time of the open loop."""
    sequence = [request.model for request in requests]
    executing = sum(models[name].exec_s for name in sequence)
    problem = schedule_problem(sequence, models, budget)  # built once, solved both ways
    least = problem.relaxed_s()
    optimum = problem.optimum(milp_seconds)
    return {
        "least_load_s": least,
        "most_throughput_rps": len(sequence) / (executing + least),
        "least_mean_load_wait_s": least / len(sequence),
        "optimal_load_s": optimum.load_s,
        "optimal_bound_s": optimum.bound_s,
        "optimal_throughput_rps": len(sequence) / (executing + optimum.load_s),
        "optimal_mean_load_wait_s": optimum.load_s / len(sequence),
        "optimal_proven": float(optimum.optimal),
    }


def summarize_limits(limits: list[dict[str, Any]]) -> dict[str, dict[str, dict[str, float]]]:
    """Per assignment and share, the mean of the limit's figures over the seeds (as `summarize` takes policies')."""
    cells: dict[tuple[str, float], list[dict[str, Any]]] = {}
    for row in limits:
        cells.setdefault((row["assign"], row["share"]), []).append(row)
    summary: dict[str, dict[str, dict[str, float]]] = {}
    for (assign, share), group in cells.items():
        summary.setdefault(assign, {})[f"{share:.0%}"] = {
            key: statistics.fmean(r[key] for r in group) for key in LIMIT_KEYS
        }
    return summary


def _figures(result: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in result.items() if key != "policy"}


def _metric(row: dict[str, Any], metric: str) -> float:
    """Throughput and total load time from the closed loop (the busy server's, which the optimum's figures are
    for), everything else from the open loop at the trace's times."""
    return float(row["closed_loop" if metric in ("throughput_rps", "loading_s") else "open_loop"][metric])


def summarize(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per assignment / share / policy: the mean of every metric over the seeds, and its range."""
    cells: dict[tuple[str, float, str], list[dict[str, Any]]] = {}
    for row in rows:
        cells.setdefault((row["assign"], row["share"], row["policy"]), []).append(row)
    summary: dict[str, dict[str, Any]] = {}
    for (assign, share, policy), group in cells.items():
        entry: dict[str, float | list[float]] = {}
        for metric in METRICS:
            values = [_metric(row, metric) for row in group]
            entry[metric] = statistics.fmean(values)
            entry[metric + "_range"] = [min(values), max(values)]
        summary.setdefault(assign, {}).setdefault(f"{share:.0%}", {})[policy] = entry
    return summary


def bars(
    summary: dict[str, dict[str, Any]], limits: dict[str, dict[str, dict[str, float]]], policy: str = "iam"
) -> list[dict[str, Any]]:
    """The paper's bars for `policy` against LFU on the random workload (the bars proper for IAM; for IAM with
    foresight, what knowing each model's next request would give), each with the most any policy could reach
    (`limits`) and whether that reaches the bar."""
    random, limit_of = summary["random"], limits["random"]
    label = {"iam": "IAM", "iam-foresight": "IAM with foresight"}[policy]
    checks = []
    for share, target in THROUGHPUT_BARS.items():
        cell, most = random[f"{share:.0%}"], limit_of[f"{share:.0%}"]["most_throughput_rps"]
        ratio = throughput_ratio(cell[policy], cell["lfu"])
        possible = most / cell["lfu"]["throughput_rps"]
        checks.append(
            {
                "bar": f"{label} vs LFU throughput at {share:.0%}",
                "target": f">= {target}x",
                "measured": f"{ratio:.3f}x",
                "value": ratio,
                "pass": ratio >= target,
                "most_possible": f"{possible:.3f}x",
                "reachable": possible >= target,
            }
        )
    for share, target in LOAD_TIME_BARS.items():
        cell, least = random[f"{share:.0%}"], limit_of[f"{share:.0%}"]["least_mean_load_wait_s"]
        reduction = load_time_reduction(cell[policy], cell["lfu"])
        lfu_wait = cell["lfu"]["mean_load_wait_s"]
        possible = 1 - least / lfu_wait if lfu_wait else 0.0
        checks.append(
            {
                "bar": f"{label} vs LFU mean load time at {share:.0%}",
                "target": f">= {target:.0%} lower",
                "measured": f"{reduction:.1%} lower",
                "value": reduction,
                "pass": reduction >= target,
                "most_possible": f"{possible:.1%} lower",
                "reachable": possible >= target,
            }
        )
    return checks


def throughput_ratio(policy: dict[str, Any], lfu: dict[str, Any]) -> float:
    """A policy's throughput over LFU's (the figures of one cell each)."""
    return float(policy["throughput_rps"] / lfu["throughput_rps"])


def load_time_reduction(policy: dict[str, Any], other: dict[str, Any]) -> float:
    """How much lower a policy's mean load time is than another's, LFU's for the paper (0 when that never waited)."""
    return float(1 - policy["mean_load_wait_s"] / other["mean_load_wait_s"]) if other["mean_load_wait_s"] else 0.0


def oracle_distance(summary: dict[str, dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Per policy, averaged over every workload and cache size: hit-ratio points below the oracle, mean load time
    and throughput as ratios to the oracle's."""
    gaps: dict[str, dict[str, list[float]]] = {}
    for shares in summary.values():
        for policies in shares.values():
            oracle = policies["oracle"]
            for policy, entry in policies.items():
                into = gaps.setdefault(policy, {"hit_ratio_gap": [], "load_time_ratio": [], "throughput_ratio": []})
                into["hit_ratio_gap"].append(oracle["hit_ratio"] - entry["hit_ratio"])
                if oracle["mean_load_wait_s"] > 0:
                    into["load_time_ratio"].append(entry["mean_load_wait_s"] / oracle["mean_load_wait_s"])
                into["throughput_ratio"].append(entry["throughput_rps"] / oracle["throughput_rps"])
    return _means(gaps)


def optimum_distance(
    summary: dict[str, dict[str, Any]], limits: dict[str, dict[str, dict[str, float]]]
) -> dict[str, dict[str, float]]:
    """Per policy, averaged over every workload and cache size: its closed-loop load time and throughput as ratios
    to the exact optimum's (1.0 is the best any schedule can do)."""
    ratios: dict[str, dict[str, list[float]]] = {}
    for assign, shares in summary.items():
        for share, policies in shares.items():
            best = limits[assign][share]
            for policy, entry in policies.items():
                into = ratios.setdefault(policy, {"load_time_ratio": [], "throughput_ratio": []})
                if best["optimal_load_s"] > 0:
                    into["load_time_ratio"].append(entry["loading_s"] / best["optimal_load_s"])
                into["throughput_ratio"].append(entry["throughput_rps"] / best["optimal_throughput_rps"])
    return _means(ratios)


def _means(per_policy: dict[str, dict[str, list[float]]]) -> dict[str, dict[str, float]]:
    """The mean of each policy's lists (NaN for an empty one)."""
    return {
        policy: {key: statistics.fmean(values) if values else float("nan") for key, values in into.items()}
        for policy, into in per_policy.items()
    }


def optimum_bars(
    summary: dict[str, dict[str, Any]], limits: dict[str, dict[str, dict[str, float]]], policy: str = "iam"
) -> list[dict[str, Any]]:
    """Issue 57's bars for `policy` on the random workload, on the seeds' means: throughput against the exact
    optimum's at every size, mean load time against GDSF's at every size and against LRU's at 40 / 60 / 80%. The
    bars proper are IAM's; for IAM with known rates they say how far a perfect estimate of each model's rate goes."""
    random, best = summary["random"], limits["random"]
    label = {"iam": "IAM", "iam-known-rate": "IAM with known rates"}[policy]
    checks = []
    for share in SHARES:
        key = f"{share:.0%}"
        ratio = random[key][policy]["throughput_rps"] / best[key]["optimal_throughput_rps"]
        target = OPTIMUM_THROUGHPUT_BAR
        checks.append(
            _check(f"{label} throughput vs the optimum at {key}", f">= {target}x", f"{ratio:.3f}x", ratio, target)
        )
    for share in SHARES:
        key = f"{share:.0%}"
        gdsf = stronger(random[key], "gdsf")
        ours, theirs = random[key][policy]["mean_load_wait_s"], random[key][gdsf]["mean_load_wait_s"]
        measured = f"{ours * 1e3:.1f} vs {theirs * 1e3:.1f} ms ({gdsf})"
        checks.append(_check(f"{label} vs GDSF mean load time at {key}", "<= GDSF's", measured, theirs - ours, 0.0))
    for share, target in LRU_LOAD_TIME_BARS.items():
        key = f"{share:.0%}"
        lru = stronger(random[key], "lru")
        reduction = load_time_reduction(random[key][policy], random[key][lru])
        measured = f"{reduction:.1%} lower ({lru})"
        checks.append(
            _check(f"{label} vs LRU mean load time at {key}", f">= {target:.0%} lower", measured, reduction, target)
        )
    return checks


def stronger(cell: dict[str, Any], baseline: str) -> str:
    """The form of `baseline`, as defined or taking its victims as a set (`-cover`, `RankedPolicy`), with the lower
    mean load time in `cell`: the issue's bars are against the better of the two."""
    return min((baseline, f"{baseline}-cover"), key=lambda name: float(cell[name]["mean_load_wait_s"]))


def _check(bar: str, target: str, measured: str, value: float, least: float) -> dict[str, Any]:
    """A bar met when `value` is at least `least`."""
    return {"bar": bar, "target": target, "measured": measured, "value": value, "pass": value >= least}


#: The limit's figure drawn in a plot's row, where it has one.
LIMIT_OF = {"mean_load_wait_s": "least_mean_load_wait_s", "throughput_rps": "most_throughput_rps"}


def plot(
    summary: dict[str, dict[str, Any]], limits: dict[str, dict[str, dict[str, float]]], path: Path, title: str
) -> None:
    rows = (
        ("hit_ratio", "hit ratio", 1.0),
        ("mean_load_wait_s", "mean load time (ms)", 1e3),
        ("throughput_rps", "throughput, closed loop (req/s)", 1.0),
    )
    fig = figure(16, 10)
    axes = fig.subplots(len(rows), len(ASSIGNMENTS), squeeze=False)
    for column, assign in enumerate(ASSIGNMENTS):
        for line, (metric, label, scale) in enumerate(rows):
            ax = axes[line][column]
            for policy in POLICIES:
                xs = [share * 100 for share in SHARES]
                ys = [summary[assign][f"{share:.0%}"][policy][metric] * scale for share in SHARES]
                style = {"linewidth": 2.5} if policy in ("iam", "lfu") else {"linewidth": 1.2}
                ax.plot(xs, ys, marker="o", label=policy, linestyle="--" if policy == "oracle" else "-", **style)
            if metric in LIMIT_OF:
                bound = [limits[assign][f"{share:.0%}"][LIMIT_OF[metric]] * scale for share in SHARES]
                ax.plot(xs, bound, color="black", linestyle=":", linewidth=2, label="limit (no policy passes)")
            ax.set_xticks([share * 100 for share in SHARES])
            ax.grid(alpha=0.3)
            if line == 0:
                ax.set_title(assign)
            if line == len(rows) - 1:
                ax.set_xlabel("cache size (% of the models' total)")
            if column == 0:
                ax.set_ylabel(label)
    axes[0][0].legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def format_table(summary: dict[str, dict[str, Any]]) -> str:
    lines = [f"{'workload':<12}{'size':>5}  " + "".join(f"{p:>20}" for p in POLICIES)]
    lines.append(" " * 19 + "".join(f"{'hit / load ms / rps':>20}" for _ in POLICIES))
    for assign, shares in summary.items():
        for share, policies in shares.items():
            cells = "".join(
                f"{e['hit_ratio']:>7.3f}{e['mean_load_wait_s'] * 1e3:>7.1f}{e['throughput_rps']:>6.1f}"
                for e in (policies[p] for p in POLICIES)
            )
            lines.append(f"{assign:<12}{share:>5}  {cells}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", type=Path, help="measured figures to reuse (a models file or a result JSON)")
    parser.add_argument("--requests", type=int, default=2389, help="requests per workload (the paper's 2,389)")
    parser.add_argument("--seeds", default="0,1,2,3,4", help="workload seeds, comma-separated")
    parser.add_argument("--quick", action="store_true", help="1 seed, 600 requests, output under results/tmp/")
    parser.add_argument("--output", type=Path, help="result JSON (default results/mcache_simulate.json)")
    parser.add_argument(
        "--milp-seconds",
        type=float,
        default=DEFAULT_TIME_LIMIT_S,
        help="time limit of the exact optimum's integer program, per cell (default %(default)s)",
    )
    args = parser.parse_args()
    seeds = [0] if args.quick else [int(s) for s in args.seeds.split(",")]
    requests = 600 if args.quick else args.requests
    output = args.output or (SCRATCH if args.quick else RESULTS) / "mcache_simulate.json"

    record: dict[str, Any] = {
        "benchmark": "mcache_simulate",
        "created": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "command": command_line(),
        "machine": machine(),
        "trace": str(TRACE.relative_to(ROOT.parent)),
        "requests": requests,
        "seeds": seeds,
        "shares": list(SHARES),
        "policies": list(POLICIES),
        "assignments": list(ASSIGNMENTS),
        "milp_seconds": args.milp_seconds,
    }
    if args.models is not None:  # figures measured before: keep when and how busy the machine was then
        source = json.loads(args.models.read_text())
        raw = source.get("models", source)
        before = source.get("models_from") or {}
        record["models_from"] = {
            "file": str(args.models),
            "measured": before.get("measured") or source.get("created"),
            "measured_by": before.get("measured_by") or source.get("command"),
        }
        record["measurement"] = source.get("measurement")
    else:
        with load_window(record.setdefault("measurement", {})):
            raw = measure_models(SCRATCH / "mcache")
    record["models"] = raw
    models = models_from(raw, str(args.models or "measured figures"))
    with load_window(record.setdefault("simulation", {})):
        rows, limit_rows = run_cells(models, requests, seeds, milp_seconds=args.milp_seconds)
    summary = summarize(rows)
    limits = summarize_limits(limit_rows)
    record["summary"] = summary
    record["limits"] = limits
    record["bars"] = bars(summary, limits)
    record["foresight"] = bars(summary, limits, "iam-foresight")
    record["optimum_bars"] = optimum_bars(summary, limits)
    record["known_rate_bars"] = optimum_bars(summary, limits, "iam-known-rate")
    record["oracle_distance"] = oracle_distance(summary)
    record["optimum_distance"] = optimum_distance(summary, limits)
    record["rows"] = rows
    record["limit_rows"] = limit_rows
    write_json(record, output)
    title = (
        f"mCache simulator: {len(models)} measured models, {requests} requests, mean of seeds {seeds} "
        f"(hit ratio and load time open loop at trace times; throughput closed loop, 1 client; dotted: the limit "
        f"no policy passes)"
    )
    plot(summary, limits, output.with_suffix(".png"), title)
    print(format_table(summary))
    for check in record["bars"] + record["foresight"]:
        verdict = "pass" if check["pass"] else "MISS"
        reach = "" if check["reachable"] else ", beyond any policy"
        print(f"{check['bar']}: {check['measured']} (target {check['target']}): {verdict}; most possible "
              f"{check['most_possible']}{reach}")  # fmt: skip
    for check in record["optimum_bars"] + record["known_rate_bars"]:
        print(f"{check['bar']}: {check['measured']} (target {check['target']}): {'pass' if check['pass'] else 'MISS'}")
    unproven = sum(row["optimal_proven"] == 0 for row in limit_rows)
    print(f"exact optimum proven in {len(limit_rows) - unproven} of {len(limit_rows)} cells")
    for policy, ratio in record["optimum_distance"].items():
        print(f"{policy:<13} vs the optimum: load time {ratio['load_time_ratio']:.2f}x, "
              f"throughput {ratio['throughput_ratio']:.2f}x")  # fmt: skip
    for policy, distance in record["oracle_distance"].items():
        print(
            f"{policy:<13} vs oracle: hit ratio -{distance['hit_ratio_gap']:.3f}, load time "
            f"{distance['load_time_ratio']:.2f}x, throughput {distance['throughput_ratio']:.2f}x"
        )
    print(f"wrote {output} and {output.with_suffix('.png')}")


if __name__ == "__main__":
    main()
