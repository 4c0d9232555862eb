"""The cluster's trace settings, as the placement controller keeps them: one versioned `Tracing` for the whole
cluster, whichever node a change was made on, and the version each node confirmed.

A change is applied to the cluster's settings (a node's own, before any was changed), kept in the deployment's
state (a restarted controller gets it back) and sent to every node; the answer names each node that did not
confirm it within CONFIRM_TIMEOUT_S, with why. A node that did not answer is sent the settings again, each
membership check, until it confirms (`catch_up`): one that missed a change, one that started while a change was
under way, and every node after the controller restarted (it does not know what they have; one that has them
confirms at once). A node that answered it cannot trace so is not sent them again: that would not change, and its
server takes them when it next starts.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from typing import Any

from adaserve.distributed.messages import TraceChange, Tracing
from adaserve.distributed.state import DeploymentState

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
        self._catching_up: asyncio.Task[None] | None = None  # the settings sent again to the nodes behind

    def load(self) -> None:
        """Take the deployment's settings from its state (a restarted controller's)."""
        self.current = self.state.tracing()

    async def change(self, asking: str, change: TraceChange) -> dict[str, str]:
        """A trace setting request made on node `asking`: applied, kept, and sent to every node; the nodes that did
        not confirm it, with why. A bad request raises InvalidInputError."""
        self.current = changed(self.current, change)
        self.state.save_tracing(self.current)
        log.info("trace settings changed", extra={"node": asking, "model": change.model, "changes": change.changes})
        missing = await self.send(self.current, list(self.nodes))
        if missing:
            log.warning("trace settings not confirmed by some nodes", extra={"missing": missing})
        return missing

    async def send(self, tracing: Tracing, names: list[str]) -> dict[str, str]:
        """Send `tracing` to nodes `names`; the nodes that did not confirm it, with why."""
        sending = (asyncio.wait_for(self.nodes[n].trace.remote(tracing), CONFIRM_TIMEOUT_S) for n in names)
        answers = await asyncio.gather(*sending, return_exceptions=True)
        missing = {}
        for name, answer in zip(names, answers, strict=True):
            if isinstance(answer, TimeoutError):
                missing[name] = f"no answer within {CONFIRM_TIMEOUT_S:g} s"
                continue
            if isinstance(answer, BaseException):  # its actor is gone: the first line of Ray's account says so
                missing[name] = first_line(answer)
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
        if self._catching_up is not None:
            self._catching_up.cancel()


def changed(tracing: Tracing | None, change: TraceChange) -> Tracing:
    """The cluster's settings `tracing` (None: none changed yet, the asking node's own stand) after `change`, at a
    version above any before, across controller restarts too."""
    current = tracing.state if tracing is not None else change.current
    state = current.changed(change.initial, change.model, change.changes)
    version = max(tracing.version + 1 if tracing is not None else 1, time.time_ns() // 1000)
    return Tracing(version, state)


def first_line(error: BaseException) -> str:
    """The first line of an error's message (Ray's accounts of a dead actor run to many), else its type's name."""
    return (str(error).strip().splitlines() or [type(error).__name__])[0]
