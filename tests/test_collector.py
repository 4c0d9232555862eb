"""The server process's garbage collector (adaserve.collector)."""

from __future__ import annotations

import subprocess
import sys

FREEZE_PROBE = """
import gc, weakref
from adaserve.collector import freeze_startup_heap

class Node:
    pass

kept = [Node() for _ in range(20_000)]  # what starting leaves alive: modules, models, routes
cycle = Node()
cycle.self = cycle  # starting's garbage, reachable only by a collection
dead = weakref.ref(cycle)
del cycle
walked_before = len(gc.get_objects())
frozen = freeze_startup_heap()
assert dead() is None, "the garbage of starting was frozen instead of collected"
assert frozen == gc.get_freeze_count() >= 20_000, frozen
assert not any(o is kept[0] for o in gc.get_objects()), "a live object of starting is still walked"
print(walked_before, len(gc.get_objects()))
"""


def test_the_heap_built_to_start_is_frozen_and_its_garbage_collected_first() -> None:
    """A full collection walks only what came after the server began serving: the objects of starting are frozen,
    and the garbage among them was collected first, not frozen for good (in a fresh interpreter: freezing is for a
    whole process)."""
    done = subprocess.run([sys.executable, "-c", FREEZE_PROBE], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    before, after = map(int, done.stdout.split())
    assert before > 20_000 and after < 1_000, (before, after)
