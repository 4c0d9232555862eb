"""The JSON documents the protocol answers with, built from the server's state: a model's configuration in
Triton's shape (with adaserve's own settings as its parameters), its statistics, and a DAG query's; and the
statistics of several nodes merged into one (a cluster answers for every replica).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterable, Mapping
from typing import Any

from adaserve.config import Interface, ModelConfig, QueuePolicySpec
from adaserve.engine.engine import ModelEngine
from adaserve.engine.stats import DurationCount
from adaserve.planner.planner import PlannerStats
from adaserve.planner.spec import DagConfig


def triton_config(engine: ModelEngine) -> dict[str, Any]:
    config = engine.model.config
    workers = [{"pid": w.pid, "batch": w.batch, "threads": w.threads, "cpus": w.cpus} for w in engine.workers.values()]
    document: dict[str, Any] = {
        **interface_document(config, engine.model.platform),
        "version_policy": version_policy_document(config),
        "instance_group": [{"name": f"worker_{w.id}", "kind": "KIND_CPU", "count": 1} for w in engine.workers.values()],
        "parameters": {
            "batching_policy": {"string_value": config.batching.policy},
            "max_inflight": {"string_value": str(engine.scheduler.max_inflight)},
            "max_busy_threads": {"string_value": str(engine.scheduler.max_busy_threads or 0)},
            "max_busy_threads_saturated": {"string_value": str(engine.scheduler.saturated_busy_threads or 0)},
            "idle_spin_us": {"string_value": str(engine.idle_spin_us)},
            "share_cores": {"string_value": str(engine.shares_cores).lower()},
            "worker_set": {"string_value": json.dumps(worker_set_document(engine))},
            "max_queue_size": {"string_value": str(config.max_queue_size)},
            "pool_slots": {"string_value": str(engine.slots)},
            "workers": {"string_value": json.dumps(workers)},
            "early_exit": {"string_value": engine.early_exit or "off"},
        },
    }
    document["dynamic_batching"] = dynamic_batching_document(config)
    document["response_cache"] = {"enable": config.response_cache.enable}
    return document


def version_policy_document(config: ModelConfig) -> dict[str, Any]:
    """The version policy in Triton's form: `{"latest": {"num_versions": N}}`, `{"all": {}}` or `{"specific":
    {"versions": [...]}}`."""
    policy = config.version_policy
    if policy.all:
        return {"all": {}}
    if policy.specific is not None:
        return {"specific": {"versions": list(policy.specific)}}
    return {"latest": {"num_versions": policy.latest or 1}}


def dynamic_batching_document(config: ModelConfig) -> dict[str, Any]:
    """The batching config in Triton's form (`dynamic_batching`), so its tools read it as they read Triton's:
    elastic and none never wait to fill a batch (a delay of 0), and a queue policy's `max_queue_size` of 0 is
    shown as the model's bound, the one that then applies."""
    batching = config.batching

    def queue_policy(policy: QueuePolicySpec) -> dict[str, Any]:
        return {
            "timeout_action": policy.timeout_action.upper(),
            "default_timeout_microseconds": policy.default_timeout_us,
            "allow_timeout_override": policy.allow_timeout_override,
            "max_queue_size": policy.max_queue_size or config.max_queue_size,
        }

    document: dict[str, Any] = {
        "max_queue_delay_microseconds": batching.max_queue_delay_us if batching.policy == "fixed-timeout" else 0,
        "default_queue_policy": queue_policy(batching.default_queue_policy),
    }
    if batching.priority_levels:
        document["priority_levels"] = batching.priority_levels
        document["default_priority_level"] = batching.default_priority_level or batching.priority_levels
        document["priority_queue_policy"] = {
            str(level): queue_policy(policy) for level, policy in sorted(batching.priority_queue_policy.items())
        }
    return document


def worker_set_document(engine: ModelEngine) -> dict[str, Any]:
    """What chose the running worker set and why (Packrat's plan, or the configured/default set)."""
    choice = engine.worker_set
    return {
        "planner": engine.planner.name,
        "reason": choice.reason,
        "batch": choice.batch,
        "workers": [{"batch": w.batch, "threads": w.threads, "cpus": w.cpus} for w in choice.workers],
        "reconfigurations": engine.stats.reconfigurations,
        "background": engine.planner.background,
        **choice.details,
    }


def model_statistics(engine: ModelEngine) -> dict[str, Any]:
    """Triton's statistics of one model version; as in Triton, `success` and `queue` count the requests the
    response cache answered too (`cache_hit`), which no other entry does. A snapshot: a cluster node awaits the
    other nodes' rows before it answers, while this engine's counts go on (perf_analyzer aborts on a document
    whose compute counts disagree)."""
    stats = engine.stats
    # Workers read inputs in place and write outputs straight into the pool, so input and output handling is
    # part of compute_infer; the input/output entries count the same batches with no separate time.
    compute = _duration(stats.compute)
    in_place = {"count": compute["count"], "ns": 0}
    return {
        "name": engine.model.name,
        "version": str(engine.model.version),
        "last_inference": stats.last_inference_ms,
        "inference_count": stats.inference_count,
        "execution_count": stats.execution_count,
        "inference_stats": {
            "success": _duration(stats.success),
            "fail": _duration(stats.fail),
            "queue": _duration(stats.queue),
            "compute_input": dict(in_place),
            "compute_infer": compute,
            "compute_output": dict(in_place),
            "cache_hit": _duration(stats.cache_hit),
            "cache_miss": _duration(stats.cache_miss),
        },
        "batch_stats": [
            {
                "batch_size": size,
                "compute_input": {"count": count, "ns": 0},
                "compute_infer": {"count": count, "ns": stats.batch_ns[size]},
                "compute_output": {"count": count, "ns": 0},
            }
            for size, count in sorted(stats.batches.items())
        ],
    }


def _duration(duration: DurationCount) -> dict[str, int]:
    """A statistics pair as it is now (not the live object, which later requests change)."""
    return {"count": duration.count, "ns": duration.ns}


def merge_statistics(rows: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Statistics rows (`model_statistics`, `dag_statistics`) of several replicas as one row per model version, in
    the order first met: counts and durations summed, per batch size too; `last_inference` the latest. On a cluster
    each node reports its own replicas, and any node answers for all of them."""
    merged: dict[tuple[str, str], dict[str, Any]] = {}
    for row in rows:
        total = merged.get((row["name"], row["version"]))
        if total is None:
            merged[(row["name"], row["version"])] = copy.deepcopy(dict(row))
            continue
        total["last_inference"] = max(total["last_inference"], row["last_inference"])
        total["inference_count"] += row["inference_count"]
        total["execution_count"] += row["execution_count"]
        _add_durations(total["inference_stats"], row["inference_stats"])
        sizes = {entry["batch_size"]: entry for entry in total["batch_stats"]}
        for entry in row["batch_stats"]:
            if entry["batch_size"] in sizes:
                _add_durations(sizes[entry["batch_size"]], entry)
            else:
                total["batch_stats"].append(copy.deepcopy(entry))
        total["batch_stats"].sort(key=lambda entry: entry["batch_size"])
    return list(merged.values())


def _add_durations(total: dict[str, Any], more: Mapping[str, Any]) -> None:
    """Add `more`'s `{"count", "ns"}` entries to `total`'s of the same names (other fields, a batch's size, stay)."""
    for kind, duration in more.items():
        if isinstance(duration, Mapping):
            total[kind] = {"count": total[kind]["count"] + duration["count"], "ns": total[kind]["ns"] + duration["ns"]}


def dag_config(config: DagConfig) -> dict[str, Any]:
    """A DAG query's configuration in Triton's form, its definition (nodes, options, budget policy) as the
    `dag` parameter."""
    return {
        **interface_document(config, "dag"),
        "parameters": {"dag": {"string_value": config.model_dump_json(exclude={"inputs", "outputs"})}},
    }


def interface_document(config: Interface, platform: str) -> dict[str, Any]:
    """What a model and a DAG query show alike in Triton's configuration: name, platform, batch bound, tensors."""
    return {
        "name": config.name,
        "platform": platform,
        "backend": "adaserve",
        "max_batch_size": config.max_batch_size,
        "input": [
            {"name": t.name, "data_type": f"TYPE_{t.datatype}", "dims": list(t.row_shape)} for t in config.inputs
        ],
        "output": [
            {
                "name": t.name,
                "data_type": f"TYPE_{t.datatype}",
                "dims": list(t.row_shape),
                "label_filename": t.label_filename or "",
            }
            for t in config.outputs
        ],
    }


def dag_statistics(name: str, stats: PlannerStats) -> dict[str, Any]:
    """A DAG query's statistics as Triton reports an ensemble's: its requests end to end; the models it ran
    report their own."""
    nothing = {"count": 0, "ns": 0}
    return {
        "name": name,
        "version": "1",
        "last_inference": stats.last_inference_ms,
        "inference_count": stats.rows,
        "execution_count": stats.success.count,
        "inference_stats": {
            "success": _duration(stats.success),
            "fail": _duration(stats.fail),
            **dict.fromkeys(
                ("queue", "compute_input", "compute_infer", "compute_output", "cache_hit", "cache_miss"), nothing
            ),
        },
        "batch_stats": [],
    }
