"""The placement controller: one Ray actor that decides which models are resident on which nodes.

It keeps the cluster's books in `Placement` (`placement.py`: one resident set per node under its memory budget, the
policy that picks a node for a new replica, and mCache's eviction policies choosing victims), the same objects the
fleet-scale simulator replays traces through. It follows Ray's membership (a node server for each node that joins, its
replicas written off when it leaves, or when its node actor dies for good, which is then started afresh), places a
model on its first request, evicts to make room, drains a node on request (its loaded models moved, its requests
answered, then it stops) or, with scale-in on, once it has been idle a while (`scale_in.py`), sends every node the
routing table whenever it changes, and keeps the cluster's trace settings (a change made on any node is sent to every
node, again to a node that missed it until it confirms, and a node starts under them; a trace count is split among the
nodes and handed on to those that run out). It is restartable: its state
is rebuilt from what the node servers hold (and the drained nodes and the trace settings from Ray's key-value store,
under its deployment's id: `state.py`), and while it is away the nodes keep routing by the last table they have.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Collection
from dataclasses import dataclass, field, replace
from typing import Any

from adaserve.distributed.causes import actor_death
from adaserve.distributed.messages import NodeAddress, Requests, Routes, TraceChange
from adaserve.distributed.node import STOP_TIMEOUT_S, NodeServer, NodeSettings
from adaserve.distributed.placement import ModelLoad, Placement, ScaleKind
from adaserve.distributed.scale_in import IdleNodes, ScaleIn
from adaserve.distributed.state import DeploymentState, KeyValue, RayKeyValue
from adaserve.distributed.trace_settings import ClusterTracing
from adaserve.errors import CacheBusyError, ConfigError, ModelTooLargeError

log = logging.getLogger("adaserve.cluster")

#: The Ray namespace adaserve's actors live in, and their names there.
NAMESPACE = "adaserve"
CONTROLLER = "adaserve-controller"
NODE_PREFIX = "adaserve-node-"
#: How often Ray's membership is read.
MEMBERSHIP_EVERY_S = 1.0
#: How often replication is decided (`Placement.scale`), from the nodes' reports since the last time.
SCALE_EVERY_S = 2.0
#: How long a placement waits for room (models in the way still loading) before the request is refused.
PLACE_TIMEOUT_S = 60.0
#: How long a drain waits, by default, for the requests a node's engines accepted before it stops the node.
DRAIN_TIMEOUT_S = 30.0
#: A model on a node being drained is placed elsewhere first when it has no other replica and was requested (or
#: loaded) this recently; the others are written off and placed again on their next request.
DRAIN_MOVES_USED_WITHIN_S = 60.0
#: A node server that failed to start is tried again after this long, the wait doubling with each failure in a row
#: up to the cap: a node that cannot start (a port taken, a broken repository) is not restarted every second.
START_RETRY_FIRST_S, START_RETRY_MAX_S = 2.0, 60.0


@dataclass
class StartFailures:
    """The nodes whose server failed to start, in a row: when each may be tried again, and why the last try
    failed (`cluster up` names it when it gives up waiting)."""

    first_s: float = START_RETRY_FIRST_S
    max_s: float = START_RETRY_MAX_S
    entries: dict[str, tuple[int, float, str]] = field(default_factory=dict)  # node → (failures, retry at, error)

    def failed(self, node: str, error: str, now: float) -> float:
        """Count a failure; the seconds until the node may be tried again."""
        count = self.entries.get(node, (0, 0.0, ""))[0] + 1
        wait = min(self.max_s, self.first_s * 2 ** (count - 1))
        self.entries[node] = (count, now + wait, error)
        return wait

    def may_start(self, node: str, now: float) -> bool:
        return node not in self.entries or now >= self.entries[node][1]

    def started(self, node: str) -> None:
        self.entries.pop(node, None)

    def describe(self, now: float) -> dict[str, dict[str, Any]]:
        return {
            node: {"failures": count, "error": error, "retry_in_s": round(max(0.0, at - now), 1)}
            for node, (count, at, error) in self.entries.items()
        }


@dataclass(frozen=True)
class ClusterSettings:
    """The cluster's node servers: how each starts (`node`: its ports are the first node's, plus `port_stride`
    times its index, so several nodes on one machine do not collide; 0 on real machines, one node each), each
    node's model-memory budget, and the policies (`eviction`: mCache's, per node; `placement`: which node)."""

    node: NodeSettings
    budget_bytes: int | None = None  # None: the memory Ray counts on each node
    port_stride: int = 0
    eviction: str = "iam"
    placement: str = "iam"
    host_from_ray: bool = False  # listen on the address Ray knows each node by (real machines), not node.host
    log_level: str = "info"
    scale_in: ScaleIn | None = None  # give back nodes idle this long (`scale_in.py`); None: only by `drain`

    def node_settings(self, index: int, host: str) -> NodeSettings:
        """How node `index` starts: the first node's settings on `host`, its ports moved by `index` strides."""
        stride = index * self.port_stride
        return replace(
            self.node, host=host, http_port=self.node.http_port + stride, grpc_port=self.node.grpc_port + stride
        )


class Controller:
    """The placement controller actor of deployment `deployment` (the id its launcher made: its state in Ray's
    key-value store is kept under it; `store` stands for that store in tests)."""

    def __init__(self, settings: ClusterSettings, deployment: str, store: KeyValue | None = None) -> None:
        from adaserve.logs import configure_logging

        configure_logging(settings.log_level)
        self.settings = settings
        self.deployment = deployment
        self.state = DeploymentState(deployment, store if store is not None else RayKeyValue(NAMESPACE))
        self.placement = Placement(settings.eviction, settings.placement)
        self.nodes: dict[str, Any] = {}  # node name → its NodeServer actor handle
        self.addresses: dict[str, NodeAddress] = {}
        self.pids: dict[str, int] = {}
        self.budgets: dict[str, int] = {}
        kinds = ("placed", "evicted", "failed", "lost", "replicated", "removed", "scaled_in")
        self.decisions = dict.fromkeys(kinds, 0)
        self._version = 0
        self._placing: dict[str, asyncio.Task[None]] = {}
        self._ports: dict[str, int] = {}  # node name → its index (its ports are the first node's plus a stride)
        self.start_failures = StartFailures()
        self._membership: asyncio.Task[None] | None = None
        self._starting: asyncio.Future[None] | None = None
        self._scaling: asyncio.Task[None] | None = None
        self._arrivals: Counter[str] = Counter()  # requests per model since the last replication check
        self._queued: dict[str, dict[str, int]] = {}  # model → node → rows queued there (its last report)
        self._capacity: dict[str, dict[str, float]] = {}  # model → node → requests a second it serves there
        self._sizes: dict[str, int] = {}  # model → its bytes once loaded
        self.draining: dict[str, bool] = {}  # node being drained → whether it is out of the routing table yet
        self.drained: set[str] = set()  # drained nodes, not started again while their Ray node stays
        self.scale_in = settings.scale_in
        self.idle = IdleNodes()
        self._scaling_in: asyncio.Task[None] | None = None  # the drain of an idle node under way
        self.tracing = ClusterTracing(self.state, self.nodes)
        self._pinged = time.monotonic()  # when the driver last called `ping` (it made this controller: now)
        self._probes: dict[str, tuple[float, asyncio.Future[Any]]] = {}  # node → its actor's question, since when

    # -- start, membership -------------------------------------------------------------------------------------
    async def start(self) -> None:
        """Rebuild the books from the node servers already running (after a restart), then follow the membership.
        Every call to the controller starts it first: Ray restarts an actor without calling anything, and the first
        node to report (or the driver's ping) brings it back."""
        await asyncio.shield(self._begin())

    def _begin(self) -> asyncio.Future[None]:
        if self._starting is None:
            self._starting = asyncio.ensure_future(self._start())
        return self._starting

    async def ping(self) -> None:
        """The driver's call every few seconds (`launch.py`): it starts a controller Ray restarted, without waiting
        for the start (which waits for node servers), and tells a later start that this deployment's driver lives
        (`driver`)."""
        self._pinged = time.monotonic()
        self._begin()

    async def driver(self) -> dict[str, Any]:
        """The deployment's id and the seconds since its driver last called `ping`: asked by a new start before
        anything else, which takes an orphaned deployment over and refuses to join a live one (`launch.py`). Not
        waiting for the start: a deployment that is starting has its driver."""
        return {"deployment": self.deployment, "silent_s": time.monotonic() - self._pinged}

    async def _start(self) -> None:
        self._load_state()
        await self._adopt_running_nodes()
        await self._follow_membership_once()
        self._membership = asyncio.get_running_loop().create_task(self._follow_membership())
        self._scaling = asyncio.get_running_loop().create_task(self._scale_every())

    def _load_state(self) -> None:
        """Take this deployment's drained nodes and trace settings from the store (a restart's: the same id), after
        removing what earlier deployments left there."""
        removed = self.state.remove_others()
        if removed:
            log.info("removed the state earlier deployments left", extra={"keys": removed})
        self.drained = self.state.drained()
        self.tracing.load()

    async def _adopt_running_nodes(self) -> None:
        import ray

        ray_nodes = {node["NodeID"]: node for node in ray.nodes() if node["Alive"]}
        for name in _node_actors():
            handle = ray.get_actor(NODE_PREFIX + name, namespace=NAMESPACE)
            limit = self.settings.node.unresponsive_s
            try:
                answer: tuple[NodeAddress, int] = await asyncio.wait_for(handle.info.remote(), limit)
                address, pid = answer
                resident = await asyncio.wait_for(handle.resident.remote(), limit)
            except TimeoutError:  # stuck: killed, and a fresh one started by the membership loop
                log.warning("node actor answered nothing: killed", extra={"node": name, "silent_s": limit})
                ray.kill(handle, no_restart=True)
                continue
            except Exception as exc:  # a node actor that cannot answer is left to the membership loop
                log.warning("could not adopt a node", extra={"node": name, "error": actor_death(exc)})
                continue
            self._join(name, handle, address, pid, resident, self._budget(ray_nodes.get(name, {})))
            self._ports[name] = self._index_of(address)
        if self.nodes:
            log.info("rebuilt from the nodes", extra={"nodes": sorted(self.nodes)})
            await self._broadcast()

    async def _follow_membership(self) -> None:
        while True:
            await asyncio.sleep(MEMBERSHIP_EVERY_S)
            try:
                await self._follow_membership_once()
            except Exception:
                log.exception("membership check failed")
            self.tracing.catch_up()

    async def _follow_membership_once(self) -> None:
        import ray

        alive = {node["NodeID"]: node for node in ray.nodes() if node["Alive"]}
        await self._follow(alive, _node_actors())

    async def _follow(self, alive: dict[str, dict[str, Any]], actors: Collection[str]) -> None:
        """Follow Ray's membership: `alive`, its living nodes by id; `actors`, the nodes whose actor is listed (a
        named actor that died is not). A node that left, or whose actor died for good while its Ray node stays
        (its restarts used up, or killed), is dropped; a fresh node server starts on each living node that has
        none (it joined, or its actor was dropped) and is neither drained nor waiting to be tried again."""
        for name in [name for name in self.nodes if name not in alive]:
            await self._drop(name, "its Ray node left the cluster")
        for name, reason in (await self._dead_actors(actors)).items():
            await self._drop(name, f"its node actor died: {reason}")
        for name in self._silent_actors(time.monotonic()):
            limit = self.settings.node.unresponsive_s
            await self._drop(name, f"its node actor answered nothing for {limit:g} s and was killed")
        if not self.drained <= set(alive):  # a machine that rejoins is a new Ray node: it is started
            self.drained &= set(alive)
            self.state.save_drained(self.drained)
        now = time.monotonic()
        joined = [
            (node_id, node)
            for node_id, node in alive.items()
            if node_id not in self.nodes
            and node_id not in self._ports
            and node_id not in self.drained
            and node.get("Resources", {}).get("CPU", 0) > 0
            and self.start_failures.may_start(node_id, now)
        ]
        await asyncio.gather(*(self._add(node_id, node) for node_id, node in joined))

    async def _dead_actors(self, actors: Collection[str]) -> dict[str, str]:
        """The nodes whose actor is not among `actors` and whose call fails as a dead actor's does, with why, in
        words, from Ray's account (`causes.actor_death`; a call confirms it: the list is not the actor's own word).
        A node being drained is left to its drain, which stops its actor."""
        import ray

        unlisted = [name for name in self.nodes if name not in actors and name not in self.draining]
        answers = await asyncio.gather(*(self.nodes[name].info.remote() for name in unlisted), return_exceptions=True)
        return {
            name: actor_death(answer)
            for name, answer in zip(unlisted, answers, strict=True)
            if isinstance(answer, ray.exceptions.ActorDiedError)
        }

    def _silent_actors(self, now: float) -> list[str]:
        """The nodes whose actor has left a question unanswered for `unresponsive_s`: alive (Ray lists it) but
        stuck (stopped, or its event loop blocked), it would never be dropped as dead, and every call to it, the
        routing table's too, would wait on it for ever. Each node not being drained has one question (`info`) out
        at a time, asked again once answered; asking does not wait for the answer."""
        silent = []
        for name, handle in self.nodes.items():
            asked = self._probes.get(name)
            if asked is not None and not asked[1].done():
                if now - asked[0] >= self.settings.node.unresponsive_s and name not in self.draining:
                    silent.append(name)
                continue
            if asked is not None and not asked[1].cancelled():
                asked[1].exception()  # retrieved: a dead actor's error is `_dead_actors`' to tell
            self._probes[name] = (now, asyncio.ensure_future(handle.info.remote()))
        return silent

    async def _drop(self, name: str, reason: str) -> None:
        """Node `name` off the books and the routing table (its replicas written off: placed again on their next
        request), and its actor off the list and killed: a fresh one is started if its Ray node stays (`_follow`)."""
        import ray

        await self._lose(name, reason)
        ray.kill(self._remove_actor(name), no_restart=True)

    async def _add(self, node_id: str, node: dict[str, Any]) -> None:
        """A node server on a node that joined: started, then given models as requests need them."""
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        index = self._ports[node_id] = self._free_index()  # taken before the start, which others wait beside
        base = self.settings.node
        host = node["NodeManagerAddress"] if self.settings.host_from_ray else base.host
        settings = self.settings.node_settings(index, host)
        actor = ray.remote(NodeServer).options(
            name=NODE_PREFIX + node_id,
            namespace=NAMESPACE,
            lifetime="detached",
            get_if_exists=True,
            max_restarts=0,
            num_cpus=node["Resources"]["CPU"],  # the node's cores are its server's: Packrat plans them
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
        )
        handle: Any = actor.remote(node_id, settings, CONTROLLER, NAMESPACE, self.settings.log_level)
        tracing = self.tracing.current
        try:
            address, pid = await handle.start.remote(tracing)
        except Exception as exc:
            wait = self.start_failures.failed(node_id, str(exc), time.monotonic())
            log.error(
                "node server did not start; trying again later",
                extra={"node": node_id, "error": str(exc), "retry_in_s": wait},
            )
            ray.kill(handle, no_restart=True)
            del self._ports[node_id]
            return
        self.start_failures.started(node_id)
        self.tracing.started(node_id, tracing)
        self._join(node_id, handle, address, pid, {}, self._budget(node))
        log.info("node joined", extra={"node": node_id, "http": address.http, "grpc": address.grpc})
        await self._broadcast()

    def _index_of(self, address: NodeAddress) -> int:
        """A running node's index, from its REST port."""
        stride = self.settings.port_stride
        return (int(address.http.rsplit(":", 1)[1]) - self.settings.node.http_port) // stride if stride else 0

    def _free_index(self) -> int:
        used = set(self._ports.values())
        return next(index for index in range(len(used) + 1) if index not in used)

    def _budget(self, node: dict[str, Any]) -> int:
        """A node's model-memory budget: the configured one, else the memory Ray counts on it."""
        if self.settings.budget_bytes is not None:
            return self.settings.budget_bytes
        return int(node.get("Resources", {}).get("memory", 0)) or 1 << 30

    def _join(
        self, name: str, handle: Any, address: NodeAddress, pid: int, resident: dict[str, int], budget_bytes: int
    ) -> None:
        self.nodes[name] = handle
        self.addresses[name] = address
        self.pids[name] = pid
        self.budgets[name] = budget_bytes
        self.placement.add_node(name, budget_bytes)
        now = time.monotonic()
        self.idle.busy(name, now)
        for model, size in resident.items():  # held already (a restarted controller, or server): on the books as is
            self.placement.place(model, size, now, exclude=[node for node in self.placement.nodes() if node != name])
            self.placement.loaded(name, model, size, now)

    def _remove_actor(self, name: str) -> Any:
        """Node `name`'s actor handle, off the controller's list (the caller stops it)."""
        self._ports.pop(name, None)
        self.tracing.forget(name)
        asked = self._probes.pop(name, None)
        if asked is not None:
            asked[1].cancel()
        return self.nodes.pop(name, None)

    def _forget(self, name: str) -> list[str]:
        """Node `name` off the books (its replicas written off, returned) and out of the routing table."""
        lost = self.placement.remove_node(name) if name in self.placement.nodes() else []
        for capacities in self._capacity.values():
            capacities.pop(name, None)
        for queued in self._queued.values():
            queued.pop(name, None)
        self.addresses.pop(name, None)
        self.pids.pop(name, None)
        self.idle.forget(name)
        return lost

    async def _lose(self, name: str, reason: str) -> None:
        lost = self._forget(name)
        self.decisions["lost"] += 1
        log.warning("node lost", extra={"node": name, "reason": reason, "models": lost})
        await self._broadcast()

    # -- called by the node actors ----------------------------------------------------------------------------
    async def node_lost(self, name: str, reason: str) -> None:
        """A node's server died (its actor starts it again): its replicas are gone."""
        await self.start()
        await self._lose(name, reason)

    async def node_ready(self, name: str, address: NodeAddress, pid: int, resident: dict[str, int]) -> None:
        """A node's server started again, holding `resident`."""
        await self.start()
        if name in self.nodes:
            self._join(name, self.nodes[name], address, pid, resident, self.budgets[name])
            await self._broadcast()

    async def unloaded(self, node: str, model: str) -> None:
        """Node `node` no longer holds `model` though no eviction said so: off the books, and off the table."""
        await self.start()
        self.placement.unloaded(node, model)
        await self._broadcast()

    async def requests(self, node: str, report: Requests) -> None:
        """A node's request counts, and the queue and capacity of the models it holds (for `_scale`)."""
        await self.start()
        self._take_report(node, report, time.monotonic())

    def _take_report(self, node: str, report: Requests, now: float) -> None:
        self.placement.requests(report.counts, now)
        if report.counts or report.capacity_rps:  # requests arrived there, or its engines computed
            self.idle.busy(node, now)
        self._arrivals.update(report.counts)
        if report.traces_wanted:
            self.tracing.wanted(node, report.traces_wanted)
        for model, rows in report.queued.items():
            self._queued.setdefault(model, {})[node] = rows
        for model, rps in report.capacity_rps.items():
            self._capacity.setdefault(model, {})[node] = rps

    async def _scale_every(self) -> None:
        """Replicate what its replicas cannot serve, remove replicas the load no longer needs (`Placement.scale`)."""
        last = time.monotonic()
        while True:
            await asyncio.sleep(SCALE_EVERY_S)
            now = time.monotonic()
            arrivals, self._arrivals = self._arrivals, Counter()
            try:
                await self._scale(arrivals, now - last, now)
            except Exception:
                log.exception("replication check failed")
            self._give_back_idle(now)
            last = now

    async def _scale(self, arrivals: Counter[str], elapsed_s: float, now: float) -> None:
        loads = {}
        for model, capacities in self._capacity.items():
            replicas = self.placement.replicas(model)
            measured = [capacities[node] for node in replicas if node in capacities]
            if not measured:
                continue
            queued = sum(self._queued.get(model, {}).get(node, 0) for node in replicas)
            loads[model] = ModelLoad(arrivals[model] / elapsed_s, sum(measured) / len(measured), queued)
        for action in self.placement.scale(loads, now):
            if action.kind is ScaleKind.ADD and action.model not in self._placing:
                self.decisions["replicated"] += 1
                log.info("replicating", extra={"model": action.model, "load": str(loads[action.model])})
                self._start_placing(action.model, self._sizes.get(action.model, 0), [])
            elif action.kind is ScaleKind.REMOVE and action.node is not None:
                self.decisions["removed"] += 1
                log.info("removing a replica", extra={"model": action.model, "node": action.node})
                self.placement.unloaded(action.node, action.model)
                self._capacity.get(action.model, {}).pop(action.node, None)
                await self._broadcast()  # no request goes there any more: then it is unloaded
                await self.nodes[action.node].unload.remote(action.model)

    async def place(self, asking: str, model: str, size_bytes: int, avoid: list[str]) -> None:
        """Node `asking` has a request for `model` that no node outside `avoid` holds: place it, once. Every node
        gets the table with the new replica; a model that cannot be placed is refused to every node."""
        await self.start()
        holders = [n for n in self.placement.replicas(model) if n not in avoid]
        if holders:
            await self._send_table(asking)  # its table is behind
            return
        if model in self._placing:
            return  # a load under way: the table that has it reaches every node
        self._start_placing(model, size_bytes, avoid)

    def _start_placing(self, model: str, size_bytes: int, avoid: list[str]) -> None:
        task = asyncio.get_running_loop().create_task(self._place(model, size_bytes, avoid))
        self._placing[model] = task
        task.add_done_callback(lambda _: self._placing.pop(model, None))

    async def _place(self, model: str, size_bytes: int, avoid: list[str]) -> None:
        deadline = time.monotonic() + PLACE_TIMEOUT_S
        while True:
            try:
                decision = self.placement.place(model, size_bytes, time.monotonic(), exclude=avoid)
                break
            except ModelTooLargeError as exc:
                return await self._refuse(model, str(exc))
            except CacheBusyError as exc:
                if time.monotonic() > deadline:
                    return await self._refuse(model, str(exc))
                await asyncio.sleep(0.5)
        node = decision.node
        await self._evict(node, decision.evict)
        try:
            loaded = await self.nodes[node].load.remote(model)
        except Exception as exc:
            self.placement.failed(node, model)
            return await self._refuse(model, f"its load on node {node} failed: {exc}")
        if loaded.error:
            self.placement.failed(node, model)
            return await self._refuse(model, loaded.error)
        victims = self.placement.loaded(node, model, loaded.size_bytes, time.monotonic())
        self._sizes[model] = loaded.size_bytes
        self.decisions["placed"] += 1
        log.info("placed", extra={"model": model, "node": node, "bytes": loaded.size_bytes, "load_s": loaded.load_s})
        await self._broadcast()
        await self._evict(node, victims)

    async def _evict(self, node: str, victims: list[str]) -> None:
        """Unload `victims` from `node`, after every node has a table that sends their requests elsewhere."""
        if not victims:
            return
        self.decisions["evicted"] += len(victims)
        log.info("evicting", extra={"node": node, "models": victims})
        await self._broadcast()
        await asyncio.gather(*(self.nodes[node].unload.remote(model) for model in victims), return_exceptions=True)

    async def _refuse(self, model: str, reason: str) -> None:
        self.decisions["failed"] += 1
        log.warning("cannot place", extra={"model": model, "reason": reason})
        await asyncio.gather(*(h.refused.remote(model, reason) for h in self.nodes.values()), return_exceptions=True)

    # -- scale-in ------------------------------------------------------------------------------------------------
    def _give_back_idle(self, now: float) -> None:
        """With scale-in on, drain the node idle longest past its idle time (`IdleNodes.idlest`), as `drain` does;
        one drain at a time, an operator's too."""
        if self.scale_in is None or self.draining or (self._scaling_in is not None and not self._scaling_in.done()):
            return
        node = self.idle.idlest(list(self.nodes), self.scale_in, now)
        if node is not None:
            log.info("giving back an idle node", extra={"node": node, "idle_s": self.scale_in.idle_s})
            self._scaling_in = asyncio.get_running_loop().create_task(self._drain_idle(node))

    async def _drain_idle(self, node: str) -> None:
        try:
            await self.drain(node)
        except Exception:
            log.exception("drain of an idle node failed", extra={"node": node})
            return
        self.decisions["scaled_in"] += 1
        await self._broadcast()  # the nodes' metrics count it

    async def set_scale_in(self, idle_s: float, min_nodes: int) -> dict[str, Any]:
        """Turn scale-in on (`idle_s` > 0) or off (0) while the cluster runs; the settings now in force."""
        await self.start()
        self.scale_in = ScaleIn(idle_s, min_nodes) if idle_s else None
        return {"scale_in_idle_s": idle_s or None, "min_nodes": min_nodes if idle_s else None}

    # -- draining ------------------------------------------------------------------------------------------------
    async def drain(self, node: str, timeout_s: float = DRAIN_TIMEOUT_S) -> dict[str, Any]:
        """Take node `node` (its name, or the start of one) out of the cluster without losing a request: nothing
        more is placed there; each model it alone holds that still has load is placed elsewhere (loaded, and in
        the table, before the node leaves it); every node gets a table without it (what still arrives there is
        forwarded); its engines finish what they accepted, for up to `timeout_s`; then its servers and actor stop,
        freeing its CPUs in Ray's books. It is not started again while its Ray node stays, unless `undrain`ed."""
        await self.start()
        name = self._to_drain(node)
        started = time.monotonic()
        self.draining[name] = False
        held = sorted(self.placement.snapshot()["nodes"][name]["residents"])
        moves = self.placement.drain(name, time.monotonic(), DRAIN_MOVES_USED_WITHIN_S)
        log.info("draining", extra={"node": name, "moving": [model for model, _ in moves]})
        for model, size in moves:
            if model not in self._placing:
                self._start_placing(model, size, [name])
        await asyncio.gather(*(self._placing[m] for m, _ in moves if m in self._placing), return_exceptions=True)
        self.draining[name] = True
        await self._broadcast()  # every node, this one too, sends the requests for its models elsewhere now
        busy = await self._drained(name, timeout_s)
        await self._retire(name)
        summary = {
            "node": name,
            "moved": [model for model, _ in moves if self.placement.replicas(model)],
            "written_off": [model for model in held if not self.placement.replicas(model)],
            "busy": busy,
            "drain_s": round(time.monotonic() - started, 3),
        }
        log.info("drained", extra=summary)
        return summary

    def _to_drain(self, node: str) -> str:
        """The serving node `node` names; a ConfigError if none, or if it is the last (a drain would stop the
        service: stop the cluster instead)."""
        serving = [name for name in self.nodes if name not in self.draining]
        name = _one_of(node, serving, "serving node")
        if len(serving) == 1:
            raise ConfigError(f"node {name} is the last serving node: no other could take its models and requests")
        return name

    async def _drained(self, name: str, timeout_s: float) -> list[str]:
        """Node `name`'s answer once its engines answered what they accepted: the models still busy when
        `timeout_s` ran out. A node that does not answer is logged, and stopped all the same."""
        try:
            busy: list[str] = await asyncio.wait_for(self.nodes[name].drain.remote(timeout_s), timeout_s + 10.0)
        except Exception as exc:
            log.warning("drain not confirmed: stopping the node", extra={"node": name, "error": repr(exc)})
            return []
        return busy

    async def _retire(self, name: str) -> None:
        """Keep a drained node out (books first, so the membership check, which runs while the stop is awaited,
        does not start it again), then stop its servers (SIGTERM: what they accepted finishes) and its actor."""
        import ray

        handle = self._remove_actor(name)
        self._forget(name)
        del self.draining[name]
        self.drained.add(name)
        self.state.save_drained(self.drained)
        if handle is not None:
            await asyncio.gather(handle.stop.remote(), return_exceptions=True)
            ray.kill(handle, no_restart=True)

    async def undrain(self, node: str) -> str:
        """Let drained node `node` (its name, or the start of one) serve again: its node server starts at the next
        membership check, within a second."""
        await self.start()
        name = _one_of(node, self.drained, "drained node")
        self.drained.discard(name)
        self.state.save_drained(self.drained)
        return name

    # -- the cluster's trace settings (`trace_settings.py`) -------------------------------------------------------
    async def change_trace(self, asking: str, change: TraceChange) -> dict[str, str]:
        """A trace setting request made on node `asking`, for the whole cluster: the nodes that did not confirm it,
        with why (`ClusterTracing.change`)."""
        await self.start()
        return await self.tracing.change(asking, change)

    async def trace_left(self, scope: str) -> int | None:
        """What is left of a trace scope's count in the whole cluster, for a read on any node
        (`ClusterTracing.left`)."""
        await self.start()
        return await self.tracing.left(scope)

    # -- the routing table ---------------------------------------------------------------------------------------
    def table(self) -> Routes:
        """The routing table: every node's address, and where each model is loaded (a node drained out of it
        left out)."""
        self._version = max(self._version + 1, time.time_ns() // 1000)  # grows across restarts too
        snapshot = self.placement.snapshot()
        serving = {name: address for name, address in self.addresses.items() if not self.draining.get(name)}
        replicas: dict[str, list[str]] = {}
        for node, state in snapshot["nodes"].items():
            for model, resident in state["residents"].items():
                if resident["state"] == "LOADED" and node in serving:
                    replicas.setdefault(model, []).append(node)
        return Routes(self._version, serving, replicas, dict(self.decisions))

    async def _broadcast(self) -> None:
        """The routing table to every node, waiting at most `unresponsive_s` for any one: a stuck node actor (dropped
        by the membership loop) must not hold up the others' tables, and a later table replaces a lost one."""
        table, limit = self.table(), self.settings.node.unresponsive_s
        calls = (asyncio.wait_for(h.routes.remote(table), limit) for h in self.nodes.values())
        await asyncio.gather(*calls, return_exceptions=True)

    async def _send_table(self, node: str) -> None:
        if node in self.nodes:
            await self.nodes[node].routes.remote(self.table())

    # -- what it knows -----------------------------------------------------------------------------------------
    async def snapshot(self) -> dict[str, Any]:
        """The deployment's id, the nodes (address, process id, budget, residents) and the decisions so far: for
        `models list --cluster`, the node servers' metrics, the launcher, and tests."""
        await self.start()
        books = self.placement.snapshot()
        return {
            "deployment": self.deployment,
            "nodes": {
                name: {"http": address.http, "grpc": address.grpc, "pid": self.pids.get(name), **books["nodes"][name]}
                for name, address in self.addresses.items()
                if name in books["nodes"]
            },
            "decisions": dict(self.decisions),
            "start_failures": self.start_failures.describe(time.monotonic()),
            "draining": sorted(self.draining),
            "drained": sorted(self.drained),
        }

    async def stop(self) -> None:
        """Stop every node server (the cluster is going down)."""
        import ray

        for task in (self._membership, self._scaling, self._scaling_in):
            if task is not None:
                task.cancel()
        self.tracing.stop()
        stop_s = self.settings.node.unresponsive_s + STOP_TIMEOUT_S  # a stuck actor is killed all the same
        calls = (asyncio.wait_for(h.stop.remote(), stop_s) for h in self.nodes.values())
        await asyncio.gather(*calls, return_exceptions=True)
        for handle in self.nodes.values():
            ray.kill(handle, no_restart=True)
        self.nodes.clear()


def named_actors(prefix: str = "") -> list[str]:
    """The names of adaserve's named actors in Ray that start with `prefix` (an actor that died is not listed)."""
    import ray

    return [
        entry["name"]
        for entry in ray.util.list_named_actors(all_namespaces=True)
        if entry["namespace"] == NAMESPACE and entry["name"].startswith(prefix)
    ]


def _node_actors() -> list[str]:
    """The nodes whose node actor Ray lists."""
    return [name.removeprefix(NODE_PREFIX) for name in named_actors(NODE_PREFIX)]


def _one_of(name: str, among: Collection[str], what: str) -> str:
    """The one of `among` called `name`, or the only one whose name starts with it; a ConfigError names them else."""
    if name in among:
        return name
    matches = [candidate for candidate in among if candidate.startswith(name)]
    if len(matches) != 1:
        known = ", ".join(sorted(among)) or "none"
        raise ConfigError(f"{len(matches) or 'no'} {what}s match {name!r}; the {what}s: {known}")
    return matches[0]
