"""The cluster's trace settings, as the placement controller keeps them: one versioned `Tracing` for the whole
cluster, whichever node a change was made on, and the version each node confirmed.

A change is applied to the cluster's settings (a node's own, before any was changed), kept in the deployment's
state (a restarted controller gets it back) and sent to every node; the answer names each node that did not
confirm it within CONFIRM_TIMEOUT_S, with why. A node that did not answer is sent the settings again, each
membership check, until it confirms (`catch_up`): one that missed a change, one that started while a change was
under way, and every node after the controller restarted (it does not know what they have; one that has them
confirms at once). A node that answered it cannot trace so is not sent them again: that would not change, and its
server takes them when it next starts.

A `trace_count` is the cluster's, not each node's: a change that gives one splits it among the nodes (`split`), each
taking its share as its own count, so that a request never waits on another node to be traced. A node whose share
ran out while requests were due a trace says so in its next report (`wanted`); the controller then takes back what
is left of every node's share and hands it to the nodes that want more (`_hand_on`), until none is left. The counts
live on the nodes: a read asks each for what is left (`left`), and a node server that dies takes its share with it,
so the cluster may take fewer traces than it was given, never more.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from typing import Any

import msgspec

from adaserve.distributed.causes import actor_death
from adaserve.distributed.messages import TraceChange, Tracing
from adaserve.distributed.state import DeploymentState
from adaserve.server.trace_state import SERVER

log = logging.getLogger("adaserve.cluster")

#: How long a node has to confirm new trace settings before the change is answered without it.
CONFIRM_TIMEOUT_S = 10.0


class ClusterTracing:
    """The cluster's trace settings (`current`: None until a request changed them) and what each node confirmed;
    `nodes` is the controller's live map of node name → node actor handle."""

    def __init__(self, state: DeploymentState, nodes: Mapping[str, Any]) -> None:
        self.state = state
        self.nodes = nodes
        self.current: Tracing | None = None
        self.confirmed: dict[str, int] = {}  # node → the version it confirmed (or answered it cannot take)
        self.shares: dict[str, dict[str, int]] = {}  # node → scope → its share of the count the last change gave
        self._catching_up: asyncio.Task[None] | None = None  # the settings sent again to the nodes behind
        self._wanting: dict[tuple[str, int], set[str]] = {}  # (scope, serial of its count) → nodes that want more
        self._handing_on: dict[tuple[str, int], asyncio.Task[None]] = {}
        self._used_up: set[tuple[str, int]] = set()  # counts with nothing left on any node

    def load(self) -> None:
        """Take the deployment's settings from its state (a restarted controller's)."""
        self.current = self.state.tracing()

    async def change(self, asking: str, change: TraceChange) -> dict[str, str]:
        """A trace setting request made on node `asking`: applied, kept, and sent to every node; the nodes that did
        not confirm it, with why. A bad request raises InvalidInputError."""
        self.current = changed(self.current, change)
        self.state.save_tracing(self.current)
        self.shares = split_counts(self.current, list(self.nodes))
        self._used_up.clear()
        log.info("trace settings changed", extra={"node": asking, "model": change.model, "changes": change.changes})
        missing = await self.send(self.current, list(self.nodes))
        if missing:
            log.warning("trace settings not confirmed by some nodes", extra={"missing": missing})
        return missing

    async def send(self, tracing: Tracing, names: list[str]) -> dict[str, str]:
        """Send `tracing` to nodes `names`, each with its share of the counts; the nodes that did not confirm it,
        with why."""
        sending = (
            asyncio.wait_for(
                self.nodes[n].trace.remote(msgspec.structs.replace(tracing, shares=self.shares.get(n, {}))),
                CONFIRM_TIMEOUT_S,
            )
            for n in names
        )
        answers = await asyncio.gather(*sending, return_exceptions=True)
        missing = {}
        for name, answer in zip(names, answers, strict=True):
            if isinstance(answer, TimeoutError):
                missing[name] = f"no answer within {CONFIRM_TIMEOUT_S:g} s"
                continue
            if isinstance(answer, BaseException):  # its actor is gone: Ray's account says why
                missing[name] = actor_death(answer)
                continue
            if answer:  # its server cannot trace so
                missing[name] = answer
            if name in self.nodes:
                self.confirmed[name] = max(self.confirmed.get(name, 0), tracing.version)
        return missing

    def started(self, name: str, tracing: Tracing | None) -> None:
        """Node `name`'s server started under `tracing` (a change made meanwhile reaches it by `catch_up`)."""
        if tracing is not None:
            self.confirmed[name] = tracing.version

    def forget(self, name: str) -> None:
        self.confirmed.pop(name, None)
        self.shares.pop(name, None)

    # -- the cluster's trace counts --------------------------------------------------------------------------------
    def wanted(self, node: str, scopes: Mapping[str, int]) -> None:
        """Node `node` used up its share of each scope's count (scope → the change that gave it) with requests
        still due a trace: hand it what the other nodes have left (one pass at a time per count; nodes that want
        more meanwhile are served by the next)."""
        for scope, serial in scopes.items():
            key = (scope, serial)
            if self.current is None or self.current.state.recounted(scope) != serial or key in self._used_up:
                continue  # an older count, or one with nothing left
            self._wanting.setdefault(key, set()).add(node)
            if key not in self._handing_on:
                task = asyncio.get_running_loop().create_task(self._hand_on(scope, serial))
                self._handing_on[key] = task
                task.add_done_callback(lambda _, key=key: self._handing_on.pop(key, None))  # type: ignore[misc]

    async def _hand_on(self, scope: str, serial: int) -> None:
        """Take back what every node has left of the count and split it among the nodes that want more."""
        key = (scope, serial)
        while wanting := self._wanting.pop(key, set()):
            names = list(self.nodes)
            lefts = await self._ask_left(names, scope, serial, take=True)
            total = sum(lefts.values())
            if total == 0:
                self._used_up.add(key)
                log.info("trace count used up", extra={"scope": scope or "server"})
                self._wanting.pop(key, None)
                return
            to = [name for name in names if name in wanting] or names
            given = dict(zip(to, split(total, len(to)), strict=True))
            giving = (self.nodes[n].give_traces.remote(scope, serial, count) for n, count in given.items() if count)
            await asyncio.gather(*giving, return_exceptions=True)
            log.info("trace count handed on", extra={"scope": scope or "server", "given": given})

    async def left(self, scope: str) -> int | None:
        """What is left of scope `scope`'s count (SERVER, or a model with settings of its own) on all the nodes;
        None where no change was made for the cluster, or its count has no limit."""
        if self.current is None or self.current.state.of(scope).count < 0:
            return None
        serial = self.current.state.recounted(scope)
        if (scope, serial) in self._used_up:
            return 0
        return sum((await self._ask_left(list(self.nodes), scope, serial, take=False)).values())

    async def _ask_left(self, names: list[str], scope: str, serial: int, take: bool) -> dict[str, int]:
        """What each of nodes `names` has left of the count (`take`: taken back); a node that does not answer
        within CONFIRM_TIMEOUT_S has none."""
        asking = (
            asyncio.wait_for(self.nodes[n].trace_left.remote(scope, serial, take), CONFIRM_TIMEOUT_S) for n in names
        )
        answers = await asyncio.gather(*asking, return_exceptions=True)
        return {name: answer for name, answer in zip(names, answers, strict=True) if isinstance(answer, int)}

    def catch_up(self) -> None:
        """Send the settings again to the nodes behind them. One pass at a time: a node that does not answer holds
        the next pass back by CONFIRM_TIMEOUT_S at most."""
        if self.current is None or (self._catching_up is not None and not self._catching_up.done()):
            return
        behind = [name for name in self.nodes if self.confirmed.get(name, 0) < self.current.version]
        if behind:
            self._catching_up = asyncio.get_running_loop().create_task(self._catch_up(self.current, behind))

    async def caught_up(self) -> None:
        """Wait for the pass under way, if any (tests)."""
        if self._catching_up is not None:
            await self._catching_up

    async def _catch_up(self, tracing: Tracing, behind: list[str]) -> None:
        missing = await self.send(tracing, behind)
        caught_up = [name for name in behind if name not in missing]
        if caught_up:
            log.info("trace settings confirmed by nodes that were behind", extra={"nodes": caught_up})

    def stop(self) -> None:
        for task in [self._catching_up, *self._handing_on.values()]:
            if task is not None:
                task.cancel()


def changed(tracing: Tracing | None, change: TraceChange) -> Tracing:
    """The cluster's settings `tracing` (None: none changed yet, the asking node's own stand) after `change`, at a
    version above any before, across controller restarts too."""
    current = tracing.state if tracing is not None else change.current
    state = current.changed(change.initial, change.model, change.changes)
    version = max(tracing.version + 1 if tracing is not None else 1, time.time_ns() // 1000)
    return Tracing(version, state)


def split_counts(tracing: Tracing, nodes: list[str]) -> dict[str, dict[str, int]]:
    """Each node's share of each scope's count (the server's, and each model's with settings of its own) in
    `tracing`: the count split among `nodes` (a scope with no limit is not split)."""
    state = tracing.state
    given: dict[str, dict[str, int]] = {node: {} for node in nodes}
    for scope in [SERVER, *state.models]:
        count = state.of(scope).count
        if count >= 0:
            for node, share in zip(nodes, split(count, len(nodes)), strict=True):
                given[node][scope] = share
    return given


def split(count: int, parts: int) -> list[int]:
    """`count` in `parts` shares as even as can be (the first take the remainder): a count among nodes, or a node's
    share among its servers."""
    return [count // parts + (index < count % parts) for index in range(parts)] if parts else []
