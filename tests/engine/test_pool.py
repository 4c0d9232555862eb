"""The input pool: slot allocation in ring order (pure logic) and the shared memory both sides map."""

from __future__ import annotations

import itertools
import os
import random
from collections.abc import Iterator

import numpy as np
import pytest

from adaserve.config import ModelConfig, TensorSpec
from adaserve.engine.pool import PoolLayout, SharedRings, SlotRing

# -- SlotRing --------------------------------------------------------------------------------------------------


def filled_ring(slots: int, *runs: int) -> tuple[SlotRing, list[int]]:
    """A ring with `runs` allocated one after another; returns the ring and each run's first slot."""
    ring = SlotRing(slots)
    starts = []
    for rows in runs:
        start = ring.allocate(rows)
        assert start is not None
        starts.append(start)
    return ring, starts


def test_allocations_follow_each_other_in_ring_order() -> None:
    ring, starts = filled_ring(10, 3, 2, 4)
    assert starts == [0, 3, 5]
    assert ring.in_use == 9


def test_a_run_that_would_cross_the_end_starts_again_at_slot_0() -> None:
    ring, [first, _] = filled_ring(8, 3, 3)
    ring.free(first, 3)
    assert ring.allocate(3) == 0  # slots 6..8 would cross the end
    assert ring.allocate(2) == 6  # what fits before the end is still used, in ring order


def test_freed_slots_are_reused_only_when_the_head_comes_round() -> None:
    ring, [first, _] = filled_ring(8, 2, 2)
    ring.free(first, 2)
    assert ring.allocate(2) == 4  # slots 0..1 are free again, but the head is at 4
    assert ring.allocate(2) == 6
    assert ring.allocate(2) == 0


def test_an_empty_ring_starts_again_at_slot_0() -> None:
    """Under light load requests keep to the first slots, whose pages are resident (see SlotRing)."""
    ring, [first, second] = filled_ring(8, 2, 3)
    ring.free(second, 3)
    ring.free(first, 2)
    assert ring.allocate(2) == 0  # not 5, where the head was
    assert ring.allocate(2) == 2


def test_frees_out_of_order() -> None:
    ring, [a, b, c] = filled_ring(6, 2, 2, 2)
    ring.free(b, 2)
    ring.free(c, 2)
    ring.free(a, 2)
    assert ring.in_use == 0
    assert ring.allocate(6) == 0


def test_allocation_skips_a_busy_hole_left_by_a_slow_batch() -> None:
    ring, [a, slow, c, d] = filled_ring(8, 2, 2, 2, 2)
    assert slow == 2
    for start in (a, c, d):  # every batch finished except the slow one in slots 2..3
        ring.free(start, 2)
    assert ring.allocate(3) == 4  # the head wrapped to 0; 0..2 would overlap the slow batch
    assert ring.allocate(2) == 0  # 7..8 would cross the end; 0..1 is free
    assert ring.allocate(1) == 7
    assert ring.in_use == 8


def test_full_ring_returns_none() -> None:
    ring, _ = filled_ring(4, 4)
    assert ring.allocate(1) is None
    assert ring.in_use == 4


def test_more_rows_than_slots_returns_none() -> None:
    ring = SlotRing(4)
    assert ring.allocate(5) is None
    assert ring.in_use == 0


def test_fragmented_ring_returns_none_even_with_enough_free_slots() -> None:
    ring, starts = filled_ring(8, 2, 2, 2, 2)
    ring.free(starts[1], 2)
    ring.free(starts[3], 2)
    assert ring.in_use == 4
    assert ring.allocate(3) is None  # 4 free slots, but in two runs of 2
    assert ring.in_use == 4
    assert ring.allocate(2) == 2


def test_failed_allocation_leaves_the_head_where_it_was() -> None:
    ring, starts = filled_ring(8, 2, 2, 2)
    ring.free(starts[0], 2)
    assert ring.allocate(4) is None
    assert ring.allocate(2) == 6


def first_fit_from(head: int, used: list[bool], rows: int) -> int | None:
    """The model: the first start, in ring order from the head, of `rows` free slots that do not cross the end."""
    slots = len(used)
    for start in itertools.chain(range(head, slots), range(head)):
        if start + rows <= slots and not any(used[start : start + rows]):
            return start
    return None


def random_operations(rng: random.Random, slots: int, steps: int) -> Iterator[tuple[str, int]]:
    for _ in range(steps):
        if rng.random() < 0.6:
            yield "allocate", rng.randint(1, max(1, slots // 2) if rng.random() < 0.9 else slots + 1)
        else:
            yield "free", rng.randrange(1 << 30)


@pytest.mark.parametrize("seed", range(150))
def test_random_allocations_match_a_first_fit_model(seed: int) -> None:
    rng = random.Random(seed)
    slots = rng.randint(1, 24)
    ring = SlotRing(slots)
    used = [False] * slots
    live: dict[int, int] = {}  # start -> rows
    head = 0
    for op, value in random_operations(rng, slots, 80):
        if op == "free":
            if not live:
                continue
            freed = sorted(live)[value % len(live)]  # any live allocation: workers finish out of order
            rows = live.pop(freed)
            ring.free(freed, rows)
            used[freed : freed + rows] = [False] * rows
            if not live:
                head = 0  # an empty ring starts again at slot 0
        else:
            rows = value
            expected = first_fit_from(head, used, rows) if rows <= slots else None
            start = ring.allocate(rows)
            assert start == expected, f"allocate({rows}) with head {head}, used {used}"
            if start is not None:
                assert start >= 0 and start + rows <= slots
                assert not any(used[start : start + rows]), "overlaps a live allocation"
                used[start : start + rows] = [True] * rows
                live[start] = rows
                head = (start + rows) % slots
        assert ring.in_use == sum(live.values()) == sum(used)


# -- PoolLayout and SharedRings --------------------------------------------------------------------------------


def spec(name: str, datatype: str, *row_shape: int) -> TensorSpec:
    return TensorSpec(name=name, datatype=datatype, shape=(-1, *row_shape))


def pool_config() -> ModelConfig:
    """Row sizes that are not multiples of 64 bytes, so alignment matters."""
    return ModelConfig(
        name="pool",
        inputs=(spec("image", "FP32", 3), spec("mask", "BOOL", 5), spec("ids", "INT64", 2, 3)),
        outputs=(spec("scores", "FP64", 7), spec("label", "INT32")),
    )


def test_layout_regions_are_aligned_and_do_not_overlap() -> None:
    layout = PoolLayout.for_config(pool_config(), slots=9)
    regions = [*layout.inputs, *layout.outputs]
    assert [r.name for r in regions] == ["image", "mask", "ids", "scores", "label"]
    assert [r.row_bytes for r in regions] == [12, 5, 48, 56, 4]
    assert regions[0].offset == 0
    spans = [(r.offset, r.offset + r.row_bytes * layout.slots) for r in regions]
    for region, (begin, end) in zip(regions, spans, strict=True):
        assert begin % 64 == 0, region
        assert end <= layout.size
    for (_, end), (next_begin, _) in itertools.pairwise(spans):
        assert end <= next_begin
    assert layout.size == spans[-1][1] + (-spans[-1][1] % 64)


def test_layout_keeps_datatype_and_row_shape() -> None:
    layout = PoolLayout.for_config(pool_config(), slots=4)
    ids = layout.inputs[2]
    assert (ids.datatype, ids.row_shape) == ("INT64", (2, 3))
    assert layout.outputs[1].row_shape == ()


@pytest.fixture
def shared() -> Iterator[tuple[SharedRings, SharedRings]]:
    """The server's rings and a worker's rings over the same memfd (the worker gets its own copy of the fd)."""
    layout = PoolLayout.for_config(pool_config(), slots=6)
    server, fd = SharedRings.create(layout, "test")
    worker_fd = os.dup(fd)
    worker = SharedRings(layout, worker_fd)
    yield server, worker
    worker.close()
    server.close()
    os.close(worker_fd)
    os.close(fd)


def test_rings_are_views_of_every_slot(shared: tuple[SharedRings, SharedRings]) -> None:
    server, _ = shared
    shapes = [(ring.shape, ring.dtype) for ring in (*server.inputs, *server.outputs)]
    assert shapes == [
        ((6, 3), np.float32),
        ((6, 5), np.bool_),
        ((6, 2, 3), np.int64),
        ((6, 7), np.float64),
        ((6,), np.int32),
    ]


def test_a_worker_reads_in_place_what_the_server_wrote(shared: tuple[SharedRings, SharedRings]) -> None:
    server, worker = shared
    rng = np.random.default_rng(0)
    image = rng.standard_normal((3, 3)).astype(np.float32)
    mask = rng.random((3, 5)) > 0.5
    ids = rng.integers(-(2**40), 2**40, size=(3, 2, 3))
    server.inputs[0][2:5] = image
    server.inputs[1][2:5] = mask
    server.inputs[2][2:5] = ids

    np.testing.assert_array_equal(worker.inputs[0][2:5], image)
    np.testing.assert_array_equal(worker.inputs[1][2:5], mask)
    np.testing.assert_array_equal(worker.inputs[2][2:5], ids)
    assert not worker.inputs[0][:2].any() and not worker.inputs[0][5:].any()  # nothing spilled into other slots


def test_the_server_reads_what_a_worker_wrote(shared: tuple[SharedRings, SharedRings]) -> None:
    server, worker = shared
    worker.outputs[0][4] = np.arange(7, dtype=np.float64)
    worker.outputs[1][:] = np.arange(6, dtype=np.int32)

    np.testing.assert_array_equal(server.outputs[0][4], np.arange(7))
    np.testing.assert_array_equal(server.outputs[1], np.arange(6))
    assert not server.inputs[2].any()  # the output region is not the input region


def test_tensors_do_not_share_bytes(shared: tuple[SharedRings, SharedRings]) -> None:
    server, worker = shared
    for ring in (*server.inputs, *server.outputs):
        ring[...] = 1
    worker.inputs[1][...] = False  # the 5-byte BOOL rows sit between two aligned regions
    assert server.inputs[0].all() and server.inputs[2].all() and server.outputs[0].all()
