"""Prometheus `/metrics`: the engines' counters rendered at scrape time, per model and version.

Names follow Triton's (`nv_inference_request_success` → `adaserve_inference_request_success`) where one fits, and
the model cache's follow ModelMesh's and SageMaker multi-model endpoints' (cache hits/misses, loading time, resident
bytes, capacity and used bytes, loaded model count).

On a cluster each node server's series carry its name as `node` (`node_families`), and any node answers for the
whole cluster (`GET /metrics/cluster`): its own series and the other nodes', merged here (`cluster_families`) from
the expositions `adaserve.distributed.member` gathers.
"""

from __future__ import annotations

import gc
import time
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from adaserve.cache import ModelCache
from adaserve.engine.processes import HostLauncher
from adaserve.engine.router import ModelRouter
from adaserve.engine.stats import Histogram
from adaserve.planner.catalog import DagCatalog
from adaserve.server.dataplane import ClusterView, DataPlane
from adaserve.server.response_cache import ResponseCache
from adaserve.server.trace import Tracer

LABELS = ["model", "version"]
#: Pause buckets (seconds): a young collection takes well under a millisecond, an unfrozen full one tens of them.
PAUSE_BUCKETS_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25)
#: CPython's generations, youngest first.
GENERATIONS = (0, 1, 2)


class EngineCollector:
    """Reads every loaded engine's `ModelStats` when Prometheus scrapes."""

    def __init__(self, router: ModelRouter) -> None:
        self.router = router

    def collect(self) -> Iterator[Metric]:
        counters = {
            "inference_request_success": "Requests answered successfully",
            "inference_request_failure": "Requests answered with an error (after they were accepted or refused)",
            "inference_count": "Rows (batch elements) computed",
            "inference_exec_count": "Batches executed by workers",
            "worker_restarts": "Worker processes restarted after they died",
            "host_restarts": "Model host processes started again after they died",
            "worker_set_reconfigurations": "Worker sets switched with no downtime (Packrat)",
            "queue_delayed_requests": "Requests whose queue timeout passed and that waited on behind their level "
            "(timeout_action: delay)",
        }
        families = {
            name: CounterMetricFamily(f"adaserve_{name}", text, labels=LABELS) for name, text in counters.items()
        }
        failures = CounterMetricFamily(
            "adaserve_inference_failures", "Failed requests by reason", labels=[*LABELS, "reason"]
        )
        batches = CounterMetricFamily("adaserve_executed_batches", "Batches by executed size", labels=[*LABELS, "size"])
        inflight = GaugeMetricFamily("adaserve_inflight_rows", "Rows computing in workers now", labels=LABELS)
        queued = GaugeMetricFamily("adaserve_queued_rows", "Rows waiting in the input pool now", labels=LABELS)
        queued_by_level = GaugeMetricFamily(
            "adaserve_queued_rows_by_priority_level",
            "Rows waiting now at each priority level, delayed ones included (models with priority_levels)",
            labels=[*LABELS, "level"],
        )
        planned = GaugeMetricFamily(
            "adaserve_worker_set_batch", "Batch size B the running worker set was planned for (Packrat)", labels=LABELS
        )
        workers = GaugeMetricFamily(
            "adaserve_workers", "Workers of the running set, by batch and threads", labels=[*LABELS, "batch", "threads"]
        )
        memory = GaugeMetricFamily(
            "adaserve_model_process_memory_bytes",
            "What the model's host and workers add to the machine's memory: pss (shared pages divided among their "
            "sharers), uss (pages only they hold)",
            labels=[*LABELS, "measure"],
        )
        histograms = {
            "queue_duration_seconds": ("Time from arrival to dispatch to a worker", "queue_s"),
            "compute_duration_seconds": ("Time a worker spent computing a batch", "compute_s"),
            "request_duration_seconds": ("Time from arrival to answer", "request_s"),
        }
        histogram_families = {
            name: HistogramMetricFamily(f"adaserve_{name}", text, labels=LABELS)
            for name, (text, _) in histograms.items()
        }
        for engine in self.router.all_engines():
            labels = [engine.model.name, str(engine.model.version)]
            stats = engine.stats
            families["inference_request_success"].add_metric(labels, stats.success.count)
            families["inference_request_failure"].add_metric(labels, stats.fail.count + stats.failures["overloaded"])
            families["inference_count"].add_metric(labels, stats.inference_count)
            families["inference_exec_count"].add_metric(labels, stats.execution_count)
            families["worker_restarts"].add_metric(labels, stats.worker_restarts)
            families["host_restarts"].add_metric(labels, stats.host_restarts)
            families["worker_set_reconfigurations"].add_metric(labels, stats.reconfigurations)
            families["queue_delayed_requests"].add_metric(labels, stats.delayed)
            if engine.worker_set.batch is not None:
                planned.add_metric(labels, engine.worker_set.batch)
            for (batch, threads), count in Counter((w.batch, w.threads) for w in engine.worker_set.workers).items():
                workers.add_metric([*labels, str(batch), str(threads)], count)
            for reason, count in stats.failures.items():
                failures.add_metric([*labels, reason], count)
            for size, count in sorted(stats.batches.items()):
                batches.add_metric([*labels, str(size)], count)
            held = engine.process_memory()
            memory.add_metric([*labels, "pss"], held.pss_bytes)
            memory.add_metric([*labels, "uss"], held.uss_bytes)
            inflight.add_metric(labels, engine.scheduler.inflight)
            queued.add_metric(labels, engine.scheduler.ready)
            for level in range(1, engine.model.config.batching.priority_levels + 1):
                queued_by_level.add_metric([*labels, str(level)], engine.queued_at_level(level))
            for name_, (_, attribute) in histograms.items():
                histogram: Histogram = getattr(stats, attribute)
                histogram_families[name_].add_metric(labels, _buckets(histogram), histogram.total)
        yield from families.values()
        yield from (failures, batches, inflight, queued, queued_by_level, planned, workers, memory)
        yield from histogram_families.values()
        yield from self._early_exit()

    def _early_exit(self) -> Iterator[Metric]:
        """GATI's learned caches: hit rate per block (hits / lookups), the exit histogram (hits per block and rows
        that ran whole), live agreement of verified hits, and the caches' memory."""
        block = [*LABELS, "block"]
        lookups = CounterMetricFamily("adaserve_early_exit_lookups", "Rows a learned cache looked up", labels=block)
        hits = CounterMetricFamily("adaserve_early_exit_hits", "Rows a learned cache answered", labels=block)
        whole = CounterMetricFamily(
            "adaserve_early_exit_whole", "Rows with early exit on that ran the whole model", labels=LABELS
        )
        verified = CounterMetricFamily(
            "adaserve_early_exit_verified", "Hits also run to the end to check them", labels=LABELS
        )
        agreed = CounterMetricFamily(
            "adaserve_early_exit_agreed", "Verified hits whose class was the base model's", labels=LABELS
        )
        agreement = GaugeMetricFamily(
            "adaserve_early_exit_live_agreement", "Agreed / verified hits since the model loaded", labels=LABELS
        )
        memory = GaugeMetricFamily("adaserve_early_exit_cache_bytes", "Parameters of the learned caches", labels=LABELS)
        retrainings = CounterMetricFamily(
            "adaserve_early_exit_retrainings",
            "Cache adaptations by outcome (accepted: deployed as a new version), across the reloads they caused",
            labels=[*LABELS, "outcome"],
        )
        retrain_s = GaugeMetricFamily(
            "adaserve_early_exit_retrain_seconds", "The last cache retraining's duration", labels=LABELS
        )
        for engine in self.router.all_engines():
            if engine.early_exit is None:
                continue
            labels, stats = [engine.model.name, str(engine.model.version)], engine.stats.early_exit
            for exit_block, count in stats.lookups.items():
                lookups.add_metric([*labels, exit_block], count)
                hits.add_metric([*labels, exit_block], stats.hits[exit_block])
            whole.add_metric(labels, stats.whole)
            verified.add_metric(labels, stats.verified)
            agreed.add_metric(labels, stats.agreed)
            if stats.verified:
                agreement.add_metric(labels, stats.agreed / stats.verified)
            memory.add_metric(labels, engine.cache_bytes)
            if engine.adaptation is not None:  # counted across the reloads that deployed retrained caches
                for outcome, count in engine.retrainings.outcomes.items():
                    retrainings.add_metric([*labels, outcome], count)
                if engine.retrainings.last_s is not None:
                    retrain_s.add_metric(labels, engine.retrainings.last_s)
        yield from (lookups, hits, whole, verified, agreed, agreement, memory, retrainings, retrain_s)


class CacheCollector:
    """The model cache's counters (mCache), named after ModelMesh's and SageMaker multi-model endpoints' metrics."""

    def __init__(self, cache: ModelCache) -> None:
        self.cache = cache

    def collect(self) -> Iterator[Metric]:
        snapshot = self.cache.snapshot()
        counters = {
            "hits": ("model_cache_hits", "Requests that found their model resident"),
            "misses": ("model_cache_misses", "Requests that had to wait for their model to load"),
            "loads": ("model_loads", "Loads of a model on demand"),
            "load_failures": ("model_load_failures", "Loads that failed (the cause is in the logs and the answer)"),
            "evictions": ("model_evictions", "Times a model was evicted to make room for another"),
            "load_seconds_total": ("model_loading_seconds", "Time spent loading models, summed"),
        }
        families = {
            attribute: CounterMetricFamily(f"adaserve_{name}", text, labels=["model"])
            for attribute, (name, text) in counters.items()
        }
        resident = GaugeMetricFamily("adaserve_model_resident_bytes", "Bytes a resident model holds", labels=["model"])
        penalty = GaugeMetricFamily(
            "adaserve_model_load_penalty_seconds", "Smoothed load time P_i the eviction policy sees", labels=["model"]
        )
        for name, model in snapshot.models.items():
            for attribute, family in families.items():
                family.add_metric([name], getattr(model.counters, attribute))
            resident.add_metric([name], model.resident_bytes)
            if model.smoothed_load_s is not None:
                penalty.add_metric([name], model.smoothed_load_s)
        yield from families.values()
        yield from (resident, penalty)
        policy = [snapshot.policy]
        totals = {
            "model_cache_capacity_bytes": ("The model-memory budget", snapshot.budget_bytes),
            "model_cache_used_bytes": ("Bytes held by resident and loading models", snapshot.resident_bytes),
            "loaded_model_count": (
                "Models resident now",
                sum(1 for model in snapshot.models.values() if model.state == "LOADED"),
            ),
        }
        for name, (text, value) in totals.items():
            gauge = GaugeMetricFamily(f"adaserve_{name}", text, labels=["policy"])
            gauge.add_metric(policy, value)
            yield gauge
        busy = CounterMetricFamily(
            "adaserve_model_cache_busy_timeouts", "Requests refused: no room while every model was in use", labels=[]
        )
        busy.add_metric([], snapshot.busy_timeouts)
        yield busy


class HostCollector:
    """Model host processes: spares waiting, and how loads got their host (a spare saves a load the fork)."""

    def __init__(self, hosts: HostLauncher) -> None:
        self.hosts = hosts

    def collect(self) -> Iterator[Metric]:
        spares = GaugeMetricFamily("adaserve_spare_hosts", "Model host processes forked ahead, waiting for a load")
        spares.add_metric([], len(self.hosts.waiting_pids))
        launches = CounterMetricFamily(
            "adaserve_model_host_launches", "Model hosts given a model, by where the host came from", labels=["host"]
        )
        for kind, count in self.hosts.launches.items():
            launches.add_metric([kind], count)
        yield from (spares, launches)


class DagCollector:
    """DAG queries (GATI's planner): queries, SLO misses, the model each node ran, and the nodes replanning moved
    to a more accurate model than the plan at arrival had."""

    def __init__(self, dags: DagCatalog) -> None:
        self.dags = dags

    def collect(self) -> Iterator[Metric]:
        labels = ["dag"]
        success = CounterMetricFamily("adaserve_dag_query_success", "DAG queries answered", labels=labels)
        failure = CounterMetricFamily("adaserve_dag_query_failure", "DAG queries answered with an error", labels=labels)
        missed = CounterMetricFamily(
            "adaserve_dag_slo_missed", "DAG queries answered after their latency SLO", labels=labels
        )
        upgraded = CounterMetricFamily(
            "adaserve_dag_replan_upgrades",
            "Nodes that ran a more accurate model than the plan at arrival had for them (time saved upstream)",
            labels=labels,
        )
        choices = CounterMetricFamily(
            "adaserve_dag_node_runs",
            "Node runs by the model chosen (skipped: no row met its condition)",
            labels=[*labels, "node", "model"],
        )
        duration = HistogramMetricFamily(
            "adaserve_dag_query_duration_seconds", "Time from a DAG query's arrival to its answer", labels=labels
        )
        for name, planner in self.dags.planners.items():
            stats = planner.stats
            success.add_metric([name], stats.success.count)
            failure.add_metric([name], stats.fail.count)
            missed.add_metric([name], stats.slo_missed)
            upgraded.add_metric([name], stats.upgraded)
            for (node, model), count in sorted(stats.choices.items()):
                choices.add_metric([name, node, model], count)
            duration.add_metric([name], _buckets(stats.latency_s), stats.latency_s.total)
        yield from (success, failure, missed, upgraded, choices, duration)


class TraceCollector:
    """Request tracing (`--trace-config`): traces finished, and those lost on the way to the file or collector."""

    def __init__(self, tracer: Tracer) -> None:
        self.tracer = tracer

    def collect(self) -> Iterator[Metric]:
        if self.tracer.sink is None:
            return
        mode = [self.tracer.sink.mode]
        finished = CounterMetricFamily(
            "adaserve_traces", "Traced requests handed to the trace file or exporter", labels=["mode"]
        )
        finished.add_metric(mode, self.tracer.finished)
        dropped = CounterMetricFamily(
            "adaserve_traces_dropped",
            "Traces lost: a trace file that could not be written, an OpenTelemetry exporter behind or gone",
            labels=["mode"],
        )
        dropped.add_metric(mode, self.tracer.sink.dropped)
        yield from (finished, dropped)


class ResponseCacheCollector:
    """The response cache (`--cache-config`): hits and misses of each model version that keeps its answers there,
    as Triton's `nv_cache_num_hits_per_model` and `nv_cache_num_misses_per_model`, and the cache's fill."""

    def __init__(self, cache: ResponseCache, router: ModelRouter) -> None:
        self.cache = cache
        self.router = router

    def collect(self) -> Iterator[Metric]:
        hits = CounterMetricFamily(
            "adaserve_response_cache_hits", "Requests answered from the response cache", labels=LABELS
        )
        misses = CounterMetricFamily(
            "adaserve_response_cache_misses", "Requests of a caching model that found no answer and ran", labels=LABELS
        )
        for engine in self.router.all_engines():
            if engine.model.config.response_cache.enable:
                labels = [engine.model.name, str(engine.model.version)]
                hits.add_metric(labels, engine.stats.cache_hit.count)
                misses.add_metric(labels, engine.stats.cache_miss.count)
        yield from (hits, misses)
        gauges = {
            "entries": ("Answers held", len(self.cache)),
            "used_bytes": ("Bytes the held answers take", self.cache.used_bytes),
            "capacity_bytes": ("The cache's size (--cache-config local,size=)", self.cache.size_bytes),
        }
        for name, (text, value) in gauges.items():
            gauge = GaugeMetricFamily(f"adaserve_response_cache_{name}", text, labels=[])
            gauge.add_metric([], value)
            yield gauge
        counters = {
            "evictions": ("Answers evicted, least recently used first, to make room", self.cache.evictions),
            "too_large": ("Answers not kept: larger than the whole cache", self.cache.too_large),
        }
        for name, (text, value) in counters.items():
            counter = CounterMetricFamily(f"adaserve_response_cache_{name}", text, labels=[])
            counter.add_metric([], value)
            yield counter


def _buckets(histogram: Histogram) -> list[tuple[str, float]]:
    cumulative = 0
    buckets: list[tuple[str, float]] = []
    for bound, count in zip([*map(str, histogram.bounds), "+Inf"], histogram.counts, strict=True):
        cumulative += count
        buckets.append((bound, cumulative))
    return buckets


@dataclass
class Pauses:
    """How long the collections of each generation stopped this process, timed by a `gc.callbacks` hook."""

    by_generation: dict[int, Histogram] = field(
        default_factory=lambda: {g: Histogram(PAUSE_BUCKETS_S) for g in GENERATIONS}
    )
    _started: float = field(default=0.0, init=False)

    @property
    def watching(self) -> bool:
        return self.on_collection in gc.callbacks

    def on_collection(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.by_generation[info["generation"]].observe(time.perf_counter() - self._started)


#: This process's pauses (the collector is the process's too); empty until `watch_pauses`.
PAUSES = Pauses()


def watch_pauses() -> None:
    """Time every collection of this process from now on (once; a second call changes nothing)."""
    if not PAUSES.watching:
        gc.callbacks.append(PAUSES.on_collection)


class GcCollector:
    """The server process's garbage collections, from when it began serving (`adaserve/collector.py`): each one
    stops the event loop, so a long one delays every request in flight."""

    def __init__(self, pauses: Pauses) -> None:
        self.pauses = pauses

    def collect(self) -> Iterator[Metric]:
        family = HistogramMetricFamily(
            "adaserve_gc_pause_seconds",
            "Garbage collections of the server's process by generation (0 the youngest), by how long each stopped it",
            labels=["generation"],
        )
        for generation, histogram in self.pauses.by_generation.items():
            family.add_metric([str(generation)], _buckets(histogram), histogram.total)
        yield family


class ClusterCollector:
    """On a cluster (`adaserve cluster up`, `serve --ray`): this node's forwards (to each model's `holder`), and the
    cluster as its routing table has it."""

    def __init__(self, cluster: ClusterView) -> None:
        self.cluster = cluster

    def collect(self) -> Iterator[Metric]:
        state = self.cluster.state()
        held = Counter(node for nodes in state.replicas.values() for node in nodes)
        families: list[tuple[type[CounterMetricFamily | GaugeMetricFamily], str, str, list[str], Any]] = [
            (
                CounterMetricFamily,
                "adaserve_cluster_forwarded_requests",
                "Requests forwarded to the node holding their model",
                ["model", "holder"],
                state.forwards,
            ),
            (
                CounterMetricFamily,
                "adaserve_cluster_forward_retries",
                "Forwarded requests sent again after their node failed",
                ["model"],
                {(model,): count for model, count in state.retries.items()},
            ),
            (
                GaugeMetricFamily,
                "adaserve_cluster_replicas",
                "Nodes holding each model",
                ["model"],
                {(model,): len(nodes) for model, nodes in state.replicas.items()},
            ),
            (
                GaugeMetricFamily,
                "adaserve_cluster_resident_models",
                "Models each node holds, as this node's routing table has it",
                ["holder"],
                {(node,): held[node] for node in state.nodes},
            ),
            (
                CounterMetricFamily,
                "adaserve_cluster_placement_decisions",
                "The placement controller's decisions: models placed, evicted, refused (failed), replicated, replicas "
                "removed, nodes lost, idle nodes given back (scaled_in)",
                ["decision"],
                {(kind,): count for kind, count in state.decisions.items()},
            ),
            (
                GaugeMetricFamily,
                "adaserve_cluster_routing_table_version",
                "The routing table this node has",
                [],
                {(): state.table_version},
            ),
        ]
        for kind, name, text, labels, values in families:
            family = kind(name, text, labels=labels)
            for key, value in sorted(values.items()):
                family.add_metric(list(key), value)
            yield family


class ClusterScrapeCollector:
    """The cluster-wide exposition (`GET /metrics/cluster`) only: the nodes whose series it holds (1), and those of
    the asking node's routing table that did not answer within 5 s (0, named in its log)."""

    def __init__(self, answered: Mapping[str, bool]) -> None:
        self.answered = answered

    def collect(self) -> Iterator[Metric]:
        up = GaugeMetricFamily(
            "adaserve_cluster_node_up",
            "1: the node's series are in this exposition; 0: it did not answer",
            labels=["node"],
        )
        for node, answered in self.answered.items():
            up.add_metric([node], int(answered))
        yield up


def node_families(plane: DataPlane) -> list[Metric]:
    """This server's own metrics (`GET /metrics`). On a cluster every series has the label `node` (the node's name
    in the routing table), so that the cluster-wide exposition holds each node's series apart; a series that has a
    `node` label of its own (a DAG query's node) keeps it as `exported_node`, as Prometheus keeps a target's label
    that clashes with one it attaches."""
    registry = CollectorRegistry(auto_describe=False)
    if plane.cluster is not None:
        registry.register(ClusterCollector(plane.cluster))
    router = plane.router
    registry.register(EngineCollector(router))
    registry.register(DagCollector(plane.dags))
    registry.register(HostCollector(router.hosts))
    registry.register(TraceCollector(plane.tracer))
    if PAUSES.watching:
        registry.register(GcCollector(PAUSES))
    if router.cache is not None:
        registry.register(CacheCollector(router.cache))
    if plane.response_cache is not None:
        registry.register(ResponseCacheCollector(plane.response_cache, router))
    families = list(registry.collect())
    if plane.cluster is None:
        return families
    return [_on_node(family, plane.cluster.node) for family in families]


def _on_node(family: Metric, node: str) -> Metric:
    labelled = Metric(family.name, family.documentation, family.type, family.unit)
    for sample in family.samples:
        labels = {("exported_node" if name == "node" else name): value for name, value in sample.labels.items()}
        labelled.samples.append(sample._replace(labels={"node": node, **labels}))
    return labelled


def cluster_families(
    node: str, own: list[Metric], peers: Mapping[str, list[Metric]], missing: Iterable[str]
) -> list[Metric]:
    """The cluster-wide exposition's families (`GET /metrics/cluster`): this node's `own` and the other nodes'
    (`peers`, each node's own, parsed from its `/metrics`), one family per name holding every node's series, and
    which nodes answered. A node's family whose type is not this node's (a node of another version during an
    upgrade) is left out: one name has one type in an exposition."""
    merged = {family.name: family for family in own}
    for families in peers.values():
        for family in families:
            held = merged.setdefault(family.name, family)
            if held is not family and held.type == family.type:
                held.samples += family.samples
    answered = dict.fromkeys((node, *peers), True) | dict.fromkeys(missing, False)
    return [*merged.values(), *ClusterScrapeCollector(answered).collect()]


def exposition(families: Iterable[Metric]) -> bytes:
    """`families` in Prometheus's text format."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families(list(families)))
    return generate_latest(registry)


class _Families(Collector):
    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> Iterable[Metric]:
        return self.families
