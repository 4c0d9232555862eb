"""Choosing k per request: ACLO for an `accuracy` target, LCAO for a `latency_ms` target (SLO-NNs §2.2, §2.3).

ACLO (accuracy-constrained, latency-optimized): the target a* maps through the calibration to the largest distance
threshold δ whose held-out accuracy a_δ ≥ a*; per input the kernel then takes the smallest k whose estimated
distance d̂(k, x) ≤ δ. A target above what the calibration reached gets δ = 0, i.e. k = 100%.

LCAO (latency-constrained, accuracy-optimized): the largest k with t0 + T(k, β) ≤ τ, where t0 is what the request
already spent (queueing: its arrival time travels with it), β the interference measured now, and T the profile's
p99 compute time at k under β (a p50 would miss the target on half the requests at that k; `latency` says why CPU
time). If no k fits, the fastest k is used. A request with both targets is served by ACLO, whose k
is already the cheapest that meets its accuracy.

This module is light (no compiled code): the engine imports it to refuse a bad target before queueing it.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any, Literal, NamedTuple

import numpy as np

from adaserve.adaptive.parameters import accuracy_target, latency_target_ms

__all__ = ["ARRIVED_NS", "Target", "aclo_threshold", "lcao_index", "parse_target", "prepare_parameters"]

#: The engine adds the request's arrival (CLOCK_MONOTONIC, ns; system-wide, so the worker can compare) under this
#: key to a latency-targeted request's parameters.
ARRIVED_NS = "adaserve.arrived_ns"


class Target(NamedTuple):
    """A request's SLO target (a named tuple: the engine parses one per targeted request before queueing it, and a
    frozen dataclass costs a microsecond to make, a tenth of a small MLP's forward)."""

    mode: Literal["aclo", "lcao"]
    value: float  # accuracy in (0, 1], or latency_ms > 0


def parse_target(parameters: Mapping[str, Any]) -> Target | None:
    """The request's SLO target, or None for a plain dense request; InvalidInputError (400) names a bad one."""
    accuracy = accuracy_target(parameters)
    latency = latency_target_ms(parameters)
    if accuracy is not None:
        return Target("aclo", accuracy)
    if latency is not None:
        return Target("lcao", latency)
    return None


def prepare_parameters(parameters: dict[str, Any]) -> dict[str, Any]:
    """Validate a request's target for a model with an activator (raises before it is queued); a latency target
    gets the arrival time its worker measures t0 from."""
    target = parse_target(parameters)
    if target is None or target.mode == "aclo":
        return parameters
    return {**parameters, ARRIVED_NS: time.monotonic_ns()}


def aclo_threshold(thresholds: np.ndarray, accuracy: np.ndarray, target: float) -> float:
    """The largest δ whose calibrated accuracy (non-increasing in δ) meets the target; 0 (k = 100%) if none."""
    index = int(np.searchsorted(-accuracy, -target, side="right")) - 1
    return float(thresholds[index]) if index >= 0 else 0.0


def lcao_index(latency_ms: Sequence[float], budget_ms: float) -> int:
    """The largest grid index whose latency fits the budget (latencies need not be monotone in k: a noisy spike at
    one k rules out only it). When none fits, the fastest k, the largest of equals: the request misses anyway, and
    on a small model hashing can make a small k no faster than k = 100%."""
    for index in range(len(latency_ms) - 1, -1, -1):
        if latency_ms[index] <= budget_ms:
            return index
    fastest = min(latency_ms)
    return max(index for index, value in enumerate(latency_ms) if value == fastest)
