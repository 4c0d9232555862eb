"""Per-request parameters more than one technique reads, checked one way (the engine refuses a bad one with a 400
that names it before anything is queued). No torch here: the server imports it."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from adaserve.errors import InvalidInputError

__all__ = ["accuracy_target", "latency_target_ms", "number"]


def number(parameters: Mapping[str, Any], name: str) -> float | None:
    """The parameter as a float, None when absent; InvalidInputError unless it is a finite number."""
    value = parameters.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise InvalidInputError(f"parameter '{name}' must be a finite number, got {value!r}")
    return float(value)


def latency_target_ms(parameters: Mapping[str, Any]) -> float | None:
    """`latency_ms`: the latency SLO a request asks for (SLO-NNs' LCAO, a DAG query's budget); None when absent."""
    latency = number(parameters, "latency_ms")
    if latency is not None and not latency > 0:
        raise InvalidInputError(f"parameter 'latency_ms' must be a positive number of milliseconds, got {latency}")
    return latency


def accuracy_target(parameters: Mapping[str, Any]) -> float | None:
    """`accuracy`: the agreement (GATI) or accuracy (SLO-NNs) a request asks for, in (0, 1]; None when absent."""
    accuracy = number(parameters, "accuracy")
    if accuracy is not None and not 0 < accuracy <= 1:
        raise InvalidInputError(f"parameter 'accuracy' must be in (0, 1], got {accuracy}")
    return accuracy
