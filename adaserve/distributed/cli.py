"""`adaserve cluster up`: a local Ray cluster of N nodes on this machine, a node server on each (for trying the
cluster and for tests); `cluster drain` and `undrain`, which ask a running cluster's controller to take a node out
and let it back, and `cluster scale-in`, which turns the giving back of idle nodes on or off; and the settings
`adaserve serve --ray ADDRESS` shares with `up`."""

from __future__ import annotations

import argparse
import json
import logging
import os
from pathlib import Path
from typing import Any

from adaserve.distributed.controller import DRAIN_MOVES_USED_WITHIN_S, DRAIN_TIMEOUT_S, ClusterSettings
from adaserve.distributed.node import NODE_PLACEHOLDER, NodeSettings
from adaserve.distributed.scale_in import ScaleIn
from adaserve.errors import ConfigError
from adaserve.extras import needs_extra

#: On one machine, node i listens on the first node's ports plus i times this.
LOCAL_PORT_STRIDE = 2
PLACEMENTS = ("iam", "lru", "random")


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from adaserve.arguments import (
        CLUSTER_TRACE_FILE,
        DEFAULT_HOST,
        add_grpc_frontend,
        add_model_repository,
        add_trace_config,
        positive_integer,
    )
    from adaserve.cache.policies import POLICIES
    from adaserve.cli import memory_budget

    cluster = commands.add_parser("cluster", help="run adaserve on a Ray cluster of several nodes")
    cluster_commands = cluster.add_subparsers(dest="cluster_command", required=True)
    up = cluster_commands.add_parser(
        "up",
        help="start a local Ray cluster of N nodes on this machine with a node server on each (node i on the first "
        f"node's ports plus {LOCAL_PORT_STRIDE}i); serves until SIGTERM or Ctrl-C. Ray listens on every interface "
        "whatever it is told: run it in a loopback-only network namespace or behind a firewall",
    )
    add_model_repository(up)
    up.add_argument("--nodes", type=positive_integer, default=3, help="Ray nodes (default: %(default)s)")
    up.add_argument("--host", default=DEFAULT_HOST, help="address the node servers listen on (default: loopback)")
    up.add_argument("--http-port", type=int, default=8000, help="the first node's REST port (default: %(default)s)")
    up.add_argument("--grpc-port", type=int, default=8001, help="the first node's gRPC port (default: %(default)s)")
    add_grpc_frontend(up, "each node server's")
    add_trace_config(up, CLUSTER_TRACE_FILE)
    add_cluster_arguments(up, memory_budget)
    up.add_argument(
        "--cache-policy",
        default="iam",
        choices=[name for name, policy in POLICIES.items() if not policy.needs_future],
        help="the eviction policy on each node (default: iam, mCache's importance-aware policy)",
    )
    up.add_argument(
        "--log-level",
        default="info",
        choices=["debug", "info", "warning", "error"],
        help="the least level the node servers, their actors and the controller log (default: %(default)s)",
    )
    up.set_defaults(func=_up)

    drain = cluster_commands.add_parser(
        "drain",
        help="take a node out of a running cluster without losing a request: nothing more is placed there, the "
        f"models it alone holds that had requests in the last {DRAIN_MOVES_USED_WITHIN_S:g} s are loaded elsewhere, "
        "every node stops sending it requests (it forwards what still reaches it), its engines finish what they "
        "accepted, then its server and Ray actor stop and its CPUs are free in Ray's books. It stays out while its "
        "Ray node stays (cluster undrain brings it back). Prints what moved as JSON",
    )
    _add_node_arguments(drain)
    drain.add_argument(
        "--timeout-s",
        type=float,
        default=DRAIN_TIMEOUT_S,
        help="the longest its engines may take to answer what they accepted before it stops (default: %(default)g)",
    )
    drain.set_defaults(func=_drain)
    undrain = cluster_commands.add_parser(
        "undrain", help="let a drained node serve again: its node server starts within a second"
    )
    _add_node_arguments(undrain)
    undrain.set_defaults(func=_undrain)
    scale_in = cluster_commands.add_parser(
        "scale-in",
        help="turn automatic scale-in on or off while the cluster runs: a node that served no request for IDLE_S "
        "seconds is drained as cluster drain drains it, while more than --min-nodes serve. Prints the settings",
    )
    scale_in.add_argument("idle_s", metavar="IDLE_S", type=float, help="seconds a node may idle; 0 turns it off")
    _add_min_nodes(scale_in)
    _add_ray_address(scale_in)
    scale_in.set_defaults(func=_scale_in)


def _add_node_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "node", metavar="NODE", help="the node as cluster up and models list --cluster name it, or its first characters"
    )
    _add_ray_address(parser)


def _add_ray_address(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--ray",
        metavar="ADDRESS",
        default="auto",
        help="the Ray cluster (host:port of its head, as cluster up prints it; default: %(default)s, the one this "
        "machine is part of)",
    )


def add_cluster_arguments(parser: argparse.ArgumentParser, budget: object) -> None:
    """The placement flags `cluster up` and `serve --ray` share."""
    parser.add_argument(
        "--node-memory-budget",
        type=budget,  # type: ignore[arg-type]
        help="bytes (2GiB, 500MB) or a percentage of memory each node's models may hold together; the controller "
        "evicts by --cache-policy to stay under it (default: the memory Ray counts on each node; with cluster up, "
        "half this machine's memory shared equally)",
    )
    parser.add_argument(
        "--servers-per-node",
        type=int,
        default=1,
        metavar="N",
        help="node servers on each node, sharing its ports (SO_REUSEPORT), each on a group of its cores: where one "
        "frontend cannot keep a large machine's cores busy with small models (default: %(default)s)",
    )
    parser.add_argument(
        "--placement",
        default="iam",
        choices=PLACEMENTS,
        help="which node gets a new replica: iam (where making room costs the least importance), lru (ModelMesh's: "
        "the node whose least recently used model is oldest) or random (default: %(default)s)",
    )
    from adaserve.arguments import positive_number

    parser.add_argument(
        "--scale-in-idle-s",
        type=positive_number,
        metavar="SECONDS",
        help="give back a node that served no request for this long (drained as cluster drain drains it, so Ray's "
        "autoscaler can remove it), while more than --min-nodes serve (default: off)",
    )
    _add_min_nodes(parser)
    parser.add_argument(
        "--node-unresponsive-s",
        type=positive_number,
        default=NodeSettings.unresponsive_s,
        metavar="SECONDS",
        help="kill and start again a node server, or a node actor, whose process lives but has answered nothing "
        "for this long (stopped, or stuck): its models are placed elsewhere and the requests sent to it retried "
        "there (default: %(default)s)",
    )


def _add_min_nodes(parser: argparse.ArgumentParser) -> None:
    from adaserve.arguments import positive_integer

    parser.add_argument(
        "--min-nodes",
        type=positive_integer,
        default=1,
        metavar="N",
        help="scale-in leaves at least this many nodes serving (default: %(default)s)",
    )


def cluster_settings(
    args: argparse.Namespace, *, port_stride: int, host_from_ray: bool, nodes_here: int | None = None
) -> ClusterSettings:
    """The cluster's settings from the command line; `nodes_here`: that many nodes share this machine."""
    from adaserve.cli import _budget_bytes

    repository: Path = args.model_repository
    budget = None
    if args.node_memory_budget is not None:
        budget = _budget_bytes(args.node_memory_budget, repository)
    elif nodes_here is not None:  # the nodes share this machine: half its memory, in equal parts
        budget = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // (2 * nodes_here)
    log_level = getattr(args, "log_level", None) or "info"
    serve_args: tuple[str, ...] = ("--log-level", log_level)
    serve_args += ("--grpc-frontend", args.grpc_frontend)  # `up` and `serve --ray`: each node server decides by it
    if args.servers_per_node < 1:
        raise ConfigError(f"--servers-per-node must be at least 1, got {args.servers_per_node}")
    sharing = (nodes_here or 1) * args.servers_per_node  # node servers on one machine
    for option in args.trace_config:  # every node server traces alike
        if option.startswith("triton,file=") and sharing > 1 and NODE_PLACEHOLDER not in option:
            raise ConfigError(
                f"--trace-config {option}: {sharing} node servers share this machine and would write one file; "
                f"put {NODE_PLACEHOLDER} in its path (each server replaces it by its name)"
            )
        serve_args += (f"--trace-config={option}",)
    node = NodeSettings(
        str(repository.resolve()),
        args.host,
        args.http_port,
        args.grpc_port,
        serve_args,
        args.servers_per_node,
        args.node_unresponsive_s,
    )
    return ClusterSettings(
        node,
        budget,
        port_stride=port_stride,
        eviction=getattr(args, "cache_policy", "iam"),
        placement=args.placement,
        host_from_ray=host_from_ray,
        log_level=log_level,
        scale_in=ScaleIn(args.scale_in_idle_s, args.min_nodes) if args.scale_in_idle_s is not None else None,
    )


def _up(args: argparse.Namespace) -> int:
    from adaserve.distributed.launch import run

    settings = cluster_settings(args, port_stride=LOCAL_PORT_STRIDE, host_from_ray=False, nodes_here=args.nodes)
    return run(settings, nodes=args.nodes)


def _drain(args: argparse.Namespace) -> int:
    print(json.dumps(_ask_controller(args.ray, "drain", args.node, args.timeout_s)))
    return 0


def _undrain(args: argparse.Namespace) -> int:
    print(json.dumps({"undrained": _ask_controller(args.ray, "undrain", args.node)}))
    return 0


def _scale_in(args: argparse.Namespace) -> int:
    if args.idle_s:
        ScaleIn(args.idle_s, args.min_nodes)  # refused here, by name, before Ray is asked
    print(json.dumps(_ask_controller(args.ray, "set_scale_in", args.idle_s, args.min_nodes)))
    return 0


def _ask_controller(address: str, method: str, *args: object) -> Any:
    """Call the placement controller of the adaserve cluster on the Ray cluster at `address`, as a Ray driver; an
    error it raises (a node it does not know) comes back as its own."""
    with needs_extra("cluster", f"cluster {method}"):
        import ray

    from adaserve.distributed.controller import CONTROLLER, NAMESPACE

    ray.init(address=address, namespace=NAMESPACE, logging_level=logging.WARNING)
    try:
        try:
            controller = ray.get_actor(CONTROLLER)
        except ValueError:
            raise ConfigError(f"no adaserve cluster runs on the Ray cluster at {address}") from None
        try:
            return ray.get(getattr(controller, method).remote(*args))
        except ray.exceptions.RayTaskError as exc:
            raise exc.cause from None
    finally:
        ray.shutdown()
