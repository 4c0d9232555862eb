"""Triton's schedule-policy extension: how a request waits in the queue.

A request's `priority` picks its level, and the scheduler's next batch holds the oldest request of the highest
level waiting (`scheduler.py`). Each level has a queue policy (Triton's ModelQueuePolicy: the model's
`default_queue_policy`, or its own in `priority_queue_policy`) that bounds its waiting rows and gives its requests a
timeout; a request whose timeout passes before any of its rows started is refused, or delayed behind the level's
requests still in time. The request's parameters are read before anything is queued, so a bad value is refused
(400) with a message that names it.
"""

from __future__ import annotations

from typing import Any

from adaserve.config import BatchingSpec, QueuePolicySpec
from adaserve.errors import InvalidInputError


def priority_level(parameters: dict[str, Any], batching: BatchingSpec) -> int:
    """Triton's `priority` request parameter (tritonclient's `infer(priority=...)`): the level the request waits at,
    1 the highest. 0, absent, or above the model's `priority_levels`: its default level, as Triton does. With
    priority off (`priority_levels: 0`) every request waits at level 0, in arrival order."""
    value = _whole_number("priority", parameters.get("priority", 0), ">= 0 (1 the highest)")
    levels = batching.priority_levels
    if not levels:
        return 0
    if 0 < value <= levels:
        return value
    return batching.default_priority_level or levels


def queue_policy(batching: BatchingSpec, level: int) -> QueuePolicySpec:
    """The queue policy of `level`: its own if `priority_queue_policy` names it, else the default."""
    return batching.priority_queue_policy.get(level, batching.default_queue_policy)


def queue_timeout_s(parameters: dict[str, Any], policy: QueuePolicySpec) -> float | None:
    """How long a request may wait before its rows start; None: no limit. The policy's `default_timeout_us`, or
    Triton's `timeout` request parameter (tritonclient's `infer(timeout=...)`, microseconds, 0 none) where the policy
    lets it override and it is the shorter. InvalidInputError naming the parameter when it is not such a number,
    counted or not."""
    value = parameters.get("timeout")
    asked = 0 if value is None else _whole_number("timeout", value, "of microseconds >= 0")
    timeout_us = policy.default_timeout_us
    if policy.allow_timeout_override and asked and (not timeout_us or asked < timeout_us):
        timeout_us = asked
    return timeout_us / 1e6 if timeout_us else None


def schedule(parameters: dict[str, Any], batching: BatchingSpec) -> tuple[int, QueuePolicySpec, float | None]:
    """What a request's parameters ask of the queue: its priority level, that level's queue policy, and its timeout
    (seconds, None: no limit). InvalidInputError naming a bad `priority` or `timeout`."""
    level = priority_level(parameters, batching)
    policy = queue_policy(batching, level)
    return level, policy, queue_timeout_s(parameters, policy)


def queue_rank(level: int, *, delayed: bool = False) -> int:
    """The scheduler's order of a request (lower runs first): by level, and within a level those still in time
    before those delayed (Triton's order: a delayed request waits for its level's, ahead of the lower levels')."""
    return 2 * level + delayed


def rank_level(rank: int) -> int:
    """The priority level a `queue_rank` belongs to."""
    return rank // 2


def _whole_number(name: str, value: Any, meaning: str) -> int:
    """`value` of parameter `name` if it is a whole number >= 0 (not a bool), else InvalidInputError naming it."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidInputError(f"parameter '{name}' must be a whole number {meaning}, got {value!r}")
    return value
