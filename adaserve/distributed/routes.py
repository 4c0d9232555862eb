"""A node server's view of the cluster: the routing table the controller last sent, and where a request goes.

A request for a model other nodes hold goes to one of them, in turn; one for a model no node holds (or none but
nodes a forwarded request just failed on) waits for the controller to place it, and every request for it that
arrives meanwhile waits for the same placement: one `Place` is sent, never a second load.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable, Collection, Sequence

from adaserve.distributed.messages import NodeAddress, Routes
from adaserve.errors import ModelNotReadyError

#: How long a request waits for the controller to place a model before it is answered 503.
PLACE_TIMEOUT_S = 120.0
#: How often a placement not answered is asked again (a controller that restarted lost the question; asking twice
#: places nothing twice: the controller places a model once).
ASK_AGAIN_S = 5.0


class ClusterRoutes:
    """The table as node `node` has it; `ask_to_place(model, avoid)` tells the controller a model is wanted."""

    def __init__(self, node: str, ask_to_place: Callable[[str, list[str]], None]) -> None:
        self.node = node
        self.table = Routes(version=0, nodes={}, replicas={})
        self._ask_to_place = ask_to_place
        self._turns: dict[str, itertools.count[int]] = {}
        # (model, nodes to avoid) asked to be placed, until a table has a replica outside them
        self._waiting: dict[tuple[str, frozenset[str]], asyncio.Future[None]] = {}
        self._asked: dict[tuple[str, frozenset[str]], float] = {}  # when each was last asked (the loop's clock)

    def update(self, table: Routes) -> None:
        """Take a newer table (an older one, arriving late, is ignored); wake the requests waiting for a model it
        places."""
        if table.version <= self.table.version:
            return
        self.table = table
        for key in [key for key in self._waiting if self._holders(*key)]:
            self._asked.pop(key, None)
            waiting = self._waiting.pop(key)
            if not waiting.done():
                waiting.set_result(None)

    def holders(self, model: str) -> Sequence[str]:
        return self._holders(model, ())

    def _holders(self, model: str, avoid: Collection[str]) -> Sequence[str]:
        """The nodes holding `model` outside `avoid`: with none avoided (every request's first send), the table's
        own list, not a copy."""
        holders = self.table.replicas.get(model, ())
        return [node for node in holders if node not in avoid] if avoid else holders

    async def target(self, model: str, avoid: Collection[str] = ()) -> tuple[str, NodeAddress]:
        """The node a request for `model` goes to (this one among them), in turn among those that hold it outside
        `avoid`. A model held nowhere is placed first: ModelNotReadyError when that takes longer than
        PLACE_TIMEOUT_S."""
        holders = self._holders(model, avoid)
        if not holders:
            await self._placed(model, frozenset(avoid))
            holders = self._holders(model, avoid)
        if self.node in holders:
            return self.node, self.table.nodes[self.node]
        return self.turn(model, holders)

    def turn(self, model: str, holders: Sequence[str]) -> tuple[str, NodeAddress]:
        """The next of `holders` in turn for `model`'s requests, and its address."""
        turns = self._turns.get(model)
        if turns is None:
            turns = self._turns[model] = itertools.count()
        node = holders[next(turns) % len(holders)]
        return node, self.table.nodes[node]

    async def _placed(self, model: str, avoid: frozenset[str]) -> None:
        key = (model, avoid)
        loop = asyncio.get_running_loop()
        waiting = self._waiting.get(key)
        if waiting is None:
            waiting = self._waiting[key] = loop.create_future()
        deadline = loop.time() + PLACE_TIMEOUT_S
        while loop.time() < deadline:
            if loop.time() - self._asked.get(key, -ASK_AGAIN_S) >= ASK_AGAIN_S:  # first, or unanswered for a while:
                self._asked[key] = loop.time()  # a restarted controller lost the question
                self._ask_to_place(model, sorted(avoid))
            try:
                await asyncio.wait_for(asyncio.shield(waiting), min(ASK_AGAIN_S, deadline - loop.time()))
                return
            except TimeoutError:
                continue
        self._waiting.pop(key, None)
        self._asked.pop(key, None)
        raise ModelNotReadyError(
            f"model '{model}' is held by no node, and the placement controller placed it nowhere within "
            f"{PLACE_TIMEOUT_S:g} s"
        ) from None

    def refused(self, model: str, reason: str) -> None:
        """The controller could not place `model` (too large for every node, say): the requests waiting for it get
        a 503 that says why."""
        for key in [key for key in self._waiting if key[0] == model]:
            self._asked.pop(key, None)
            waiting = self._waiting.pop(key)
            if not waiting.done():
                waiting.set_exception(ModelNotReadyError(f"model '{model}' cannot be placed: {reason}"))
