"""A model-memory budget as people write it: bytes with an optional unit, or a percentage of a whole."""

from __future__ import annotations

import re

from adaserve.errors import ConfigError

_UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}
_PATTERN = re.compile(r"\s*([0-9]+(?:\.[0-9]*)?)\s*(%|[a-zA-Z]*)\s*")


def parse_budget(text: str, whole_bytes: int) -> int:
    """`"40%"` of `whole_bytes` (the device's memory, or the models' total size), or `"2GiB"`, `"500MB"`,
    `"123456"` bytes. ConfigError for anything else, or a budget of 0 bytes."""
    match = _PATTERN.fullmatch(text)
    unit = match.group(2).lower() if match else ""
    if match is None or (unit != "%" and unit not in _UNITS):
        raise ConfigError(f"budget {text!r}: expected bytes with an optional unit (500MB, 2GiB) or a percentage (40%)")
    value = float(match.group(1))
    budget = int(value / 100 * whole_bytes) if unit == "%" else int(value * _UNITS[unit])
    if budget <= 0:
        raise ConfigError(f"budget {text!r} is {budget} bytes; it must be positive")
    return budget
