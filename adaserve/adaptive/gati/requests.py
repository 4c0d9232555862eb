"""What a request asks of a model's learned caches, read from its parameters (no torch: the server validates here).

- `early_exit` (bool, default true): false runs the request's rows through the whole model.
- `accuracy` (a number in (0, 1]): the agreement with the base model it needs; the worker serves it with the cache
  set composed for the least configured target at or above it (the config's first target when absent).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from adaserve.adaptive.parameters import accuracy_target
from adaserve.errors import InvalidInputError

EARLY_EXIT = "early_exit"


def exit_target(parameters: Mapping[str, Any], default: float) -> float | None:
    """The agreement target a request asks for (`default` when it names none), or None when it turned early exit
    off; InvalidInputError (400) names a bad parameter."""
    early_exit = parameters.get(EARLY_EXIT, True)
    if not isinstance(early_exit, bool):
        raise InvalidInputError(f"parameter '{EARLY_EXIT}' must be true or false, got {early_exit!r}")
    accuracy = accuracy_target(parameters)  # checked even when early exit is off: a bad parameter is a 400
    if not early_exit:
        return None
    return default if accuracy is None else accuracy
