"""A server's metrics on a cluster: every series of a node labelled with it, checked with prometheus-client's own
parser. Stand-ins for the server's parts, as the metrics reference builds them."""

from __future__ import annotations

from collections import Counter
from types import SimpleNamespace
from typing import Any

from prometheus_client.core import Metric
from prometheus_client.parser import text_string_to_metric_families

from adaserve.planner.planner import PlannerStats
from adaserve.server.dataplane import ClusterState
from adaserve.server.metrics import exposition, node_families
from adaserve.server.trace import Tracer, TraceSettings


def _plane(node: str | None) -> Any:
    """A server with nothing loaded and DAG query `pipe`, whose node `second` ran model `double` twice; on a cluster
    (`node` named) it forwarded 5 requests for mlp to node b."""
    router = SimpleNamespace(all_engines=list, hosts=SimpleNamespace(waiting_pids=[], launches={}), cache=None)
    planner = SimpleNamespace(stats=PlannerStats(choices=Counter({("second", "double"): 2})))
    state = ClusterState({("mlp", "b"): 5}, {}, {"mlp": ["b"]}, ["a", "b"], {}, 3)
    cluster = None if node is None else SimpleNamespace(node=node, state=lambda: state)
    return SimpleNamespace(
        router=router,
        dags=SimpleNamespace(planners={"pipe": planner}),
        tracer=Tracer(TraceSettings(), None),
        response_cache=None,
        cluster=cluster,
    )


def _samples(families: list[Metric]) -> dict[str, list[dict[str, str]]]:
    """Each sample's name → the labels of its series."""
    samples: dict[str, list[dict[str, str]]] = {}
    for family in families:
        for sample in family.samples:
            samples.setdefault(sample.name, []).append(sample.labels)
    return samples


def _parsed(families: list[Metric]) -> list[Metric]:
    return list(text_string_to_metric_families(exposition(families).decode()))


def test_on_a_cluster_every_series_of_a_node_carries_its_name() -> None:
    alone = _samples(node_families(_plane(None)))  # a server alone: its series as they always were
    assert alone.pop("adaserve_dag_node_runs_total") == [{"dag": "pipe", "node": "second", "model": "double"}]
    assert not any("node" in labels for series in alone.values() for labels in series)
    on_a = _samples(_parsed(node_families(_plane("a"))))
    assert all(labels["node"] == "a" for series in on_a.values() for labels in series)
    # a DAG query's node keeps its label as Prometheus keeps a target's clashing one; a forward names its holder
    assert on_a["adaserve_dag_node_runs_total"] == [
        {"node": "a", "dag": "pipe", "exported_node": "second", "model": "double"}
    ]
    assert on_a["adaserve_cluster_forwarded_requests_total"] == [{"node": "a", "model": "mlp", "holder": "b"}]
