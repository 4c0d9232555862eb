"""A model-memory budget as people write it: bytes with an optional unit, or a percentage of a whole."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path

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


@dataclass(frozen=True)
class Budget:
    """A budget as written: `amount` bytes, or with `share` that percentage of a whole that may be known only later
    (the server learns from the repository which device's memory a percentage is of)."""

    text: str
    amount: float
    share: bool

    @classmethod
    def read(cls, text: str) -> Budget:
        """`"40%"`, or `"2GiB"`, `"500MB"`, `"123456"` bytes. ConfigError for anything else, or for 0 bytes."""
        match = _PATTERN.fullmatch(text)
        unit = match.group(2).lower() if match else ""
        if match is None or (unit != "%" and unit not in _UNITS):
            raise ConfigError(
                f"budget {text!r}: expected bytes with an optional unit (500MB, 2GiB) or a percentage (40%)"
            )
        value = float(match.group(1))
        budget = cls(text, value if unit == "%" else value * _UNITS[unit], unit == "%")
        budget._positive(budget.amount if budget.share else int(budget.amount))
        return budget

    def bytes_of(self, whole_bytes: Callable[[], int]) -> int:
        """The budget in bytes; `whole_bytes` is asked only for a percentage. ConfigError when it comes to 0."""
        return self._positive(int(self.amount / 100 * whole_bytes()) if self.share else int(self.amount))

    def _positive(self, budget: float) -> int:
        if budget <= 0:
            raise ConfigError(f"budget {self.text!r} is {int(budget)} bytes; it must be positive")
        return int(budget)


def parse_budget(text: str, whole_bytes: int) -> int:
    """`"40%"` of `whole_bytes` (the models' total size, say), or bytes; see `Budget.read`."""
    return Budget.read(text).bytes_of(lambda: whole_bytes)


def device_memory_bytes(devices: Collection[str]) -> int:
    """What a percentage budget is of, for models on `devices`: host RAM for CPU models, the GPU's memory for CUDA
    ones. Models on both have no one whole to take a percentage of: ConfigError, asking for bytes."""
    kinds = set(devices)
    if kinds == {"cuda"}:
        return gpu_memory_bytes()
    if kinds <= {"cpu"}:
        return host_memory_bytes()
    raise ConfigError(
        "a percentage budget needs every model on one device, and this repository has models on cpu and on cuda; "
        "give the budget in bytes (2GiB, 500MB)"
    )


def host_memory_bytes() -> int:
    meminfo = Path("/proc/meminfo").read_text().splitlines()
    return next(int(line.split()[1]) for line in meminfo if line.startswith("MemTotal")) * 1024


def gpu_memory_bytes() -> int:
    """The memory of the GPU a CUDA model runs on, asked of torch in a child process: the server itself neither
    imports torch nor opens a CUDA context (which would hold GPU memory for the server's life)."""
    probe = "import torch; print(torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory)"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        reason = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise ConfigError(
            f"a percentage budget for CUDA models needs the GPU's memory, and torch could not tell: {reason}"
        )
    return int(done.stdout.strip())
