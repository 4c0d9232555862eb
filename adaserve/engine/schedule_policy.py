"""Triton's schedule-policy extension: the request parameters that say how a request waits in the queue.

`timeout` bounds how long a request may wait before its rows start; `priority` picks its level, and the scheduler's
next batch holds the oldest request of the highest level waiting (`scheduler.py`). Both are read before anything is
queued, so a bad value is refused (400) with a message that names it.
"""

from __future__ import annotations

from typing import Any

from adaserve.config import BatchingSpec
from adaserve.errors import InvalidInputError


def queue_timeout_s(parameters: dict[str, Any]) -> float | None:
    """Triton's `timeout` request parameter (tritonclient's `infer(timeout=...)`): the microseconds a request may
    wait before its rows start; 0 or absent, no limit. InvalidInputError naming it when it is not such a number."""
    value = parameters.get("timeout")
    if value is None or value == 0:
        return None
    return _whole_number("timeout", value, "of microseconds >= 0") / 1e6


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


def _whole_number(name: str, value: Any, meaning: str) -> int:
    """`value` of parameter `name` if it is a whole number >= 0 (not a bool), else InvalidInputError naming it."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidInputError(f"parameter '{name}' must be a whole number {meaning}, got {value!r}")
    return value
