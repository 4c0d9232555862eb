"""Partial latency budgets (GATI §5.2.1): a query's latency SLO split among the nodes still to run.

The split is taken one input-to-output path at a time, and a node on several paths gets the smallest of its shares,
so that the SLO holds whichever path a request takes. A policy decides the shares along one path; the baseline and
the paper's second policy are both here, and a query's config picks one (`budget_policy`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Protocol

from adaserve.planner.spec import DagConfig


class BudgetPolicy(Protocol):
    def shares(self, path: tuple[str, ...], costs: Mapping[str, float], budget_ms: float) -> dict[str, float]:
        """Each node's part of `budget_ms` along one path; `costs` are the nodes' slowest options' latencies."""
        ...


class EqualSplit:
    """Every node on the path gets the same part of the budget."""

    def shares(self, path: tuple[str, ...], costs: Mapping[str, float], budget_ms: float) -> dict[str, float]:
        return dict.fromkeys(path, budget_ms / len(path))


class ProportionalSplit:
    """A node gets the budget in proportion to its slowest option's latency: L_i = C_i / Σ C_j · L."""

    def shares(self, path: tuple[str, ...], costs: Mapping[str, float], budget_ms: float) -> dict[str, float]:
        total = sum(costs[node] for node in path)
        if total <= 0:
            return EqualSplit().shares(path, costs, budget_ms)
        return {node: costs[node] / total * budget_ms for node in path}


POLICIES: dict[str, BudgetPolicy] = {"equal": EqualSplit(), "proportional": ProportionalSplit()}


def partial_budgets(
    config: DagConfig, among: Iterable[str], costs: Mapping[str, float], budget_ms: float, policy: BudgetPolicy
) -> dict[str, float]:
    """The partial budget of each node in `among` (the nodes still to run): the least share it gets on any path
    through them."""
    budgets: dict[str, float] = {}
    for path in paths(config, set(among)):
        for node, share in policy.shares(path, costs, budget_ms).items():
            budgets[node] = min(budgets.get(node, share), share)
    return budgets


def paths(config: DagConfig, among: set[str]) -> list[tuple[str, ...]]:
    """Every path from a node of `among` that reads from none of them to one that none of them reads from."""
    parents = {name: [p for p in config.node(name).parents if p in among] for name in among}
    children = {name: [c for c in config.children(name) if c in among] for name in among}
    found: list[tuple[str, ...]] = []

    def walk(path: tuple[str, ...]) -> None:
        following = children[path[-1]]
        if not following:
            found.append(path)
        for child in following:
            walk((*path, child))

    for start in (node.name for node in config.nodes if node.name in among and not parents[node.name]):
        walk((start,))
    return found
