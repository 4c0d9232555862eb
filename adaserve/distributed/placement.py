"""Which models are resident on which nodes: mCache at cluster scale, as pure bookkeeping the placement controller
(a Ray actor) and the fleet-scale simulator (`benchmarks/cluster/fleet.py`) share.

Nothing here waits, reads a clock or does I/O: the caller passes `now`, carries out each decision (a load, the
unloads before it) and reports back (`loaded`, `failed`, `unloaded`, `requests`). The rules are mCache's:

* **Load on first use.** `place` picks a node for a model no node holds, reserves its bytes there and names the
  victims that node's eviction policy gives up for it. Each node is the single-node core, a `Residency` with its own
  `EvictionPolicy` (`create_policy(eviction, ...)`), so a LOADING model is never evicted and a load that comes out
  larger than reserved evicts more on its node.
* **Which node** is a placement policy's choice (`create_placement`): `iam` makes room where it costs the least IAM
  importance, `lru` is ModelMesh's (the node whose least recently used model is the oldest), `random` the baseline.
* **Replicate** what one replica cannot serve and remove replicas when the load falls (`scale`), with hysteresis.

One `StatsRegistry` serves every node: a model's request rate, load time and size are the model's, not a node's
(every policy reads only those per-model figures and keeps its per-node state, such as LRU order or LFU counts, to
itself). The controller hears request counts per model, not per node, so a model's rate is its cluster-wide rate,
and a node's policy hears the requests of the models it holds (loaded or loading). ARC's ghost lists therefore learn
only from models still on their node; the other policies lose nothing.

IAM's importance (rank_i = log(#{j: u_j < u_i} + b0), `adaserve.cache.policies.iam`) ranks a model against the
models of one cache, so two nodes' ranks do not compare. To say which node's room is cheapest the `iam` placement
ranks every loaded replica of the cluster against each other, C being the whole cluster, and a node's cost is the
sum of those ranks over its least useful replicas until the model fits. The node's own IAM policy then chooses the
victims, ranking its resident models by u_i at that moment too (or from a queue up to one refresh period old, in the
paper's periodic mode), so the two agree.

A placement walks the cluster's loaded replicas least useful first and stops as soon as no later node can be
cheaper. The order is u_i at the placement's moment: T_i counts a silence longer than the model's gap ḡ_i, so a
model that has gone quiet falls below busier ones in between its requests, as each node's IAM sees it at eviction.
Each replica keeps log u_i as of its model's last request and log(P_i / S_i); at `now` its key is the lesser of the
first and the second less log(now - last request). The keys of every replica are computed together in numpy and
sorted at each placement. Keys fixed at each model's last request kept a silent model above busier ones: in the
fleet benchmark (`benchmarks/cluster/fleet.py`, 100 nodes) they gave 3-11% more cold starts and 5-18% more load
wait.
"""

from __future__ import annotations

import bisect
import enum
import itertools
import math
from collections.abc import Collection, Hashable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from adaserve.cache.policies import POLICIES, create_policy
from adaserve.cache.residency import Residency, State, mib
from adaserve.cache.stats import MIN_GAP_S, StatsRegistry
from adaserve.distributed.placement_policies import PlacementPolicy, create_placement
from adaserve.errors import CacheBusyError, ConfigError, ModelTooLargeError


@dataclass(frozen=True)
class Decision:
    """Where to load a model, and what to unload from that node first (already taken off the books)."""

    node: str
    evict: list[str]


@dataclass(frozen=True)
class ModelLoad:
    """A model's load over the last report: requests arriving per second (cluster-wide), what one replica serves per
    second (Packrat's batch-size estimator), and the requests waiting in its replicas' queues."""

    arrival_rps: float
    capacity_rps: float
    queued: int = 0

    def __post_init__(self) -> None:
        if not self.capacity_rps > 0:
            raise ValueError(f"a replica's capacity must be positive, got {self.capacity_rps} req/s")
        if self.arrival_rps < 0 or self.queued < 0:
            raise ValueError(f"arrivals and queue depth cannot be negative: {self.arrival_rps} req/s, {self.queued}")


class ScaleKind(enum.Enum):
    ADD = "add"
    REMOVE = "remove"


@dataclass(frozen=True)
class ScaleAction:
    """Add a replica of `model` (the caller places it with `place`, which skips the nodes that hold it) or remove
    the one on `node` (the caller unloads it and reports `unloaded`)."""

    model: str
    kind: ScaleKind
    node: str | None = None


@dataclass(frozen=True)
class ScaleSettings:
    """When `scale` adds and removes replicas. Demand = arrivals + queued / `queue_drain_s` (a queue should drain
    within that); one more replica when demand exceeds `target_utilization` of what the replicas (loading ones
    counted) serve (a closed loop of clients never offers more than the replicas serve: the target is what sees it);
    one fewer when the others would run below `remove_below` of their capacity, continuously for `remove_after_s`,
    and again only `remove_after_s` after the last removal. The gap between the two thresholds is the hysteresis: a
    removal never leaves the rest loaded enough to add one back."""

    queue_drain_s: float = 2.0
    target_utilization: float = 0.8
    remove_below: float = 0.5
    remove_after_s: float = 60.0

    def __post_init__(self) -> None:
        valid = 0 < self.remove_below < self.target_utilization <= 1
        if self.queue_drain_s <= 0 or self.remove_after_s < 0 or not valid:
            raise ValueError(f"invalid scale settings: {self}")


# -- the orders a placement walks ------------------------------------------------------------------------------------

Item = TypeVar("Item", bound=Hashable)


class _Sorted(Generic[Item]):
    """Items in ascending order of their keys, each with a payload: a sorted list, so a walk is a plain loop that
    costs only what it visits, and setting a key is a bisection and a move of the entries after it (microseconds at
    the thousand nodes of a 1,000-node fleet)."""

    def __init__(self) -> None:
        self._entries: list[tuple[float, int, Item, int]] = []  # (key, sequence, item, payload)
        self._live: dict[Item, tuple[float, int]] = {}
        self._sequence = itertools.count()

    def set(self, item: Item, key: float, payload: int = 0) -> None:
        self.discard(item)
        entry = (key, next(self._sequence), item, payload)  # (key, sequence) is unique: items are never compared
        bisect.insort(self._entries, entry, key=_position)
        self._live[item] = entry[:2]

    def discard(self, item: Item) -> None:
        position = self._live.pop(item, None)
        if position is not None:
            del self._entries[bisect.bisect_left(self._entries, position, key=_position)]

    def __iter__(self) -> Iterator[tuple[float, Item, int]]:
        """(key, item, payload), least key first; nothing may be set while a walk is under way."""
        for key, _, item, payload in self._entries:
            yield key, item, payload


def _position(entry: tuple[float, int, Any, int]) -> tuple[float, int]:
    return entry[0], entry[1]


class _Replicas:
    """The loaded replicas, (node, model) with their bytes, in the order of their keys at a moment: each replica's
    key is min(key, decay - log(now - last request)) from the figures set at its model's last request or load
    (`PlacementPolicy.order_key`, `order_decay`); ties go to the replica set first. numpy is imported where it is
    used: `adaserve serve`'s argument parser reaches this module and stays without it."""

    def __init__(self) -> None:
        import numpy as np

        self._slot: dict[tuple[str, str], int] = {}
        self._items: list[tuple[str, str]] = []
        self._unused: list[int] = []
        self._columns = np.zeros((5, 64))  # key, decay, last request, bytes, sequence; a column a slot
        self._live = np.zeros(64, dtype=bool)
        self._sequence = itertools.count()

    def set(self, item: tuple[str, str], key: float, decay: float, last_request_s: float, size: int) -> None:
        slot = self._slot.get(item)
        if slot is None:
            slot = self._unused.pop() if self._unused else self._grow()
            self._items[slot] = item
            self._slot[item] = slot
        self._columns[:, slot] = (key, decay, last_request_s, size, next(self._sequence))
        self._live[slot] = True

    def discard(self, item: tuple[str, str]) -> None:
        slot = self._slot.pop(item, None)
        if slot is not None:
            self._live[slot] = False
            self._unused.append(slot)

    def in_order(self, now: float) -> Iterator[tuple[float, str, int]]:
        """(key at `now`, node, bytes), least key first."""
        import numpy as np

        slots = np.flatnonzero(self._live)
        key, decay, last, size, sequence = self._columns[:, slots]
        keys = np.minimum(key, decay - np.log(np.maximum(now - last, MIN_GAP_S)))
        for index in np.lexsort((sequence, keys)):
            yield float(keys[index]), self._items[slots[index]][0], int(size[index])

    def _grow(self) -> int:
        """A new slot at the end, the arrays doubled when they are full."""
        import numpy as np

        slot = len(self._items)
        self._items.append(("", ""))  # named by `set`
        if slot == self._live.size:
            self._columns = np.concatenate([self._columns, np.zeros_like(self._columns)], axis=1)
            self._live = np.concatenate([self._live, np.zeros_like(self._live)])
        return slot


@dataclass
class _Node:
    residency: Residency
    loading: dict[str, tuple[float, int]] = field(default_factory=dict)  # model -> (placed at, reserved bytes)
    loaded: dict[str, tuple[float, int]] = field(default_factory=dict)  # model -> (loaded at, bytes)
    free_bytes: int = 0  # negative while a load that came out larger than reserved keeps the node over budget
    evictable_bytes: int = 0  # its loaded models' bytes
    # (both recounted by `Placement._recount` after every change to the node)

    @property
    def budget_bytes(self) -> int:
        return self.residency.budget_bytes


class Room:
    """One `place` call as a placement policy sees it: the nodes that may take the model, what each can free, and
    the cluster's loaded replicas in the policy's order (`order_key`, `order_decay`) at the moment of the call."""

    def __init__(self, placement: Placement, model: str, size_bytes: int, exclude: Collection[str], now: float) -> None:
        self.model, self.size_bytes, self.stats, self.now = model, size_bytes, placement.stats, now
        self._placement = placement
        self._nodes = placement._nodes
        self._exclude = set(exclude) | set(placement._where.get(model, ())) | placement._cordoned

    def nodes(self) -> list[str]:
        """Every node (do not change the list)."""
        return self._placement._node_names()

    def eligible(self, node: str) -> bool:
        """Not excluded, not holding or loading the model, and with a budget that can hold it."""
        return node not in self._exclude and self._nodes[node].budget_bytes >= self.size_bytes

    def free_bytes(self, node: str) -> int:
        return self._nodes[node].free_bytes

    def can_make_room(self, node: str) -> bool:
        """Eligible, and its free bytes plus its loaded (evictable) models' bytes hold the model now."""
        entry = self._nodes[node]
        return self.eligible(node) and entry.free_bytes + entry.evictable_bytes >= self.size_bytes

    def most_free(self) -> str | None:
        """The eligible node with the most free bytes, if those hold the model without evicting anything."""
        for negative_free, node, _ in self._placement._free:
            if -negative_free < self.size_bytes:
                return None
            if self.eligible(node):
                return node
        return None

    def replicas_in_order(self) -> Iterator[tuple[float, str, int]]:
        """(key, node, bytes) of every loaded replica in the cluster, ineligible nodes' too, least key first, the keys
        as of this placement's moment."""
        return self._placement._order.in_order(self.now)


# -- the books ------------------------------------------------------------------------------------------------------


class Placement:
    """The cluster's resident models under each node's budget. `eviction` names each node's EvictionPolicy,
    `placement` the PlacementPolicy; `seed` is the random placement's."""

    def __init__(
        self,
        eviction: str = "iam",
        placement: str = "iam",
        seed: int = 0,
        *,
        stats: StatsRegistry | None = None,
        scaling: ScaleSettings | None = None,
    ) -> None:
        known = POLICIES.get(eviction.lower())
        if known is None or known.needs_future:
            online = ", ".join(name for name, cls in POLICIES.items() if not cls.needs_future)
            raise ConfigError(f"eviction policy '{eviction}' cannot run a cluster; expected one of {online}")
        self.eviction = known.name
        self.policy = create_placement(placement, seed)
        self.stats = stats or StatsRegistry()
        self.scaling = scaling or ScaleSettings()
        self._nodes: dict[str, _Node] = {}
        self._node_list: list[str] | None = None
        self._largest: int | None = None
        self._where: dict[str, dict[str, State]] = {}  # model -> node -> state
        self._order = _Replicas()  # loaded (node, model) by their keys, with their bytes
        self._free: _Sorted[str] = _Sorted()  # nodes by -free bytes
        self._low_since: dict[str, float] = {}  # model -> since when it could do with a replica fewer
        self._cordoned: set[str] = set()  # nodes being drained: nothing is placed there, their replicas not counted
        self._now = 0.0  # the latest time a call passed, for the calls that take none

    # -- membership -----------------------------------------------------------------------------------------------

    def add_node(self, node: str, budget_bytes: int) -> None:
        if node in self._nodes:
            raise ValueError(f"node '{node}' is already part of the cluster")
        policy = create_policy(self.eviction, self.stats, budget_bytes)
        self._nodes[node] = _Node(Residency(budget_bytes, policy))
        self._node_list = self._largest = None
        self._recount(node)

    def remove_node(self, node: str) -> list[str]:
        """The node left or died: forget it; returns the models it held or was loading (those replicas are gone)."""
        entry = self._nodes.pop(node)
        self._cordoned.discard(node)
        self._node_list = self._largest = None
        self._free.discard(node)
        held = sorted(entry.residency.residents())
        for model in held:
            self._drop(node, model)
        return held

    def drain(self, node: str, now: float, used_within_s: float) -> list[tuple[str, int]]:
        """Take `node` out of placement (it is being drained): nothing more is placed there, and its replicas no
        longer count as the model's (`replicas`, `loading`, `scale`), so a removal never leaves a model only there.
        Returns the models to place elsewhere before it goes, with their bytes: those loaded there, with no replica
        on another node, requested (or loaded) within `used_within_s` of `now`; the others are placed again on their
        next request."""
        self._now = max(self._now, now)
        self._cordoned.add(node)
        moves = []
        for model, (loaded_at, size) in sorted(self._nodes[node].loaded.items()):
            recent = max(self.stats.get(model).last_request_s or 0.0, loaded_at) >= now - used_within_s
            if recent and not self.replicas(model) and not self.loading(model):
                moves.append((model, size))
        return moves

    def nodes(self) -> list[str]:
        return list(self._node_names())

    def replicas(self, model: str) -> list[str]:
        """The nodes where `model` is loaded (a node being drained not counted)."""
        return self._in_state(model, State.LOADED)

    def loading(self, model: str) -> list[str]:
        """The nodes where `model` is being loaded (a node being drained not counted)."""
        return self._in_state(model, State.LOADING)

    def _in_state(self, model: str, wanted: State) -> list[str]:
        where = self._where.get(model, {})
        return [node for node, state in where.items() if state is wanted and node not in self._cordoned]

    # -- loads ----------------------------------------------------------------------------------------------------

    def place(self, model: str, size_bytes: int, now: float, exclude: Collection[str] = ()) -> Decision:
        """Choose a node (not in `exclude`, not holding or loading `model`) and reserve `size_bytes` there, evicting
        by that node's policy. ModelTooLargeError when no node's budget could ever hold it; CacheBusyError when no
        node can make room now (its other models are loading, or every node that could take it is excluded)."""
        self._now = max(self._now, now)
        largest = self._largest_budget()
        if self._nodes and size_bytes > largest:
            raise ModelTooLargeError(
                f"model '{model}' needs {mib(size_bytes)}, more than any node's model-memory budget "
                f"(the largest is {mib(largest)}); raise a budget or add a larger node"
            )
        room = Room(self, model, size_bytes, exclude, now)
        node = self.policy.choose(room, now) if self._nodes else None
        if node is None:
            raise CacheBusyError(self._why_busy(room))
        entry = self._nodes[node]
        victims = entry.residency.admit(model, size_bytes, now)
        for victim in victims:
            self._drop(node, victim)
        entry.loading[model] = (now, size_bytes)
        self._where.setdefault(model, {})[node] = State.LOADING
        self._recount(node)
        return Decision(node, victims)

    def loaded(self, node: str, model: str, size_bytes: int, now: float, load_s: float | None = None) -> list[str]:
        """The load of `model` on `node` finished, `size_bytes` its real size and `load_s` how long it took (default:
        since `place`); returns further victims on that node if it is larger than reserved. ModelTooLargeError if it
        exceeds the node's whole budget: it is off the books then, and the caller unloads it."""
        self._now = max(self._now, now)
        entry = self._nodes[node]
        if model not in entry.loading:
            raise ValueError(f"model '{model}' is not loading on node '{node}'")
        placed_at, _ = entry.loading.pop(model)
        try:
            victims = entry.residency.loaded(model, size_bytes, now - placed_at if load_s is None else load_s, now)
        except ModelTooLargeError:
            self._drop(node, model)
            self._recount(node)
            raise
        for victim in victims:
            self._drop(node, victim)
        entry.loaded[model] = (now, size_bytes)
        self._where[model][node] = State.LOADED
        self._rekey(model)  # its load time and size changed the key of every replica
        self._recount(node)
        return victims

    def failed(self, node: str, model: str) -> None:
        """The load failed: release its reservation; a later request places the model again."""
        entry = self._nodes.get(node)
        if entry is None or entry.loading.pop(model, None) is None:
            return
        entry.residency.load_failed(model)
        self._drop(node, model)
        self._recount(node)

    def unloaded(self, node: str, model: str) -> None:
        """`node` no longer holds `model`, whatever the reason (a scale-down, an operator, a crashed worker)."""
        entry = self._nodes.get(node)
        if entry is None:
            return
        entry.loading.pop(model, None)
        if entry.residency.remove(model, self._now):
            self._drop(node, model)
            self._recount(node)

    # -- what the nodes report ------------------------------------------------------------------------------------

    def requests(self, counts: Mapping[str, int], now: float) -> None:
        """Requests seen per model since the last report: counted in the shared statistics (IAM's rates), and told
        to the eviction policy of every node that holds the model, as the single-node cache does per request."""
        self._now = max(self._now, now)
        for model, count in counts.items():
            for _ in range(count):
                self.stats.record_request(model, now)
            for node in self._where.get(model, ()):
                policy = self._nodes[node].residency.policy
                for _ in range(count):
                    policy.on_request(model, now)
            if count > 0:
                self._rekey(model)

    def scale(self, loads: Mapping[str, ModelLoad], now: float) -> list[ScaleAction]:
        """Replication decisions for the models in `loads` that are on some node (placing a model no node holds is
        `place`'s job, on its first request): add the replicas demand exceeds, or remove one (`ScaleSettings`)."""
        self._now = max(self._now, now)
        return [action for model, load in sorted(loads.items()) for action in self._scale_one(model, load, now)]

    def snapshot(self) -> dict[str, Any]:
        """Per node its budget, bytes used and residents with state and bytes; for /metrics and `models list
        --cluster`."""
        return {
            "placement": self.policy.name,
            "eviction": self.eviction,
            "nodes": {
                node: {
                    "budget_bytes": entry.budget_bytes,
                    "used_bytes": entry.residency.used_bytes,
                    "residents": {
                        model: {"state": resident.state.value, "bytes": resident.size_bytes}
                        for model, resident in entry.residency.residents().items()
                    },
                }
                for node, entry in self._nodes.items()
            },
        }

    # -- helpers --------------------------------------------------------------------------------------------------

    def _scale_one(self, model: str, load: ModelLoad, now: float) -> list[ScaleAction]:
        settings = self.scaling
        ready, pending = self.replicas(model), self.loading(model)
        demand = load.arrival_rps + load.queued / settings.queue_drain_s
        if not ready and not pending:
            self._low_since.pop(model, None)
            return []
        missing = (
            max(1, math.ceil(demand / (load.capacity_rps * settings.target_utilization))) - len(ready) - len(pending)
        )
        if missing > 0:
            self._low_since.pop(model, None)
            return [ScaleAction(model, ScaleKind.ADD)] * missing
        rest = (len(ready) - 1) * load.capacity_rps  # what the replicas serve with one fewer
        if pending or len(ready) < 2 or demand >= rest * settings.remove_below:
            self._low_since.pop(model, None)
            return []
        since = self._low_since.setdefault(model, now)
        if now - since < settings.remove_after_s:
            return []
        self._low_since[model] = now  # the next removal waits as long again
        # the replica whose node's memory is most wanted: the one with the least free bytes
        node = min(ready, key=lambda n: (self._nodes[n].free_bytes, n))
        return [ScaleAction(model, ScaleKind.REMOVE, node)]

    def _drop(self, node: str, model: str) -> None:
        """Take `model` on `node` off the books kept here (the residency has already let it go)."""
        holders = self._where.get(model, {})
        holders.pop(node, None)
        if not holders:
            self._where.pop(model, None)
        self._order.discard((node, model))
        if (entry := self._nodes.get(node)) is not None:
            entry.loaded.pop(model, None)
            entry.loading.pop(model, None)

    def _rekey(self, model: str) -> None:
        last_request = self.stats.get(model).last_request_s
        for node, state in self._where.get(model, {}).items():
            if state is State.LOADED:
                loaded_at = self._nodes[node].loaded[model][0]
                last_use = loaded_at if last_request is None else max(loaded_at, last_request)
                key = self.policy.order_key(self.stats, model, last_use)
                if key is not None:
                    decay = self.policy.order_decay(self.stats, model)
                    size = self._nodes[node].loaded[model][1]
                    self._order.set((node, model), key, decay, last_use if last_request is None else last_request, size)

    def _node_names(self) -> list[str]:
        """The nodes as one list kept until membership changes: the random placement draws from it per placement."""
        if self._node_list is None:
            self._node_list = list(self._nodes)
        return self._node_list

    def _largest_budget(self) -> int:
        if self._largest is None:
            self._largest = max((entry.budget_bytes for entry in self._nodes.values()), default=0)
        return self._largest

    def _recount(self, node: str) -> None:
        """After any change to `node`: its free and evictable bytes, and its place among the nodes by free bytes."""
        entry = self._nodes[node]
        used = entry.residency.used_bytes
        entry.free_bytes = entry.budget_bytes - used
        entry.evictable_bytes = used - sum(reserved for _, reserved in entry.loading.values())
        self._free.set(node, -entry.free_bytes)

    def _why_busy(self, room: Room) -> str:
        if not self._nodes:
            return f"no room for model '{room.model}': no node has joined the cluster"
        eligible = [node for node in self._nodes if room.eligible(node)]
        return (
            f"no node can make room for model '{room.model}' ({mib(room.size_bytes)}) now: of {len(self._nodes)} "
            f"nodes, {len(self._nodes) - len(eligible)} hold it, are excluded or are too small, and the other "
            f"{len(eligible)} are busy loading other models"
        )


__all__ = [
    "Decision",
    "ModelLoad",
    "Placement",
    "PlacementPolicy",
    "Room",
    "ScaleAction",
    "ScaleKind",
    "ScaleSettings",
    "create_placement",
]
