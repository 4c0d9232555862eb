"""A node server's view of the cluster: the routing table the controller last sent, and where a request goes.

A request for a model this node holds is served here; one for a model other nodes hold goes to one of them, in
turn; one for a model no node holds waits for the controller to place it, and every request for it that arrives
meanwhile waits for the same placement (one `Place` is sent, never a second load).
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable

from adaserve.distributed.messages import NodeAddress, Routes
from adaserve.errors import ModelNotReadyError

#: How long a request waits for the controller to place a model no node holds before it is answered 503.
PLACE_TIMEOUT_S = 120.0


class ClusterRoutes:
    """The table as this node (`node`) has it; `ask_to_place(model)` tells the controller a model is wanted."""

    def __init__(self, node: str, ask_to_place: Callable[[str], None]) -> None:
        self.node = node
        self.table = Routes(version=0, nodes={}, replicas={})
        self._ask_to_place = ask_to_place
        self._turns: dict[str, itertools.count[int]] = {}
        self._waiting: dict[str, asyncio.Future[None]] = {}  # models asked to be placed, until a table has them

    def update(self, table: Routes) -> None:
        """Take a newer table (an older one, arriving late, is ignored); wake the requests waiting for a model it
        places."""
        if table.version <= self.table.version:
            return
        self.table = table
        for model in [m for m in self._waiting if table.replicas.get(m)]:
            waiting = self._waiting.pop(model)
            if not waiting.done():
                waiting.set_result(None)

    def holders(self, model: str) -> list[str]:
        return list(self.table.replicas.get(model, ()))

    async def target(self, model: str) -> NodeAddress | None:
        """Where a request for `model` goes: None to serve it here (this node holds it); else the node, in turn
        among those that hold it. A model no node holds is placed first (ModelNotReadyError when that takes longer
        than PLACE_TIMEOUT_S)."""
        holders = self.holders(model)
        if not holders:
            await self._placed(model)
            holders = self.holders(model)
        if self.node in holders:
            return None
        turn = next(self._turns.setdefault(model, itertools.count()))
        return self.table.nodes[holders[turn % len(holders)]]

    async def _placed(self, model: str) -> None:
        waiting = self._waiting.get(model)
        if waiting is None:
            waiting = self._waiting[model] = asyncio.get_running_loop().create_future()
            self._ask_to_place(model)
        try:
            await asyncio.wait_for(asyncio.shield(waiting), PLACE_TIMEOUT_S)
        except TimeoutError:
            self._waiting.pop(model, None)
            raise ModelNotReadyError(
                f"model '{model}' is held by no node, and the placement controller placed it nowhere within "
                f"{PLACE_TIMEOUT_S:g} s"
            ) from None
