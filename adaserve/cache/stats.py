"""Per-model measurements that eviction policies read: size S_i, load penalty P_i, and the request rate.

The rate gives mCache's expected time to the next request, T_i ≈ 1/Δ_i (paper §4.3.2: "we estimate the request rate
Δ_i via a sliding-window or exponentially weighted moving average"). Here Δ_i is a continuous-time EWMA: every request
adds 1/τ, and the sum decays by exp(-Δt/τ). Unlike an average of inter-arrival gaps it keeps falling while a model
goes unrequested, so a model that was popular an hour ago does not look popular forever.

P_i is a model's own load time, smoothed per model, plus the wait for a host process to take it, smoothed over every
model's loads. The wait is the server's, not the model's: with a spare host it is ~0 when a spare was ready and the
rest of a Python start and torch import (up to ~2.5 s here) when the spare behind the last load was still starting,
which turns on how close together loads came, not on which model was loaded. Charged to the model that happened to
wait, it made P_i, and IAM's and GDSF's rankings by P_i/S_i, mostly a record of spare timing (a server probe on the
benchmark models measured 2.84 s for an 11 MiB MLP that loads in 0.05 s from a ready spare). Pooled, it still counts
in every P_i, as it does in every reload.

Nothing here reads a clock: every call that depends on time takes `now` (seconds on the caller's monotonic clock),
so the server passes `time.monotonic()`, the simulator its virtual time, and tests a number.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

#: τ of the request-rate EWMA: a request stops counting after a few τ without another.
DEFAULT_RATE_TIME_CONSTANT_S = 600.0
#: Weight of the newest load time in the smoothed load penalty P_i.
DEFAULT_PENALTY_SMOOTHING = 0.3


@dataclass
class ModelStats:
    """What is known about one model. `size_bytes` is None until a load measured it (callers then use a hint)."""

    size_bytes: int | None = None
    own_load_s: float | None = None  # smoothed load time, without the wait for a host (see the module docstring)
    loads: int = 0
    requests: int = 0
    last_request_s: float | None = None
    rate_per_s: float = 0.0  # the EWMA as of last_request_s


class StatsRegistry:
    """The measurements of every model the cache has seen, shared by the cache and its policy."""

    def __init__(
        self,
        *,
        rate_time_constant_s: float = DEFAULT_RATE_TIME_CONSTANT_S,
        penalty_smoothing: float = DEFAULT_PENALTY_SMOOTHING,
    ) -> None:
        if rate_time_constant_s <= 0:
            raise ValueError(f"rate_time_constant_s must be positive, got {rate_time_constant_s}")
        if not 0 < penalty_smoothing <= 1:
            raise ValueError(f"penalty_smoothing must be in (0, 1], got {penalty_smoothing}")
        self.rate_time_constant_s = rate_time_constant_s
        self.penalty_smoothing = penalty_smoothing
        self.host_wait_s: float | None = None  # smoothed over every model's loads; None before the first
        self._models: dict[str, ModelStats] = {}

    def get(self, name: str) -> ModelStats:
        return self._models.setdefault(name, ModelStats())

    def record_request(self, name: str, now: float) -> None:
        stats = self.get(name)
        stats.rate_per_s = self.rate(name, now) + 1.0 / self.rate_time_constant_s
        stats.last_request_s = now
        stats.requests += 1

    def record_load(self, name: str, seconds: float, size_bytes: int, host_wait_s: float = 0.0) -> None:
        """A load of `name` took `seconds`, `host_wait_s` of them waiting for a host process, and the model occupies
        `size_bytes` once loaded."""
        if seconds < 0 or size_bytes < 0 or not 0 <= host_wait_s <= seconds:
            raise ValueError(
                f"model '{name}': a load cannot take {seconds} s ({host_wait_s} s of it waiting for a host) "
                f"or occupy {size_bytes} bytes"
            )
        stats = self.get(name)
        stats.own_load_s = self._smoothed(stats.own_load_s, seconds - host_wait_s)
        self.host_wait_s = self._smoothed(self.host_wait_s, host_wait_s)
        stats.size_bytes = size_bytes
        stats.loads += 1

    def rate(self, name: str, now: float) -> float:
        """Δ_i: requests per second, decayed to `now`."""
        stats = self.get(name)
        if stats.last_request_s is None:
            return 0.0
        elapsed = max(0.0, now - stats.last_request_s)
        return stats.rate_per_s * math.exp(-elapsed / self.rate_time_constant_s)

    def expected_gap_s(self, name: str, now: float) -> float:
        """T_i ≈ 1/Δ_i, the expected time to the next request; infinite for a model never requested."""
        rate = self.rate(name, now)
        return math.inf if rate == 0 else 1.0 / rate

    def size_bytes(self, name: str) -> int | None:
        return self.get(name).size_bytes

    def penalty_s(self, name: str) -> float:
        """P_i: the model's smoothed own load time plus the smoothed wait for a host; 0 for a model never loaded
        (policies only weigh loaded ones)."""
        own = self.get(name).own_load_s
        return 0.0 if own is None else own + (self.host_wait_s or 0.0)

    def _smoothed(self, previous: float | None, newest: float) -> float:
        alpha = self.penalty_smoothing
        return newest if previous is None else alpha * newest + (1 - alpha) * previous
