"""The trace extension's settings as values: the server's, the ones each model was given, and how a trace setting
request changes them (`TraceState.changed`).

A value, not the tracer (`trace.py`), so that a cluster's controller can keep the cluster's settings and send them
to every node (`adaserve.distributed`) without importing the engine. A node's tracer adopts a state
(`Tracer.adopt`); a single server's update is a change to its own state, adopted at once.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from adaserve.errors import InvalidInputError

LEVELS = ("TIMESTAMPS", "TENSORS")
#: Setting names as the trace API spells them → `TraceSettings` fields.
SETTINGS = {"trace_level": "level", "trace_rate": "rate", "trace_count": "count", "log_frequency": "log_frequency"}
#: The key of the server's own settings in `TraceState.counted` (no model has an empty name).
SERVER = ""


@dataclass(frozen=True)
class TraceSettings:
    level: tuple[str, ...] = ()  # of LEVELS; empty: OFF
    rate: int = 1000  # trace one request of every `rate`
    count: int = -1  # traces left to take; -1: no limit
    log_frequency: int = 0  # traces per numbered file; 0: all into the trace file itself


@dataclass(frozen=True)
class TraceState:
    """The settings in force: the server's, and per model the settings it was given (the rest follow the
    server's). `serial` counts the changes; `counted` says, per scope (SERVER or a model), the change that last gave
    its `trace_count`, so a tracer adopting the state counts that scope's traces afresh exactly then (any other
    change leaves what is left of the count)."""

    server: TraceSettings
    models: dict[str, dict[str, int | tuple[str, ...]]] = field(default_factory=dict)
    serial: int = 0
    counted: dict[str, int] = field(default_factory=dict)

    def of(self, model_name: str) -> TraceSettings:
        """The settings model `model_name` is sampled under (the server's, for a model given none)."""
        given = self.models.get(model_name)
        return self.server if given is None else replace(self.server, **given)  # type: ignore[arg-type]

    def recounted(self, model_name: str) -> int:
        """The change that last gave model `model_name` (or the server, SERVER) its `trace_count`."""
        if model_name != SERVER and "count" not in self.models.get(model_name, {}):
            model_name = SERVER  # it follows the server's count
        return self.counted.get(model_name, 0)

    def changed(self, initial: TraceSettings, model_name: str, changes: Mapping[str, list[str] | None]) -> TraceState:
        """The state after a trace setting request for `model_name` (empty: the server): each setting given a
        list of strings (the level may have several), or None to clear it (a model's then follows the server's
        again; the server's returns to `initial`, its value at start). For a model, a request with no settings
        drops all of the model's own. An InvalidInputError names a bad setting."""
        parsed = parse_changes(changes)
        serial = self.serial + 1
        counted = {**self.counted, model_name: serial} if "count" in parsed else dict(self.counted)
        if not model_name:
            fields = {key: getattr(initial, key) if value is None else value for key, value in parsed.items()}
            return TraceState(replace(self.server, **fields), self.models, serial, counted)
        given = {} if not changes else {**self.models.get(model_name, {}), **parsed}
        models = {name: own for name, own in self.models.items() if name != model_name}
        kept = {key: value for key, value in given.items() if value is not None}
        if kept:
            models[model_name] = kept
        if "count" not in kept:
            counted.pop(model_name, None)
        return TraceState(self.server, models, serial, counted)


def parse_changes(changes: Mapping[str, list[str] | None]) -> dict[str, Any]:
    """Trace API settings → `TraceSettings` fields (None: clear), each value checked; errors name the setting."""
    parsed: dict[str, Any] = {}
    for name, values in changes.items():
        if name == "trace_file":
            raise InvalidInputError("trace file location can not be updated through network protocol")
        if name not in SETTINGS:
            known = ", ".join(["trace_file", *SETTINGS])
            raise InvalidInputError(f"unknown trace setting '{name}'; the settings are: {known}")
        key = SETTINGS[name]
        if values is None:
            parsed[key] = None
        elif key == "level":
            parsed[key] = parse_level(values)
        elif len(values) != 1:
            raise InvalidInputError(f"trace setting '{name}' takes one value, got {len(values)}")
        else:
            parsed[key] = parse_number(name, values[0], -1 if key == "count" else 1 if key == "rate" else 0)
    return parsed


def parse_level(values: list[str]) -> tuple[str, ...]:
    if values == ["OFF"]:
        return ()
    if "OFF" in values:
        raise InvalidInputError("trace_level OFF cannot be given with other levels")
    unknown = [v for v in values if v not in LEVELS]
    if unknown or not values:
        raise InvalidInputError(f"unknown trace_level {unknown or values}; the levels are OFF, {', '.join(LEVELS)}")
    return tuple(level for level in LEVELS if level in values)


def parse_number(name: str, text: str, least: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise InvalidInputError(f"trace setting '{name}' must be an integer, got '{text}'") from None
    if value < least:
        raise InvalidInputError(f"trace setting '{name}' must be at least {least}, got {value}")
    return value
