"""Per-model measurements that eviction policies read: size S_i, load penalty P_i, and the time to its next request.

T_i, mCache's expected time to a model's next request, is estimated from the model's own gaps (paper §4.3.2
estimates the rate Δ_i = 1/T_i "via a sliding-window or exponentially weighted moving average"):

    T_i(now) = max(ḡ_i, now − last request of i)        ḡ_i: an EWMA of i's gaps between requests (weight 0.2)

One fixed time constant for every model (this was a continuous-time EWMA with τ = 600 s) fits one time scale only:
with models requested hours apart every estimate decayed to nothing and IAM ranked by recency alone. A mean of the
model's own gaps has no time scale, and the second term lets a silence count against the model as soon as it is
longer than its usual gap, so a model that was popular an hour ago does not look popular forever. Requests at one
instant (a controller's per-second counts) share the gap before them, and a model's first request counts the time
since the registry's first request as a gap: it was not requested for that long.

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

#: Weight of the newest gap in the smoothed gap ḡ_i: about the last 9 gaps count.
DEFAULT_GAP_SMOOTHING = 0.2
#: The least T_i: only keeps 1/T_i finite when every known gap is 0 (a burst at one instant).
MIN_GAP_S = 1e-6
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
    mean_gap_s: float | None = None  # ḡ_i; None until a gap is known
    burst: int = 0  # requests at last_request_s
    burst_gap_s: float | None = None  # the gap before that instant, which its requests share
    gap_before_burst_s: float | None = None  # ḡ_i before that instant


class StatsRegistry:
    """The measurements of every model the cache has seen, shared by the cache and its policy."""

    def __init__(
        self,
        *,
        gap_smoothing: float = DEFAULT_GAP_SMOOTHING,
        penalty_smoothing: float = DEFAULT_PENALTY_SMOOTHING,
    ) -> None:
        if not 0 < gap_smoothing <= 1:
            raise ValueError(f"gap_smoothing must be in (0, 1], got {gap_smoothing}")
        if not 0 < penalty_smoothing <= 1:
            raise ValueError(f"penalty_smoothing must be in (0, 1], got {penalty_smoothing}")
        self.gap_smoothing = gap_smoothing
        self.penalty_smoothing = penalty_smoothing
        self.host_wait_s: float | None = None  # smoothed over every model's loads; None before the first
        self.first_request_s: float | None = None  # of any model: a model's first request counts the gap since
        self._models: dict[str, ModelStats] = {}

    def get(self, name: str) -> ModelStats:
        return self._models.setdefault(name, ModelStats())

    def record_request(self, name: str, now: float) -> None:
        """Count a request and update ḡ_i: k requests at one instant are k gaps of (gap before them) / k each."""
        stats = self.get(name)
        stats.requests += 1
        if self.first_request_s is None:
            self.first_request_s = now
        if stats.last_request_s is not None and now <= stats.last_request_s:
            stats.burst += 1  # same instant (or a caller's clock that stepped back): one more share of the gap
        else:
            since = now - (self.first_request_s if stats.last_request_s is None else stats.last_request_s)
            unknown = stats.last_request_s is None and since == 0  # the registry's first instant: no gap yet
            stats.burst, stats.burst_gap_s = 1, None if unknown else since
            stats.gap_before_burst_s = stats.mean_gap_s
            stats.last_request_s = now
        if stats.burst_gap_s is not None:
            share = stats.burst_gap_s / stats.burst
            before = stats.gap_before_burst_s
            kept = (1 - self.gap_smoothing) ** stats.burst  # weight left to ḡ_i after `burst` samples of `share`
            stats.mean_gap_s = share if before is None else kept * before + (1 - kept) * share

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

    def expected_gap_s(self, name: str, now: float) -> float:
        """T_i = max(ḡ_i, time since the last request): the expected time to the next request; infinite for a
        model never requested."""
        stats = self.get(name)
        if stats.last_request_s is None:
            return math.inf
        return max(stats.mean_gap_s or 0.0, now - stats.last_request_s, MIN_GAP_S)

    def rate(self, name: str, now: float) -> float:
        """Δ_i = 1/T_i: requests per second as of `now`; 0 for a model never requested."""
        return 1.0 / self.expected_gap_s(name, now)

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
