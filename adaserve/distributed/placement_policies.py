"""Where a new replica goes: the placement policies `Placement` asks (`create_placement`), logic only.

`iam` makes room where it costs the least IAM importance, ranking every loaded replica of the cluster against each
other (see `adaserve.distributed.placement` for why, and for the order a placement walks); `lru` is ModelMesh's, the
node whose least recently used model is the oldest; `random` the baseline. Each sees one `place` call as a `Room`.
"""

from __future__ import annotations

import math
import random
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, ClassVar

from adaserve.cache.policies import IAMPolicy
from adaserve.cache.stats import StatsRegistry
from adaserve.errors import ConfigError

if TYPE_CHECKING:
    from adaserve.distributed.placement import Room


class PlacementPolicy(ABC):
    """Chooses the node for a new replica. Logic only: the `Placement` keeps the books and does the evicting."""

    #: The name `create_placement` knows it by.
    name: ClassVar[str]

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed

    def order_key(self, stats: StatsRegistry, model: str, last_use_s: float) -> float | None:
        """The key that orders a loaded replica among all others for `Room.replicas_in_order`, least key first
        (evicted first), as of the model's last request or load. None: this policy walks no order, so none is kept."""
        return None

    def order_decay(self, stats: StatsRegistry, model: str) -> float:
        """For a key that falls while its model goes unrequested: the b for which the key at `now` is
        min(key, b - log(now - the model's last request)). +inf, the default: the key holds until the next request
        or load."""
        return math.inf

    @abstractmethod
    def choose(self, room: Room, now: float) -> str | None:
        """The node to make room on, one for which `room.can_make_room` holds; None when there is none."""


class IAMPlacement(PlacementPolicy):
    """The node where making room costs the least IAM importance: 0 with enough free bytes, else the sum of
    log(rank + b0) over the least useful replicas it would evict, each ranked among every loaded replica of the
    cluster; ties go to the node with the most free bytes."""

    name = "iam"

    def __init__(self, seed: int = 0) -> None:
        super().__init__(seed)
        self._iam: IAMPolicy | None = None  # Eq. 1 and b0, read from the policy that defines them

    def _policy(self, stats: StatsRegistry) -> IAMPolicy:
        if self._iam is None or self._iam.stats is not stats:
            self._iam = IAMPolicy(stats, budget_bytes=1)  # only its utility and b0 are used; the budget is moot
        return self._iam

    def order_key(self, stats: StatsRegistry, model: str, last_use_s: float) -> float | None:
        """log u_i at the model's last request, where T_i is its smoothed gap ḡ_i."""
        last = stats.get(model).last_request_s
        return -math.inf if last is None else _log(self._policy(stats).utility(model, last))

    def order_decay(self, stats: StatsRegistry, model: str) -> float:
        """log(P_i / S_i): once the silence outlasts ḡ_i it is T_i, and log u_i = log(P_i / S_i) - log(silence)."""
        last = stats.get(model).last_request_s
        if last is None:
            return -math.inf
        return _log(self._policy(stats).utility(model, last) * stats.expected_gap_s(model, last))

    def choose(self, room: Room, now: float) -> str | None:
        free = room.most_free()
        if free is not None:
            return free
        b0 = self._policy(room.stats).b0
        best: tuple[float, int, str] | None = None  # (cost, -free bytes, node)
        best_cost = math.inf
        # per node met: [cost so far, free bytes + bytes freed so far]; None once complete or unable to make room
        met: dict[str, list[float] | None] = {}
        rank = visited = 0
        previous, importance = -math.inf, math.log(b0)
        for key, node, size in room.replicas_in_order():
            if key != previous:  # replicas of equal utility share a rank (Eq. 2 counts u_j < u_i)
                rank, previous = visited, key
                importance = math.log(rank + b0)
            visited += 1
            if importance > best_cost:
                break  # every node not yet complete would cost at least this
            if node not in met:
                met[node] = [0.0, room.free_bytes(node)] if room.can_make_room(node) else None
            books = met[node]
            if books is None:
                continue
            books[0] += importance
            books[1] += size
            if books[1] >= room.size_bytes:
                candidate = (books[0], -room.free_bytes(node), node)
                if best is None or candidate < best:
                    best, best_cost = candidate, candidate[0]
                met[node] = None  # complete: its later replicas are not its victims
        return None if best is None else best[2]


def _log(value: float) -> float:
    return math.log(value) if value > 0 else -math.inf


class LRUPlacement(PlacementPolicy):
    """ModelMesh's: a node with enough free bytes (the most), else the node whose least recently used model is the
    oldest in the cluster; with LRU eviction that node then evicts from its oldest up."""

    name = "lru"

    def order_key(self, stats: StatsRegistry, model: str, last_use_s: float) -> float | None:
        return last_use_s

    def choose(self, room: Room, now: float) -> str | None:
        free = room.most_free()
        if free is not None:
            return free
        return next((node for _, node, _ in room.replicas_in_order() if room.can_make_room(node)), None)


class RandomPlacement(PlacementPolicy):
    """A node drawn at random (seeded) from those that can make room now."""

    name = "random"
    _DRAWS = 16  # uniform draws over all nodes before drawing from the filtered list

    def __init__(self, seed: int = 0) -> None:
        super().__init__(seed)
        self._rng = random.Random(seed)

    def choose(self, room: Room, now: float) -> str | None:
        nodes = room.nodes()
        for _ in range(min(self._DRAWS, len(nodes))):
            node = self._rng.choice(nodes)
            if room.can_make_room(node):
                return node
        able = [node for node in nodes if room.can_make_room(node)]
        return self._rng.choice(able) if able else None


PLACEMENTS: dict[str, type[PlacementPolicy]] = {cls.name: cls for cls in (IAMPlacement, LRUPlacement, RandomPlacement)}


def create_placement(name: str, seed: int = 0) -> PlacementPolicy:
    """The placement policy called `name` (`random` draws from `seed`); ConfigError names an unknown one."""
    cls = PLACEMENTS.get(name.lower())
    if cls is None:
        raise ConfigError(f"unknown placement policy '{name}'; expected one of {', '.join(PLACEMENTS)}")
    return cls(seed)


__all__ = ["PLACEMENTS", "IAMPlacement", "LRUPlacement", "PlacementPolicy", "RandomPlacement", "create_placement"]
