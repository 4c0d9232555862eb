"""Placement at fleet scale, simulated: 100 and 1,000 nodes replaying the Azure Functions workload through the
placement controller's own objects (`adaserve.distributed.placement`), IAM placement against LRU placement
(ModelMesh's) and random placement, at 40, 60 and 80% memory per node.

    .venv/bin/python -m benchmarks.cluster.fleet            # 5-7 minutes in two processes on two busy cores
    .venv/bin/python -m benchmarks.cluster.fleet --policies iam,lru,random,lru-iam   # twice that (the result's)
    .venv/bin/python -m benchmarks.cluster.fleet --quick    # 100 nodes, seed 0, under results/tmp/

**The workload** is the paper's §6.1 method (`adaserve.cache.workload`), scaled up. The trace's HTTP functions at or
below the 90th popularity percentile (125 of its 500) are drawn with replacement, 11 per node: as many models as
the single-node benchmark (`benchmarks/mcache/simulate.py`) serves. Each drawn copy is a model of its own with the
invocation counts of its source function, and a model of that benchmark's zoo drawn at random (the paper's random
assignment) gives it a measured size and load time (`results/mcache_simulate.json`). The copies make a scaled
trace (under `results/tmp/cluster/`), downsampled as the paper does (`build_workload`: each minute's invocations
spread uniformly within it, then a uniform sample without replacement). The sample keeps `--sample` of the
invocations, 10% by default: about 94 requests per node over the trace's 8 hours, for the 7 or 8 of its 11 models
that the sample requests at all (most functions are invoked a few times in 8 hours). The single-node benchmark
keeps 23%. The paper's 15% took 424 s of CPU with three of the four policies (9 min 50 s on two cores that other
work kept busy); 10% keeps the whole run within the ten minutes this benchmark may take. A seed draws the copies,
their models and the sample.

**Memory per node.** X% means each node's budget is X% of the bytes the requested models would put on a node if
they were spread evenly: X% × (the total bytes of the models the sample requests) / nodes. At 100% every model the
workload asks for could be resident once.

**The replay** runs in virtual time:

* Each node reports its request counts every second, as the node servers do (`Placement.requests`, which feeds
  IAM's request rates).
* A request for a model with a loaded replica is a hit. With a replica loading, it waits for that load (never a
  second one).
* Otherwise `Placement.place` picks a node, whose eviction policy names the victims (unloaded at once), and the
  model loads there for its load time. A node has one loader: loads on a node queue behind each other.
* When no node can make room now (every candidate full of loading models), the request waits and the placement is
  tried again at the next load's end.
* `scale()` is not driven: no model's rate comes near what one replica serves (the result has both figures).

**The policies** pair a placement with the nodes' eviction:

* `iam`: IAM placement with IAM eviction, mCache across a cluster;
* `lru`: ModelMesh's, the node whose least recently used model is the oldest, with LRU eviction;
* `random`: a seeded random node with IAM eviction, so that against `iam` only the placement differs;
* `lru-iam` (with `--policies`): LRU placement with IAM eviction, which tells what IAM's placement does from what
  its eviction does. Its nodes' IAM policies make it nearly as costly as `iam`: the run takes about twice as long.

**Per run**: the cold-start rate (the share of requests that found no loaded replica), each request's wait for a
load (0 for a hit) as a mean and a p99, and loads per request. Each cell gives the median over the seeds (three by
default), and IAM's ratio to each other policy's median (below 1, IAM is better). Every run is kept in `runs`.
With cold starts above 1% of the requests, the p99 is one whole load of some zoo model: 1.355 s (GPT-2, the
longest but Inception's) or 4.365 s (Inception), so it says whether Inception still reloads often enough to fill
the slowest 1%.
"""

from __future__ import annotations

import argparse
import csv
import heapq
import itertools
import math
import os
import statistics
from collections import Counter
from collections.abc import Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from adaserve.cache.simulator import ModelFigures, read_models
from adaserve.cache.workload import FunctionTrace, Request, assign_models, build_workload, popular_cut, read_invocations
from adaserve.distributed.placement import Placement
from adaserve.errors import CacheBusyError
from benchmarks.common import RESULTS, SCRATCH, figure, finish_report, load_window, report_head
from benchmarks.mcache.simulate import TRACE

ZOO = RESULTS / "mcache_simulate.json"
FLEETS = (100, 1000)
MEMORY = (0.4, 0.6, 0.8)
#: name -> (placement, eviction)
POLICIES = {"iam": ("iam", "iam"), "lru": ("lru", "lru"), "random": ("random", "iam"), "lru-iam": ("lru", "iam")}
DEFAULT_POLICIES = ("iam", "lru", "random")
METRICS = ("cold_start_rate", "mean_load_wait_s", "p99_load_wait_s", "loads_per_request")
REPORT_S = 1.0


# -- the workload ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Fleet:
    """A scaled-up workload: the requests (each for one drawn copy) and each copy's zoo model and figures."""

    requests: tuple[Request, ...]
    kinds: dict[str, str]  # copy -> zoo model
    figures: dict[str, ModelFigures]  # copy -> its zoo model's figures
    invocations: int  # of the scaled trace, before the sample


def build_fleet(
    zoo: Mapping[str, ModelFigures], copies: int, sample: float, seed: int, scratch: Path, trace: Path = TRACE
) -> Fleet:
    """`copies` functions drawn with replacement from the trace's kept HTTP functions, each its own model with a
    zoo model drawn at random, downsampled to `sample` of their invocations by the paper's method."""
    source = read_invocations(trace)
    kept, _ = popular_cut([f for f in source.functions if f.trigger == "http"], 0.9)
    draw_rng, assign_rng = (np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(2))
    drawn = [
        FunctionTrace(f"{kept[i].key}#{k}", k + 2, kept[i].trigger, kept[i].counts)
        for k, i in enumerate(draw_rng.integers(len(kept), size=copies))
    ]
    kinds = assign_models(drawn, {name: figures.load_s for name, figures in zoo.items()}, "random", assign_rng)
    names = {copy.key: f"m{k:06d}" for k, copy in enumerate(drawn)}
    path = scratch / f"fleet-{copies}-seed{seed}.csv"
    _write_invocations(path, source.minutes, drawn)
    invocations = sum(copy.popularity for copy in drawn)
    # Round-robin over as many models as functions, all equal, gives the k-th function of the file the k-th name in
    # sorted order: each copy becomes its own model. The popularity cut was made on the source functions already.
    workload = build_workload(
        path,
        dict.fromkeys(names.values(), 0.0),
        assign="round-robin",
        requests=max(1, round(sample * invocations)),
        seed=seed,
        popularity_quantile=1.0,
    )
    if workload.assignment != names:
        raise RuntimeError("the scaled trace's functions did not become one model each")
    return Fleet(
        workload.requests,
        {names[key]: kind for key, kind in kinds.items()},
        {names[key]: zoo[kind] for key, kind in kinds.items()},
        invocations,
    )


def _write_invocations(path: Path, minutes: Sequence[int], functions: Sequence[FunctionTrace]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as stream:
        writer = csv.writer(stream)
        writer.writerow(["HashOwner", "HashApp", "HashFunction", "Trigger", *minutes])
        for function in functions:
            writer.writerow([*function.key.split("/", 2), function.trigger, *function.counts.tolist()])


# -- the replay -----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FleetResult:
    requests: int
    cold_starts: int
    cold_start_rate: float
    loads: int
    loads_per_request: float
    evictions: int
    refused: int  # placements refused for now (CacheBusyError), each retried at the next load's end
    mean_load_wait_s: float  # over every request, 0 for a hit
    p99_load_wait_s: float
    mean_cold_wait_s: float  # over the cold starts only


def simulate_fleet(
    requests: Sequence[Request],
    figures: Mapping[str, ModelFigures],
    nodes: int,
    budget_bytes: int,
    placement: str,
    eviction: str,
    seed: int = 0,
) -> FleetResult:
    """Replay `requests` (in time order) on `nodes` nodes of `budget_bytes` each through one `Placement`."""
    cluster = Placement(eviction=eviction, placement=placement, seed=seed)
    for index in range(nodes):
        cluster.add_node(f"node{index:04d}", budget_bytes)
    return _Replay(cluster, figures).run(requests)


class _Replay:
    """Arrivals, load ends and the nodes' one-second reports, in time order."""

    def __init__(self, cluster: Placement, figures: Mapping[str, ModelFigures]) -> None:
        self.cluster, self.figures = cluster, figures
        self.ends: list[tuple[float, int, str, str]] = []  # (when, sequence, node, model) of each load
        self.sequence = itertools.count()
        self.loader_free: dict[str, float] = {}  # node -> when its loader has finished what it was given
        self.ready_at: dict[str, float] = {}  # model -> when its load ends, while it loads
        self.no_room: dict[str, list[float]] = {}  # model -> arrivals waiting for a node to make room
        self.counts: Counter[str] = Counter()
        self.report_at = math.inf
        self.waits: list[float] = []
        self.cold = self.loads = self.evictions = self.refused = 0

    def run(self, requests: Sequence[Request]) -> FleetResult:
        for request in requests:
            self._advance(request.time_s)
            self._arrive(request.model, request.time_s)
        self._advance(math.inf)
        if self.no_room:
            raise RuntimeError(f"{len(self.no_room)} models never found room")
        waits = np.array(self.waits)
        return FleetResult(
            requests=len(waits),
            cold_starts=self.cold,
            cold_start_rate=self.cold / len(waits),
            loads=self.loads,
            loads_per_request=self.loads / len(waits),
            evictions=self.evictions,
            refused=self.refused,
            mean_load_wait_s=float(waits.mean()),
            p99_load_wait_s=float(np.percentile(waits, 99)),
            mean_cold_wait_s=float(waits.sum() / self.cold) if self.cold else 0.0,
        )

    def _advance(self, until: float) -> None:
        """Everything due up to `until`: load ends before an arrival at the same moment."""
        while True:
            end = self.ends[0][0] if self.ends else math.inf
            if min(end, self.report_at) > until or min(end, self.report_at) == math.inf:
                return
            if self.report_at <= end:
                self.cluster.requests(self.counts, self.report_at)
                self.counts.clear()
                self.report_at = math.inf
            else:
                self._load_ended(*heapq.heappop(self.ends))

    def _arrive(self, model: str, now: float) -> None:
        if not self.counts:
            self.report_at = (math.floor(now / REPORT_S) + 1) * REPORT_S
        self.counts[model] += 1
        if self.cluster.replicas(model):
            self.waits.append(0.0)
            return
        self.cold += 1
        if model in self.no_room:
            self.no_room[model].append(now)
        elif model in self.ready_at or self._load(model, now):
            self.waits.append(self.ready_at[model] - now)
        else:
            self.no_room[model] = [now]

    def _load(self, model: str, now: float) -> bool:
        """Place `model` and queue its load on the node's loader; False when no node can make room now."""
        figures = self.figures[model]
        try:
            decision = self.cluster.place(model, figures.size_bytes, now)
        except CacheBusyError:
            self.refused += 1
            return False
        self.evictions += len(decision.evict)
        self.loads += 1
        end = max(now, self.loader_free.get(decision.node, 0.0)) + figures.load_s
        self.loader_free[decision.node] = self.ready_at[model] = end
        heapq.heappush(self.ends, (end, next(self.sequence), decision.node, model))
        return True

    def _load_ended(self, now: float, _: int, node: str, model: str) -> None:
        figures = self.figures[model]
        self.evictions += len(self.cluster.loaded(node, model, figures.size_bytes, now, load_s=figures.load_s))
        del self.ready_at[model]
        for waiting in list(self.no_room):
            if self._load(waiting, now):
                self.waits += [self.ready_at[waiting] - arrival for arrival in self.no_room.pop(waiting)]


# -- the runs -------------------------------------------------------------------------------------------------------


def run_seed(
    nodes: int,
    seed: int,
    zoo: Mapping[str, ModelFigures],
    sample: float,
    memory: Sequence[float],
    policies: Sequence[str],
    scratch: Path = SCRATCH / "cluster",
) -> list[dict[str, Any]]:
    """Every memory level × policy on one fleet size and seed (one workload, its scaled trace under `scratch`): a
    row each."""
    fleet = build_fleet(zoo, nodes * len(zoo), sample, seed, scratch)
    requested = {request.model for request in fleet.requests}
    total = sum(fleet.figures[model].size_bytes for model in requested)
    rows = []
    for share in memory:
        budget = int(share * total / nodes)
        for name in policies:
            placement, eviction = POLICIES[name]
            result = simulate_fleet(fleet.requests, fleet.figures, nodes, budget, placement, eviction, seed)
            rows.append(
                {
                    "nodes": nodes,
                    "memory": share,
                    "policy": name,
                    "seed": seed,
                    "models_drawn": len(fleet.figures),
                    "models_requested": len(requested),
                    "budget_bytes": budget,
                    "invocations": fleet.invocations,
                    "busiest_model_rps": busiest_rate(fleet.requests),
                    **asdict(result),
                }
            )
    return rows


def busiest_rate(requests: Sequence[Request]) -> float:
    """The most requests any one model had in one minute of the trace, per second: what replication would answer."""
    per_minute = Counter((request.model, int(request.time_s // 60)) for request in requests)
    return max(per_minute.values()) / 60.0


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per fleet size, memory and policy: the median of each metric over the seeds with its range; and IAM's ratio
    to each other policy's medians."""
    cells: dict[tuple[int, float, str], list[dict[str, Any]]] = {}
    for row in rows:
        cells.setdefault((row["nodes"], row["memory"], row["policy"]), []).append(row)
    summary: dict[str, Any] = {}
    for (nodes, share, policy), group in sorted(cells.items()):
        entry: dict[str, Any] = {"seeds": len(group)}
        for metric in METRICS:
            values = [row[metric] for row in group]
            entry[metric] = statistics.median(values)
            entry[metric + "_range"] = [min(values), max(values)]
        summary.setdefault(str(nodes), {}).setdefault(f"{share:.0%}", {})[policy] = entry
    for shares in summary.values():
        for policies in shares.values():
            if "iam" in policies:
                policies["iam_vs"] = {
                    other: {metric: _ratio(policies["iam"][metric], policies[other][metric]) for metric in METRICS}
                    for other in policies
                    if other not in ("iam", "iam_vs")
                }
    return summary


def _ratio(mine: float, theirs: float) -> float | None:
    return mine / theirs if theirs else None


# -- the report -----------------------------------------------------------------------------------------------------


def plot(report: dict[str, Any], path: Path) -> None:
    columns = (
        ("cold_start_rate", "cold-start rate", 1.0),
        ("mean_load_wait_s", "mean load wait per request (ms)", 1e3),
        ("p99_load_wait_s", "p99 load wait (s)", 1.0),
        ("loads_per_request", "loads per request", 1.0),
    )
    summary = report["summary"]
    fig = figure(16, 7)
    axes = fig.subplots(len(summary), len(columns), squeeze=False)
    for line, (nodes, shares) in enumerate(summary.items()):
        xs = [float(share.rstrip("%")) for share in shares]
        for column, (metric, label, scale) in enumerate(columns):
            ax = axes[line][column]
            for policy in report["settings"]["policies"]:
                cells = [shares[share][policy] for share in shares]
                ys = [cell[metric] * scale for cell in cells]
                low = [y - cell[metric + "_range"][0] * scale for y, cell in zip(ys, cells, strict=True)]
                high = [cell[metric + "_range"][1] * scale - y for y, cell in zip(ys, cells, strict=True)]
                ax.errorbar(xs, ys, yerr=[low, high], marker="o", capsize=3, label=policy)
            ax.set_xticks(xs)
            ax.grid(alpha=0.3)
            ax.set_title(f"{nodes} nodes: {label}", fontsize=10)
            if line == len(summary) - 1:
                ax.set_xlabel("memory per node (% of an even share of the models)")
    axes[0][0].legend(fontsize=8)
    settings = report["settings"]
    fig.suptitle(
        f"Placement at fleet scale, simulated: Azure Functions × {settings['models_per_node']} models per node, "
        f"sample {settings['sample']}, median of seeds {settings['seeds']} (bars: their range)"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def _print(report: dict[str, Any], path: Path) -> None:
    """Two Markdown tables: each policy's medians, and IAM's over each other policy's."""
    summary, policies = report["summary"], report["settings"]["policies"]
    print("| nodes | memory | policy | cold-start rate | mean load wait (ms) | p99 load wait (s) | loads / request |")
    print("|---|---|---|---|---|---|---|")
    for nodes, shares in summary.items():
        for share, cells in shares.items():
            for policy in policies:
                e = cells[policy]
                print(
                    f"| {nodes} | {share} | {policy} | {e['cold_start_rate']:.4f} | {e['mean_load_wait_s'] * 1e3:.1f} "
                    f"| {e['p99_load_wait_s']:.3f} | {e['loads_per_request']:.4f} |"
                )
    print("\n| nodes | memory | IAM over | cold-start rate | mean load wait | p99 load wait | loads / request |")
    print("|---|---|---|---|---|---|---|")
    for nodes, shares in summary.items():
        for share, cells in shares.items():
            for other, ratios in cells.get("iam_vs", {}).items():
                figures = " | ".join("-" if ratios[m] is None else f"{ratios[m]:.3f}x" for m in METRICS)
                print(f"| {nodes} | {share} | {other} | {figures} |")
    seeds, rows = report["settings"]["seeds"], report["runs"]
    busiest = max(row["busiest_model_rps"] for row in rows)
    print(
        f"\n{len(rows)} runs, seeds {seeds}; requests per run: {min(r['requests'] for r in rows)}-"
        f"{max(r['requests'] for r in rows)}; the busiest model's busiest minute: {busiest:.3f} req/s, "
        f"one replica of the slowest model serves {report['slowest_replica_rps']:.2f} req/s at batch 1"
    )
    print(f"wrote {path}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", default=",".join(map(str, FLEETS)), help="fleet sizes, comma-separated")
    parser.add_argument("--memory", default=",".join(map(str, MEMORY)), help="memory per node, as shares")
    parser.add_argument("--policies", default=",".join(DEFAULT_POLICIES), help=f"of: {', '.join(POLICIES)}")
    parser.add_argument("--seeds", default="0,1,2", help="workload seeds, comma-separated")
    parser.add_argument("--sample", type=float, default=0.1, help="share of the scaled trace's invocations kept")
    parser.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1), help="processes (default 2)")
    parser.add_argument("--quick", action="store_true", help="100 nodes, seed 0, written under results/tmp/")
    parser.add_argument("--output", type=Path)
    args = parser.parse_args()
    fleets = [100] if args.quick else [int(n) for n in args.nodes.split(",")]
    memory = [float(m) for m in args.memory.split(",")]
    policies = args.policies.split(",")
    seeds = [0] if args.quick else [int(s) for s in args.seeds.split(",")]
    output = args.output or (SCRATCH if args.quick else RESULTS) / "cluster_fleet.json"
    if unknown := sorted(set(policies) - set(POLICIES)):
        parser.error(f"unknown policies {unknown}; they are: {', '.join(POLICIES)}")
    zoo = read_models(ZOO)
    settings = {
        "fleets": fleets,
        "memory": memory,
        "policies": policies,
        "pairs": {name: dict(zip(("placement", "eviction"), POLICIES[name], strict=True)) for name in policies},
        "seeds": seeds,
        "sample": args.sample,
        "models_per_node": len(zoo),
        "report_s": REPORT_S,
        "memory_definition": "each node's budget = memory × (the requested models' total bytes) / nodes",
        "trace": str(TRACE.relative_to(RESULTS.parents[2])),
        "zoo": str(ZOO.relative_to(RESULTS.parents[1])),
    }
    report = report_head("cluster_fleet", settings)
    report["slowest_replica_rps"] = 1.0 / max(figures.exec_s for figures in zoo.values())
    with load_window(report.setdefault("run", {})), ProcessPoolExecutor(args.jobs) as pool:
        jobs = [(nodes, seed) for nodes in sorted(fleets, reverse=True) for seed in seeds]  # the longest first
        futures = [pool.submit(run_seed, nodes, seed, zoo, args.sample, memory, policies) for nodes, seed in jobs]
        rows = [row for future in futures for row in future.result()]
    report["summary"] = summarize(rows)
    report["runs"] = rows
    return finish_report(report, output, plot, _print)


if __name__ == "__main__":
    raise SystemExit(main())
