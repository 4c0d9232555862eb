"""`adaserve profile MODEL` and `adaserve plan MODEL --batch B`: Packrat from the command line, no server needed.

`profile` measures this machine's ⟨t, b⟩ latency grid for a model and stores it in the model's profile.json (or
reuses the stored one when it fits this machine and model). `plan` prints the worker set the optimizer picks for
⟨T, B⟩, the cores each worker would be pinned to, its expected latency, and the fat instance ⟨1, T, B⟩ beside it.
Both repeat the profile's warnings (a busy machine, cells of unknown stability) on stderr: a plan is only as good
as the measurements behind it.
Errors a user can cause raise `AdaserveError` subclasses; `adaserve.cli.main` prints them and exits with 2.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from typing import Any

from adaserve.arguments import add_model_repository, positive_integer, positive_number
from adaserve.cpu.profiler import (
    STABLE_TRIALS,
    AutoPlanner,
    ProfileError,
    ProfileRecord,
    ProfileSettings,
    WorkerPlan,
    fingerprint,
    load_profile,
    packrat_threads,
    profile_model,
    profile_warnings,
    save_profile,
)
from adaserve.cpu.topology import machine_topology
from adaserve.repository import ModelRepository

__all__ = ["format_plan", "format_profile", "plan_command", "profile_command", "register"]


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add `profile` and `plan` to the `adaserve` command line."""
    profile = subparsers.add_parser(
        "profile",
        help="measure a model's latency for every ⟨threads, batch⟩ on this machine (Packrat profile)",
        description="Time one worker pinned to t cores with t threads for t = 1..T and b = 1, 2, 4, .. up to "
        "max_batch_size, each cell in trials until the last three agree; store the grid in <model dir>/profile.json "
        "under this machine's fingerprint.",
    )
    profile.add_argument("model", help="a model of the repository")
    add_model_repository(profile)
    profile.add_argument("--threads", type=positive_integer, help="T: profile t = 1..T (default: every usable CPU)")
    profile.add_argument("--quick", action="store_true", help="fewer, shorter timings (seconds, not minutes)")
    profile.add_argument(
        "--repeats", type=positive_integer, help="timed runs per trial, at least (default 30, quick 5)"
    )
    profile.add_argument(
        "--stability-percentage",
        type=positive_number,
        metavar="PCT",
        help="a cell is stable when its last 3 trials' mean latencies are each within PCT percent of their mean "
        "(default 10); a profile with an unstable cell is not planned from",
    )
    profile.add_argument(
        "--max-trials",
        type=_trial_count,
        help="trials of a cell before it is stored as unstable (default 10, at least 3)",
    )
    profile.add_argument("--force", action="store_true", help="measure again even if a matching profile exists")
    profile.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")
    profile.set_defaults(func=profile_command)

    plan = subparsers.add_parser(
        "plan",
        help="the worker set ⟨instances, threads, batch⟩ Packrat picks for a batch size, from the profile",
        description="Solve Packrat's 2-D knapsack over the stored profile for ⟨T, B⟩ and print the workers, "
        "their cores, the expected batch latency and the fat instance ⟨1, T, B⟩ for comparison. The profile's "
        "warnings go to stderr; a profile with unstable cells is not planned from (the fat instance is).",
    )
    plan.add_argument("model", help="a model of the repository with a profile of this machine")
    plan.add_argument("--batch", type=positive_integer, required=True, help="B: rows per aggregated batch")
    add_model_repository(plan)
    plan.add_argument("--threads", type=positive_integer, help="T: threads to plan for (default: every usable CPU)")
    plan.add_argument("--json", action="store_true", help="print the plan as JSON")
    plan.set_defaults(func=plan_command)


def profile_command(args: argparse.Namespace) -> int:
    spec = ModelRepository(args.model_repository).read(args.model)
    topology = machine_topology()
    threads = packrat_threads(args.threads, topology)
    machine = fingerprint(topology)
    try:
        found = load_profile(spec.directory, machine, spec)
    except ProfileError as exc:
        print(f"adaserve profile: {exc}; measuring again replaces it", file=sys.stderr)
        found = None
    if isinstance(found, ProfileRecord) and not args.force and _fits(found, threads, args.quick):
        print(f"reusing the profile of {found.created} in {spec.directory / 'profile.json'} (--force measures again)")
    else:
        settings = ProfileSettings.for_run(
            quick=args.quick,
            repeats=args.repeats,
            stability_percentage=args.stability_percentage,
            max_trials=args.max_trials,
        )
        found = profile_model(spec, threads, settings, topology=topology, progress=args.progress)
        print(f"wrote {save_profile(spec.directory, found)}")
    print(format_profile(found))
    for warning in profile_warnings(found):
        print(f"adaserve profile: warning: {warning}", file=sys.stderr)
    return 0


def _trial_count(text: str) -> int:
    """`--max-trials`: the stability rule compares the last 3 trials, so at least 3."""
    value = positive_integer(text)
    if value < STABLE_TRIALS:
        raise argparse.ArgumentTypeError(f"expected {STABLE_TRIALS} or more; got {text!r}")
    return value


def _fits(record: ProfileRecord, threads: int, quick: bool) -> bool:
    """A stored profile serves a new request if it covers T and is at least as thorough as asked."""
    return max(record.threads) >= threads and (quick or not record.settings.quick)


def plan_command(args: argparse.Namespace) -> int:
    spec = ModelRepository(args.model_repository).read(args.model)
    planner = AutoPlanner(spec, threads=args.threads)
    result = planner.plan(args.batch)
    if not result.from_profile:
        print(f"adaserve plan: {result.note}", file=sys.stderr)
    for warning in planner.warnings:
        print(f"adaserve plan: warning: {warning}", file=sys.stderr)
    if args.json:
        print(json.dumps({**plan_json(spec.name, result), "warnings": planner.warnings}, indent=1))
    else:
        print(format_plan(spec.name, result))
    return 0


def format_profile(record: ProfileRecord) -> str:
    """The latency grid as a table: one row per t, one column per b, milliseconds."""
    table = record.profile.latency_s
    lines = [
        f"{record.model} v{record.version} on {record.fingerprint.describe()}; torch {record.torch}; "
        f"{'quick' if record.settings.quick else 'full'} run of {record.created}",
        "mean batch latency (ms)",
        "t \\ b " + "".join(f"{b:>10}" for b in record.batches),
    ]
    for t in record.threads:
        lines.append(f"{t:>5} " + "".join(f"{table[t, b] * 1e3:>10.3f}" for b in record.batches))
    return "\n".join(lines)


def format_plan(model: str, result: WorkerPlan) -> str:
    plan = result.plan
    lines = [f"{model}: T={plan.threads} threads, B={plan.batch} rows ({result.note})"]
    lines.append(f"configuration [(i, t, b)]: {plan.triples}")
    workers = iter(result.workers)
    for instance in plan.instances:
        cpus = " ".join(str(list(next(workers).cpus or ())) for _ in range(instance.count))
        lines.append(
            f"  {instance.count} × ⟨t={instance.threads}, b={instance.batch}⟩  "
            f"{_ms(instance.latency_s)} per batch ({instance.source})  CPUs {cpus}"
        )
    lines.append(f"expected batch latency: {_ms(plan.latency_s)}")
    fat = _ms(plan.fat_latency_s) if plan.fat_latency_s is not None else "unknown"
    lines.append(f"fat instance ⟨1, {plan.threads}, {plan.batch}⟩: {fat} ({plan.fat_source})")
    if plan.speedup is not None:
        lines.append(f"expected speedup over the fat instance: {plan.speedup:.2f}×")
    lines.extend(f"note: {note}" for note in plan.notes if note != result.note)
    return "\n".join(lines)


def plan_json(model: str, result: WorkerPlan) -> dict[str, Any]:
    plan = result.plan
    workers = iter(result.workers)
    return {
        "model": model,
        "threads": plan.threads,
        "batch": plan.batch,
        "from_profile": result.from_profile,
        "note": result.note,
        "instances": [
            {
                "count": i.count,
                "threads": i.threads,
                "batch": i.batch,
                "latency_s": _finite(i.latency_s),
                "source": i.source,
                "cpus": [list(next(workers).cpus or ()) for _ in range(i.count)],
            }
            for i in plan.instances
        ],
        "latency_s": _finite(plan.latency_s),
        "fat_instance": {"latency_s": plan.fat_latency_s, "source": plan.fat_source},
        "speedup": plan.speedup,
        "notes": list(plan.notes),
    }


def _finite(value: float) -> float | None:
    return None if math.isnan(value) else value  # NaN (no profile) is not valid JSON


def _ms(seconds: float) -> str:
    if math.isnan(seconds):
        return "unknown"
    return f"{seconds * 1e3:.3f} ms"
