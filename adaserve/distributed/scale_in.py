"""Automatic scale-in: a node that has served no request for a while is given back, down to a floor of nodes.

A node server's actor holds all of its node's CPUs in Ray's books while it runs (its server's cores, which Packrat
plans), so Ray's autoscaler never finds the node idle and never removes it. Only a drain (`Controller.drain`, what
`adaserve cluster drain` asks for) stops the actor and frees them. With scale-in on, the controller asks
`IdleNodes` every few seconds which node has been idle longest past `idle_s`, while more than `min_nodes` serve, and
drains it by that same path: its recently used models are placed elsewhere first, its accepted requests answered.

A node is busy when a request arrives there (clients use it as an entry point, even for models it forwards) or
when its engines compute (other nodes forward it requests): what the report each node sends every second says
(`Requests`). A node that just joined counts as busy from then.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from adaserve.errors import ConfigError


@dataclass(frozen=True)
class ScaleIn:
    """Give back a node idle `idle_s` seconds while more than `min_nodes` nodes serve."""

    idle_s: float
    min_nodes: int = 1

    def __post_init__(self) -> None:
        if not self.idle_s > 0:
            raise ConfigError(f"scale-in idle time must be above 0 s, got {self.idle_s:g}")
        if self.min_nodes < 1:
            raise ConfigError(f"scale-in keeps at least 1 node, got min_nodes {self.min_nodes}")


class IdleNodes:
    """When each node was last busy (the controller's monotonic clock)."""

    def __init__(self) -> None:
        self._busy_at: dict[str, float] = {}

    def busy(self, node: str, now: float) -> None:
        self._busy_at[node] = now

    def forget(self, node: str) -> None:
        self._busy_at.pop(node, None)

    def idlest(self, serving: Collection[str], settings: ScaleIn, now: float) -> str | None:
        """The node of `serving` to give back now: the one idle longest, if at least `settings.idle_s`, and only
        while more than `settings.min_nodes` serve; else None. A node not seen yet counts as busy now."""
        if len(serving) <= settings.min_nodes:
            return None
        idle = [(self._busy_at.get(node, now), node) for node in serving]
        since, node = min(idle)
        return node if now - since >= settings.idle_s else None
