"""Typed messages between a node server and the node actor that supervises it, on the socket pair the server
inherits (`adaserve serve --cluster-control FD`): the routing table, load and drain orders and the cluster's trace
settings down, placement requests, load reports, request counts and trace setting changes up. Each is msgpack
behind a 4-byte length (`control.py`)."""

from __future__ import annotations

import msgspec

from adaserve.server.trace_state import TraceSettings, TraceState


class NodeAddress(msgspec.Struct, frozen=True):
    """Where a node server answers: its REST and gRPC endpoints, host:port."""

    http: str
    grpc: str


class Routes(msgspec.Struct, frozen=True, tag="routes"):
    """The routing table: which nodes hold each model (its replicas, loaded and ready), and where each node answers.
    `version` grows with every change, so a node never takes an older table for a newer one."""

    version: int
    nodes: dict[str, NodeAddress]
    replicas: dict[str, list[str]]
    decisions: dict[str, int] = {}  # the controller's placement decisions so far, by kind (for every node's metrics)


class Load(msgspec.Struct, frozen=True, tag="load"):
    """Load `model` on this node: the controller placed a replica here."""

    model: str


class Unload(msgspec.Struct, frozen=True, tag="unload"):
    """Unload `model` from this node: the controller evicted it here (the table already sends its requests
    elsewhere)."""

    model: str


class Report(msgspec.Struct, frozen=True, tag="report"):
    """Say what is resident here (`Resident`): a restarted controller rebuilds its state from the nodes."""


class Refused(msgspec.Struct, frozen=True, tag="refused"):
    """The controller cannot place `model` (too large for any node's budget, or its load failed): requests waiting
    for it are answered 503 with `reason`."""

    model: str
    reason: str


class Drain(msgspec.Struct, frozen=True, tag="drain"):
    """This node is being drained: the table it has sends it no more requests (what still arrives here is
    forwarded). Answer `Drained` once every request its engines accepted is answered, or after `timeout_s`."""

    timeout_s: float


class Place(msgspec.Struct, frozen=True, tag="place"):
    """A request arrived for `model`, which no node in the table holds, or none outside `avoid` (nodes a forwarded
    request just failed on): the controller is to place it. `size_bytes`: its size as far as this node can tell
    before a load (its artifact's bytes)."""

    model: str
    size_bytes: int
    avoid: list[str] = []


class Loaded(msgspec.Struct, frozen=True, tag="loaded"):
    """The outcome of a `Load`: `error` is empty when the model is ready here, and `size_bytes` is then what it
    holds (its engines' memory, as the single-node cache counts it); `load_s` is how long the load took."""

    model: str
    error: str = ""
    size_bytes: int = 0
    load_s: float = 0.0


class Unloaded(msgspec.Struct, frozen=True, tag="unloaded"):
    model: str


class Resident(msgspec.Struct, frozen=True, tag="resident"):
    """The models this node holds, ready, with their bytes."""

    models: dict[str, int]


class Requests(msgspec.Struct, frozen=True, tag="requests"):
    """Requests that arrived at this node from clients since the last count, per model (forwarded ones are counted
    where they arrived, once): what the controller's eviction policy learns request rates from. With them, for each
    model this node holds: the rows queued now, and the requests a second it can serve (`load.py`), from which the
    controller replicates."""

    counts: dict[str, int]
    queued: dict[str, int] = {}
    capacity_rps: dict[str, float] = {}
    traces_wanted: dict[str, int] = {}  # trace scope → the change that gave its count, used up here (`TraceGive`)


class Drained(msgspec.Struct, frozen=True, tag="drained"):
    """The answer to `Drain`: the models whose engines still had requests unanswered when its time ran out."""

    busy: list[str] = []


class Tracing(msgspec.Struct, frozen=True, tag="tracing"):
    """The cluster's trace settings, to be adopted (`Tracer.adopt`); answered by `Traced` with the same `version`.
    `version` grows with every change, so a node never takes older settings for newer ones. `shares`: per trace
    scope (the server's, "", or a model's), this server's share of the scope's `trace_count` where the settings
    start it afresh (none given: 0), so that the cluster takes the count once in all, not once per node."""

    version: int
    state: TraceState
    shares: dict[str, int] = {}


class Traced(msgspec.Struct, frozen=True, tag="traced"):
    """The answer to `Tracing`: the node server traces under settings `version` now (`error`: it cannot)."""

    version: int
    error: str = ""


class TraceChange(msgspec.Struct, frozen=True, tag="trace-change"):
    """A trace setting request that arrived at this node (`TraceState.changed`'s arguments), for the controller to
    apply to the cluster's settings and send to every node; `ask` names it in the answer (`TraceChanged`). `current`
    is this node's state: the cluster's, if the controller has none yet (none has been changed)."""

    ask: int
    model: str
    changes: dict[str, list[str] | None]
    initial: TraceSettings
    current: TraceState


class TraceChanged(msgspec.Struct, frozen=True, tag="trace-changed"):
    """The answer to `TraceChange` `ask`: `missing`, the nodes that did not confirm the new settings, with why;
    `error`, why the change was refused or not made."""

    ask: int
    missing: dict[str, str] = {}
    error: str = ""


class TraceShare(msgspec.Struct, frozen=True, tag="trace-share"):
    """Say what is left of this server's share of trace scope `scope`'s count, given by change `serial`
    (`Tracer.left`); `take`: give it all back (the controller hands it to the nodes that want traces). Answered by
    `TraceShareLeft` `ask`."""

    ask: int
    scope: str
    serial: int
    take: bool = False


class TraceShareLeft(msgspec.Struct, frozen=True, tag="trace-share-left"):
    """The answer to `TraceShare` `ask`: the traces that were left (-1: no limit)."""

    ask: int
    left: int


class TraceGive(msgspec.Struct, frozen=True, tag="trace-give"):
    """Add `count` traces to this server's share of scope `scope`'s count, if it still counts under change
    `serial`."""

    scope: str
    serial: int
    count: int


class TraceCountRead(msgspec.Struct, frozen=True, tag="trace-count-read"):
    """A trace setting read here: what is left of scope `scope`'s count in the whole cluster? Answered by
    `TraceCountLeft` `ask`."""

    ask: int
    scope: str


class TraceCountLeft(msgspec.Struct, frozen=True, tag="trace-count-left"):
    """The answer to `TraceCountRead` `ask`: the traces left in the cluster; None where the node's own count
    stands (no change was made for the cluster); `error`, why it cannot be told."""

    ask: int
    left: int | None = None
    error: str = ""


ToNode = (
    Routes | Load | Unload | Report | Refused | Drain | Tracing | TraceChanged | TraceShare | TraceGive | TraceCountLeft
)
FromNode = (
    Place | Loaded | Unloaded | Resident | Requests | Drained | Traced | TraceChange | TraceShareLeft | TraceCountRead
)
