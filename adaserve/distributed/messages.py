"""Typed messages between a node server and the node actor that supervises it, on the socket pair it inherits
(`adaserve serve --cluster-control FD`): the routing table and load orders down, placement requests and load
reports up. Framed as the engine's messages are (`adaserve.engine.messages.frame`)."""

from __future__ import annotations

import msgspec


class NodeAddress(msgspec.Struct, frozen=True):
    """Where a node server answers: its REST and gRPC endpoints, host:port."""

    http: str
    grpc: str


class Routes(msgspec.Struct, frozen=True, tag="routes"):
    """The routing table: which nodes hold each model (its replicas), and where each node answers. `version` grows
    with every change, so a node never takes an older table for a newer one."""

    version: int
    nodes: dict[str, NodeAddress]
    replicas: dict[str, list[str]]


class Load(msgspec.Struct, frozen=True, tag="load"):
    """Load `model` on this node (the controller placed a replica here)."""

    model: str


class Unload(msgspec.Struct, frozen=True, tag="unload"):
    model: str


class Place(msgspec.Struct, frozen=True, tag="place"):
    """A request arrived for `model`, which no node holds: the controller is to place it."""

    model: str


class Loaded(msgspec.Struct, frozen=True, tag="loaded"):
    """The outcome of a `Load`: `error` is empty when the model is ready here."""

    model: str
    error: str = ""
    bytes: int = 0


ToNode = Routes | Load | Unload
FromNode = Place | Loaded
