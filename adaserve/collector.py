"""The garbage collector in the server's process: the heap it built to start is frozen once it serves.

CPython runs a full collection whenever the objects promoted to the oldest generation since the last one exceed a
quarter of those that survived it. Under load, a request's objects that are still in flight when a young collection
runs are promoted and die by reference count soon after, so the count keeps rising and full collections keep
coming, each walking every object the imports and the loaded models left (some 65,000), to find nothing. Frozen
(`gc.freeze`), those objects are left out of every later collection, which walks only what came after. Measured in
the server's process on the 2-core VM under 3,000 req/s of the example `cnn`, a full collection every 3-7 s: 23-46 ms
each with the event loop stopped, against 1-4 ms (one of 9) frozen.

The model hosts freeze theirs after the zygote's imports (`adaserve.engine.host`); the server's process freezes
its own once it serves, the gRPC frontend's process (`--grpc-frontend process`) once it listens. From then on the
server's process times every collection: `adaserve_gc_pause_seconds` in `/metrics` (`adaserve.server.metrics`).
"""

from __future__ import annotations

import gc


def freeze_startup_heap() -> int:
    """Collect the garbage of starting, then freeze what survives; returns how many objects were frozen. Once, when
    the server starts serving: an object frozen is never collected, so freezing again later, with requests in
    flight, could keep their garbage for good."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()
