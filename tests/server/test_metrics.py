"""A server's metrics on a cluster: every series of a node labelled with it, and the cluster-wide exposition (each
node's series once, under one `# HELP`/`# TYPE` per family, the nodes that did not answer named), checked with
prometheus-client's own parser. Stand-ins for the server's parts, as the metrics reference builds them."""

from __future__ import annotations

import gc
from collections import Counter
from types import SimpleNamespace
from typing import Any

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families

from adaserve.planner.planner import PlannerStats
from adaserve.server.dataplane import ClusterState
from adaserve.server.metrics import GcCollector, Pauses, cluster_families, exposition, node_families
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


def test_the_cluster_exposition_holds_each_node_once_and_names_the_silent_one() -> None:
    peers = {node: _parsed(node_families(_plane(node))) for node in ("b", "c")}
    text = exposition(cluster_families("a", node_families(_plane("a")), peers, {"d": "did not answer"})).decode()
    families = list(text_string_to_metric_families(text))
    names = [family.name for family in families]
    assert len(names) == len(set(names))  # one family per name, so one # HELP and one # TYPE
    assert text.count("# TYPE adaserve_dag_node_runs_total counter") == 1
    series = [(sample.name, tuple(sorted(sample.labels.items()))) for f in families for sample in f.samples]
    assert len(series) == len(set(series))
    runs = _samples(families)["adaserve_dag_node_runs_total"]
    assert [labels["node"] for labels in runs] == ["a", "b", "c"]
    up = {sample.labels["node"]: sample.value for f in families for sample in f.samples if f.name.endswith("up")}
    assert up == {"a": 1, "b": 1, "c": 1, "d": 0}


def test_a_family_another_node_gives_another_type_is_left_out() -> None:
    other = GaugeMetricFamily("adaserve_dag_node_runs", "runs, as an older node had it", labels=["node"])
    other.add_metric(["b"], 2)
    families = _parsed(cluster_families("a", node_families(_plane("a")), {"b": [other]}, {}))
    runs = next(family for family in families if family.name == "adaserve_dag_node_runs")
    assert runs.type == "counter" and {sample.labels["node"] for sample in runs.samples} == {"a"}


def test_each_garbage_collection_is_timed_under_its_generation() -> None:
    """The pause histogram counts each collection once, under the generation it collected, and its time."""
    pauses = Pauses()
    gc.callbacks.append(pauses.on_collection)
    try:
        gc.collect(2)
        gc.collect(0)
    finally:
        gc.callbacks.remove(pauses.on_collection)
    (family,) = GcCollector(pauses).collect()
    counts = {s.labels["generation"]: s.value for s in family.samples if s.name == "adaserve_gc_pause_seconds_count"}
    sums = {s.labels["generation"]: s.value for s in family.samples if s.name == "adaserve_gc_pause_seconds_sum"}
    assert counts["2"] >= 1 and counts["0"] >= 1 and sums["2"] > 0
