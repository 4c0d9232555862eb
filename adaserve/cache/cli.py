"""`adaserve model-cache simulate`: replay the paper's §6.1 workload through the eviction policies, no server needed.

    adaserve model-cache simulate --models models.json --assign random,quantile --budget 40%,80% --policy iam,lfu,oracle

prints one row per workload × budget × policy (hit ratio, mean model-load wait, throughput, latency, evictions) and
with --json writes the rows and the run's settings. A percentage budget is of the models' total size.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from adaserve.bench.traces import TraceError
from adaserve.cache.budget import parse_budget
from adaserve.cache.policies import POLICIES
from adaserve.cache.simulator import read_models, simulate
from adaserve.cache.workload import ASSIGNMENTS, build_workload
from adaserve.errors import ConfigError

__all__ = ["register", "simulate_command"]

#: The Azure Functions sample kept beside the project (../shared/data from the repository root).
DEFAULT_TRACE = (
    Path(__file__).resolve().parents[3] / "shared" / "data" / "traces" / "azure-functions-2019" / "500_invocations.csv"
)


def _names(choices: tuple[str, ...]) -> Any:
    def parse(text: str) -> list[str]:
        names = list(choices) if text == "all" else [name.strip().lower() for name in text.split(",")]
        unknown = [name for name in names if name not in choices]
        if unknown:
            raise argparse.ArgumentTypeError(f"unknown {', '.join(unknown)}; expected 'all' or some of {choices}")
        return names

    return parse


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add `model-cache simulate` to the `adaserve` command line."""
    cache = subparsers.add_parser("model-cache", help="replay a workload through mCache's eviction policies, no server")
    commands = cache.add_subparsers(dest="cache_command", required=True)
    run = commands.add_parser(
        "simulate",
        help="replay an Azure Functions workload through the eviction policies (virtual time)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    run.add_argument("--models", type=Path, required=True, help="JSON {name: {size_bytes, load_s, exec_s}}")
    run.add_argument("--trace", type=Path, default=DEFAULT_TRACE, help="invocations CSV (default: the shared one)")
    run.add_argument(
        "--assign", type=_names(ASSIGNMENTS), default=["random"], help="model assignment(s), comma-separated or all"
    )
    run.add_argument("--requests", type=int, default=2389, help="downsample to this many requests (default 2389)")
    run.add_argument("--budget", default="40%", help="bytes (2GiB) or %% of the models' total size; comma-separated")
    run.add_argument(
        "--policy", type=_names(tuple(POLICIES)), default=["iam", "lfu"], help="policies, comma-separated, or all"
    )
    run.add_argument("--seed", type=int, default=0, help="seed of the workload (default 0)")
    run.add_argument("--start-minute", type=int, help="first minute of the window (default: the file's first)")
    run.add_argument("--minutes", type=int, help="length of the window in minutes (default: to the file's end)")
    run.add_argument("--clients", type=int, help="closed loop with this many clients (default: open loop)")
    run.add_argument("--json", type=Path, help="also write the rows and settings to this file")
    run.set_defaults(func=simulate_command)


def simulate_command(args: argparse.Namespace) -> int:
    try:
        models = read_models(args.models)
        total = sum(figures.size_bytes for figures in models.values())
        budgets = [(text.strip(), parse_budget(text, total)) for text in args.budget.split(",")]
        load_s = {name: figures.load_s for name, figures in models.items()}
        rows = []
        for assign in args.assign:
            workload = build_workload(
                args.trace,
                load_s,
                assign=assign,
                requests=args.requests,
                seed=args.seed,
                start_minute=args.start_minute,
                minutes=args.minutes,
            )
            for label, budget in budgets:
                for policy in args.policy:
                    result = simulate(workload.requests, models, budget, policy, clients=args.clients)
                    rows.append({"assign": assign, "budget": label, **result.as_dict()})
    except (ConfigError, TraceError) as exc:
        print(f"adaserve model-cache simulate: error: {exc}", file=sys.stderr)
        return 2
    print(format_rows(rows))
    if args.json:
        settings = {key: str(value) if isinstance(value, Path) else value for key, value in vars(args).items()}
        settings.pop("func")
        args.json.write_text(json.dumps({"settings": settings, "total_bytes": total, "rows": rows}, indent=1) + "\n")
        print(f"wrote {args.json}")
    return 0


def format_rows(rows: list[dict[str, Any]]) -> str:
    header = (
        f"{'assign':<12}{'budget':>8}  {'policy':<8}{'hit ratio':>10}{'load wait s':>12}{'req/s':>9}"
        f"{'mean s':>9}{'p99 s':>9}{'evictions':>10}"
    )
    lines = [header]
    for row in rows:
        lines.append(
            f"{row['assign']:<12}{row['budget']:>8}  {row['policy']:<8}{row['hit_ratio']:>10.3f}"
            f"{row['mean_load_wait_s']:>12.3f}{row['throughput_rps']:>9.3f}{row['mean_latency_s']:>9.3f}"
            f"{row['p99_latency_s']:>9.3f}{row['evictions']:>10}"
        )
    return "\n".join(lines)
