"""The cluster's placement core, driven by hand: every case's right answer is stated beside it."""

from __future__ import annotations

import math

import pytest

from adaserve.distributed.placement import (
    Decision,
    ModelLoad,
    Placement,
    ScaleAction,
    ScaleKind,
    create_placement,
)
from adaserve.errors import CacheBusyError, ConfigError, ModelTooLargeError


def cluster(budgets: dict[str, int], placement: str = "iam", eviction: str = "iam", seed: int = 0) -> Placement:
    made = Placement(eviction=eviction, placement=placement, seed=seed)
    for node, budget in budgets.items():
        made.add_node(node, budget)
    return made


def put(cluster: Placement, node: str, model: str, size: int, now: float = 0.0) -> list[str]:
    """Load `model` on `node` (every other node excluded), taking 1 s; returns the victims."""
    others = [n for n in cluster.nodes() if n != node]
    decision = cluster.place(model, size, now, exclude=others)
    assert decision.node == node
    return decision.evict + cluster.loaded(node, model, size, now, load_s=1.0)


def ask(cluster: Placement, counts: dict[str, int], now: float) -> None:
    cluster.requests(counts, now)


def skewed(placement: str) -> Placement:
    """Node a holds x (5 bytes, 1 request at t=1) and y (5 bytes, 6 requests at t=3); node b holds z (10 bytes, 5
    requests at t=2); the cluster's first request, at t=0, starts every model's first gap. Utility P·Δ/S (every P
    1 s, Δ = requests / time since t=0): x 0.2 < z 0.25 < y 0.4, so x, z, y rank 0, 1, 2 cluster-wide; by last use x
    (t=1) is the oldest."""
    made = cluster({"a": 10, "b": 10}, placement=placement, eviction=placement)
    put(made, "a", "x", 5)
    put(made, "a", "y", 5)
    put(made, "b", "z", 10)
    ask(made, {"never-placed": 1}, 0.0)
    ask(made, {"x": 1}, 1.0)
    ask(made, {"z": 5}, 2.0)
    ask(made, {"y": 6}, 3.0)
    return made


def test_iam_makes_room_where_the_victims_rank_lowest_in_the_cluster() -> None:
    made = skewed("iam")
    # On a, room for 10 bytes costs x and y: log(0 + 1) + log(2 + 1) = 1.10; on b, z alone: log(1 + 1) = 0.69.
    assert made.place("new", 10, 4.0) == Decision("b", ["z"])
    assert made.replicas("z") == [] and made.loading("new") == ["b"]


def test_iam_ranks_replicas_by_their_utility_at_the_placement_so_a_model_gone_quiet_gives_way() -> None:
    """x was asked at t=1 and 2, y at t=50 and 95 (the cluster's first request, at t=0, starts both first gaps): as
    of their last requests x was the more useful (T = its gap, 1 s against y's 49 s), but at t=100 x has been silent
    for 98 s, longer than its gap, and y for 5 s, so u = P/S/T is 1/10/98 for x and 1/10/49 for y."""
    made = cluster({"a": 10, "b": 10})
    put(made, "a", "x", 10)
    put(made, "b", "y", 10)
    for model, now in (("never-placed", 0.0), ("x", 1.0), ("x", 2.0), ("y", 50.0), ("y", 95.0)):
        ask(made, {model: 1}, now)
    assert made.place("new", 10, 100.0) == Decision("a", ["x"])


def test_lru_makes_room_on_the_node_whose_least_recently_used_model_is_oldest() -> None:
    made = skewed("lru")
    assert made.place("new", 10, 4.0) == Decision("a", ["x", "y"])  # x, last used at t=1, is the oldest


def test_a_node_with_enough_free_bytes_costs_nothing_and_the_most_free_wins() -> None:
    for policy in ("iam", "lru"):
        made = cluster({"a": 10, "b": 10, "c": 10}, placement=policy, eviction=policy)
        put(made, "a", "x", 4)
        put(made, "b", "y", 8)
        assert made.place("new", 3, 1.0) == Decision("c", []), policy  # 10 free beats a's 6
        assert made.place("other", 7, 1.0) == Decision("c", []), policy  # a loading model's bytes count: c has 7
        assert made.place("third", 6, 1.0) == Decision("a", []), policy  # c has 0, a 6: no eviction needed


def test_excluded_nodes_and_nodes_that_hold_the_model_are_never_chosen() -> None:
    made = cluster({"a": 10, "b": 10, "c": 10})
    put(made, "a", "x", 2)
    assert made.place("x", 2, 1.0, exclude=["c"]) == Decision("b", [])  # a holds x, c is excluded
    with pytest.raises(CacheBusyError, match=r"of 3 nodes, 3 hold it, are excluded or are too small"):
        made.place("x", 2, 1.0, exclude=["c"])  # a holds it, b is loading it, c is excluded


def test_iam_ties_go_to_the_node_with_the_most_free_bytes() -> None:
    made = cluster({"a": 10, "b": 12})
    put(made, "a", "x", 10)
    put(made, "b", "y", 10)
    ask(made, {"x": 1, "y": 1}, 1.0)  # equal utility: both rank 0, both cost log(1) = 0
    assert made.place("new", 10, 2.0) == Decision("b", ["y"])  # b has 2 bytes free, a none


def test_random_placement_is_seeded_and_only_picks_nodes_that_can_make_room() -> None:
    def choices(seed: int) -> list[str]:
        made = cluster({f"n{i}": 10 for i in range(4)}, placement="random", seed=seed)
        put(made, "n0", "busy", 10)
        made.place("still-loading", 10, 0.0, exclude=["n0", "n2", "n3"])  # n1 is full of a loading model
        picks = []
        for i in range(40):
            decision = made.place(f"m{i}", 1, 1.0)
            made.failed(decision.node, f"m{i}")
            picks.append(decision.node)
        return picks

    picks = choices(7)
    assert picks == choices(7)
    assert picks != choices(8)
    assert set(picks) == {"n0", "n2", "n3"}  # n0 can evict "busy"; n1 cannot evict a loading model


def test_a_model_no_budget_can_hold_is_too_large_and_one_none_can_take_now_is_busy() -> None:
    made = cluster({"a": 10, "b": 20})
    with pytest.raises(ModelTooLargeError, match=r"more than any node's model-memory budget"):
        made.place("huge", 21, 0.0)
    with pytest.raises(CacheBusyError):
        made.place("big", 15, 0.0, exclude=["b"])  # a is too small, b excluded
    made.place("loading", 20, 0.0)
    with pytest.raises(CacheBusyError, match=r"busy loading"):
        made.place("big", 15, 0.0)  # b's only model is still loading: it cannot be evicted
    made.loaded("b", "loading", 20, 5.0)
    assert made.place("big", 15, 6.0) == Decision("b", ["loading"])
    with pytest.raises(CacheBusyError, match=r"no node has joined"):
        Placement().place("x", 1, 0.0)


def test_a_load_larger_than_reserved_evicts_more_on_its_node() -> None:
    made = cluster({"a": 10}, eviction="lru")
    put(made, "a", "x", 4)
    put(made, "a", "y", 4)
    assert made.place("z", 2, 1.0) == Decision("a", [])
    assert made.loaded("a", "z", 5, 2.0) == ["x"]  # 4 + 4 + 5 > 10: the least recently used goes
    assert made.snapshot()["nodes"]["a"]["used_bytes"] == 9
    made.place("w", 1, 3.0)
    with pytest.raises(ModelTooLargeError):
        made.loaded("a", "w", 11, 4.0)  # more than the whole budget: dropped, the caller unloads it
    assert made.replicas("w") == [] and made.loading("w") == []


def test_failed_releases_the_reservation_and_unloaded_forgets_the_replica() -> None:
    made = cluster({"a": 10})
    made.place("x", 10, 0.0)
    made.failed("a", "x")
    assert made.loading("x") == []
    put(made, "a", "y", 10, 1.0)
    made.unloaded("a", "y")
    made.unloaded("a", "y")  # whatever the reason, twice is harmless
    assert made.replicas("y") == [] and made.place("x", 10, 2.0) == Decision("a", [])


def test_a_load_finished_for_a_model_not_loading_there_is_refused() -> None:
    made = cluster({"a": 10})
    with pytest.raises(ValueError, match=r"not loading on node 'a'"):
        made.loaded("a", "x", 1, 0.0)


def test_remove_node_returns_what_it_held_and_forgets_those_replicas() -> None:
    made = cluster({"a": 10, "b": 10})
    put(made, "a", "x", 4)
    put(made, "b", "x", 4)
    made.place("y", 4, 1.0, exclude=["b"])
    assert made.remove_node("a") == ["x", "y"]
    assert made.nodes() == ["b"] and made.replicas("x") == ["b"] and made.loading("y") == []
    assert made.place("y", 4, 2.0) == Decision("b", [])


def test_a_node_being_drained_takes_no_placement_and_names_the_models_to_move() -> None:
    made = cluster({"a": 10, "b": 10, "c": 10})
    put(made, "a", "busy", 2, now=0.0)  # requested lately, held only on a: moved
    put(made, "a", "idle", 2, now=0.0)  # not requested for longer than the window: written off
    put(made, "a", "shared", 2, now=0.0)  # held on b too: not moved
    put(made, "b", "shared", 2, now=0.0)
    ask(made, {"busy": 1, "shared": 1}, 100.0)
    assert made.drain("a", now=120.0, used_within_s=60.0) == [("busy", 2)]
    assert made.replicas("shared") == ["b"] and made.replicas("busy") == []  # a's replicas no longer count
    assert made.place("busy", 2, 121.0, exclude=["c"]) == Decision("b", [])  # a is never chosen, whatever its room
    with pytest.raises(CacheBusyError):
        made.place("other", 2, 121.0, exclude=["b", "c"])
    for now in (500.0, 600.0):  # a sustained fall would remove one of two replicas: b is the one counted, it stays
        assert made.scale({"shared": ModelLoad(0, 10)}, now) == []
    assert made.remove_node("a") == ["busy", "idle", "shared"]


def test_requests_feed_the_shared_statistics_and_each_holder_s_eviction_policy() -> None:
    made = cluster({"a": 10, "b": 10}, placement="iam", eviction="iam")
    put(made, "a", "x", 5)
    put(made, "a", "y", 5)
    put(made, "b", "x", 5)
    ask(made, {"y": 1}, 1.0)
    ask(made, {"x": 3, "never-placed": 2}, 31.0)
    assert made.stats.get("x").requests == 3 and made.stats.get("never-placed").requests == 2
    assert made.stats.rate("x", 31.0) == pytest.approx(3 / 30)  # three in the 30 s since the cluster's first
    ask(made, {"y": 1}, 32.0)  # y: two requests 31 s apart, x: three in 30 s; same size and load time
    # a's IAM queue, refreshed by the requests past its 30 s period, keeps the busier x
    assert made.place("z", 5, 33.0, exclude=["b"]) == Decision("a", ["y"])
    lru = cluster({"a": 10}, eviction="lru", placement="lru")
    put(lru, "a", "x", 5)
    put(lru, "a", "y", 5)
    ask(lru, {"x": 1}, 1.0)  # x was loaded first, but is now the most recently used
    assert lru.place("z", 5, 2.0) == Decision("a", ["y"])


def test_scale_adds_what_demand_exceeds_counting_loading_replicas() -> None:
    made = cluster({"a": 10, "b": 10, "c": 10})
    put(made, "a", "x", 5)
    # each replica is to run at 80% of its 10 req/s: 25 req/s wants four
    assert made.scale({"x": ModelLoad(arrival_rps=25, capacity_rps=10)}, 1.0) == [ScaleAction("x", ScaleKind.ADD)] * 3
    assert made.scale({"x": ModelLoad(5, 10, queued=30)}, 1.0) == [ScaleAction("x", ScaleKind.ADD)] * 2  # 5 + 30/2 s
    made.place("x", 5, 1.0)  # one replica on its way
    assert made.scale({"x": ModelLoad(25, 10)}, 2.0) == [ScaleAction("x", ScaleKind.ADD)] * 2
    assert made.scale({"x": ModelLoad(16, 10)}, 2.0) == []  # exactly two at 80%
    assert made.scale({"cold": ModelLoad(100, 10)}, 2.0) == []  # on no node: place() loads it on first use


def test_scale_removes_one_replica_after_a_sustained_fall_and_never_the_last() -> None:
    made = cluster({"a": 10, "b": 10, "c": 10})
    for node in ("a", "b", "c"):
        put(made, node, "x", 5)
    put(made, "b", "filler", 3)  # b has the least free bytes: its replica goes first
    low = {"x": ModelLoad(4, 10)}  # two replicas would run at 20% < 50%
    assert made.scale(low, 0.0) == []
    assert made.scale({"x": ModelLoad(15, 10)}, 30.0) == []  # back up in between: the clock restarts
    assert made.scale(low, 40.0) == []
    assert made.scale(low, 99.0) == []
    assert made.scale(low, 100.0) == [ScaleAction("x", ScaleKind.REMOVE, "b")]
    made.unloaded("b", "x")
    assert made.scale(low, 120.0) == []  # the next removal waits as long again
    assert made.scale(low, 160.0) == [ScaleAction("x", ScaleKind.REMOVE, "a")]  # a and c tie on free bytes: by name
    made.unloaded("a", "x")
    assert made.scale({"x": ModelLoad(0, 10)}, 1000.0) == []  # never below one replica
    # Hysteresis: 4.9 req/s on two replicas is < 50% of one, so one goes; on the one left, up to 80% (8 req/s) adds
    # nothing back.
    two = cluster({"a": 10, "b": 10})
    put(two, "a", "y", 5)
    put(two, "b", "y", 5)
    two.scale({"y": ModelLoad(4.9, 10)}, 0.0)
    assert [a.kind for a in two.scale({"y": ModelLoad(4.9, 10)}, 60.0)] == [ScaleKind.REMOVE]
    two.unloaded("a", "y")
    assert two.scale({"y": ModelLoad(4.9, 10)}, 61.0) == []
    assert two.scale({"y": ModelLoad(8, 10)}, 62.0) == []
    assert two.scale({"y": ModelLoad(8.1, 10)}, 63.0) == [ScaleAction("y", ScaleKind.ADD)]


def test_snapshot_lists_each_node_s_budget_use_and_residents() -> None:
    made = cluster({"a": 10})
    put(made, "a", "x", 4)
    made.place("y", 3, 1.0)
    assert made.snapshot() == {
        "placement": "iam",
        "eviction": "iam",
        "nodes": {
            "a": {
                "budget_bytes": 10,
                "used_bytes": 7,
                "residents": {"x": {"state": "LOADED", "bytes": 4}, "y": {"state": "LOADING", "bytes": 3}},
            }
        },
    }


def test_walks_leave_the_orders_whole() -> None:
    made = skewed("iam")
    assert made.place("p", 10, 4.0, exclude=["b"]) == Decision("a", ["x", "y"])  # the walk passed z on its way
    assert made.place("q", 10, 4.0) == Decision("b", ["z"])  # and put it back


def test_names_are_checked() -> None:
    with pytest.raises(ConfigError, match=r"unknown placement policy 'nearest'"):
        create_placement("nearest")
    with pytest.raises(ConfigError, match=r"eviction policy 'oracle' cannot run a cluster"):
        Placement(eviction="oracle")
    with pytest.raises(ValueError, match=r"already part of the cluster"):
        cluster({"a": 10}).add_node("a", 10)
    with pytest.raises(ValueError, match=r"capacity must be positive"):
        ModelLoad(1, 0)
    assert math.isinf(create_placement("iam").order_key(Placement().stats, "never-requested", 0.0) or 0.0)
