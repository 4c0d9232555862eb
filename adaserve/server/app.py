"""Run the server: REST (`server/http.py`) and gRPC (grpc.aio) frontends over one router, both on one event loop,
or gRPC's in a process of its own that relays its calls here (`--grpc-frontend`, `server/grpc_frontend.py`).

The frontends come up first so liveness answers while models load; readiness follows the loading. SIGTERM and
SIGINT stop the frontends, let accepted requests finish, then stop the workers.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import resource
import signal
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import grpc
from grpc_health.v1 import health_pb2_grpc

from adaserve.collector import freeze_startup_heap
from adaserve.config import Interface
from adaserve.engine.poller import RepositoryPoller
from adaserve.engine.router import CacheSettings, ModelRouter
from adaserve.errors import AdaserveError, ConfigError
from adaserve.malloc import keep_freed_memory
from adaserve.repository import ModelRepository
from adaserve.server.dataplane import DataPlane, ModelControlMode
from adaserve.server.grpc_frontend import GrpcFrontendMode, grpc_frontend_mode, grpc_server_options
from adaserve.server.grpc_process import GrpcFrontendProcess
from adaserve.server.grpc_relay import grpc_route
from adaserve.server.grpc_service import FORWARDED, InferenceServicer, add_to_server
from adaserve.server.health import HealthService
from adaserve.server.http import LISTEN_BACKLOG, HttpServer
from adaserve.server.limits import ClientLimits
from adaserve.server.metrics import watch_pauses
from adaserve.server.protocol import grpc_bytes_limit
from adaserve.server.response_cache import ResponseCache, cache_size_from_config
from adaserve.server.rest import create_app, error_response
from adaserve.server.restrictions import frontend_restrictions
from adaserve.server.tls import TlsSettings
from adaserve.server.trace import tracer_from_config

log = logging.getLogger("adaserve.server")


@dataclass(frozen=True)
class ServeOptions:
    model_repository: Path
    host: str = "127.0.0.1"
    http_port: int = 8000
    grpc_port: int = 8001
    limits: ClientLimits = field(default_factory=ClientLimits)  # what clients may hold, and for how long
    models: list[str] | None = None  # None: every model in the repository (none under a memory budget)
    cache: CacheSettings | None = None  # mCache: a memory budget and an eviction policy
    spare_hosts: int = 0  # model host processes started ahead of loads (see HostLauncher)
    repository_poll_s: float | None = None  # follow the repository on disk every so often (engine/poller.py)
    model_control_mode: ModelControlMode = "explicit"  # Triton's: may the repository API load and unload models
    allow_client_shm: bool = False  # Triton's: may clients register system shared memory for their tensors
    trace_config: tuple[str, ...] = ()  # Triton's --trace-config settings (server/trace.py)
    cache_config: tuple[str, ...] = ()  # Triton's --cache-config: the response cache (server/response_cache.py)
    restricted_api: tuple[str, ...] = ()  # API categories that need a header, on both frontends (restrictions.py)
    http_restricted_api: tuple[str, ...] = ()  # Triton's: the same on one frontend
    grpc_restricted_protocol: tuple[str, ...] = ()
    http_tls: TlsSettings | None = None  # TLS on a frontend (server/tls.py); None: plain
    grpc_tls: TlsSettings | None = None
    grpc_compression_level: str = "none"  # Triton's --grpc-infer-response-compression-level
    cluster_control: int | None = None  # on a cluster: the node actor's control channel (adaserve.distributed)
    cluster_node: str = ""  # ... and the node's name there
    reuse_port: bool = False  # SO_REUSEPORT on both frontends: several servers share the ports (cpu/groups.py)
    grpc_frontend: GrpcFrontendMode = "auto"  # gRPC on the engine's event loop, or in a process of its own


class GrpcFrontend(Protocol):
    """The gRPC frontend, inline (a grpc.aio server) or in its own process (`GrpcFrontendProcess`)."""

    def start(self) -> Awaitable[None]: ...

    def stop(self, grace: float) -> Awaitable[None]: ...


def _listen(host: str, port: int, reuse_port: bool = False) -> socket.socket:
    """The HTTP frontend's listening socket. With `reuse_port`, other servers may listen on the same port if they
    set it too (SO_REUSEPORT, same user): the kernel then spreads new connections over them all."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP explicitly: asyncio turns Nagle off (TCP_NODELAY) only on accepted sockets whose protocol says
    # TCP, and with Nagle on, a response written as headers then body waits ~40 ms for the client's delayed ACK.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuse_port:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        shared = " (servers share a port only when all have --reuse-port and one user runs them)" if reuse_port else ""
        raise ConfigError(f"cannot listen for HTTP on {host}:{port}: {exc.strerror}{shared}") from None
    sock.listen(LISTEN_BACKLOG)
    return sock


def raise_open_file_limit() -> int:
    """Raise this process's open-file limit to the most it may have (the hard limit), as nginx and Go's runtime do:
    the usual soft limit of 1,024 covers fewer than a thousand client connections beside the workers' pipes, and
    past it the server can neither accept nor start a worker. The model hosts inherit it. Returns the limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == hard or hard == resource.RLIM_INFINITY:  # Linux never allows an infinite one: leave it be
        return soft
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return hard


#: gRPC's own limit on a message received, which a repository of small models keeps.
GRPC_DEFAULT_MESSAGE_BYTES = 4 * 1024 * 1024


def grpc_message_bytes(repository: ModelRepository, most: int) -> int:
    """The largest gRPC message worth receiving: the largest request the repository's models and DAG queries can
    take at start (`grpc_bytes_limit`), at least gRPC's own 4 MiB, at most `most`. gRPC's core refuses a larger
    message from its length, before receiving it: 60 MB messages for a 16-row model cost the other clients 60 ms
    of p99 and the server 330 MB while each was received and refused. A model added later that takes more needs
    `--max-request-bytes`."""
    largest = GRPC_DEFAULT_MESSAGE_BYTES
    readers: list[tuple[list[str], Callable[[str], Interface]]] = [
        (repository.names(), lambda name: repository.read(name).config),
        (repository.dag_names(), repository.read_dag),
    ]
    for names, read in readers:
        for name in names:
            try:
                largest = max(largest, grpc_bytes_limit(read(name)))
            except AdaserveError:
                continue  # it cannot load either: its load says why
    return min(largest, most)


def _within_open_files(limits: ClientLimits, open_files: int) -> ClientLimits:
    """`limits` with each frontend's connections held to a quarter of the open-file limit, so that the two
    frontends' clients leave half of it to the workers, model hosts and input pools (past it the server can
    neither accept nor restart a worker)."""
    most = max(16, open_files // 4)
    if limits.max_connections <= most:
        return limits
    log.warning(
        "fewer connections than asked: the open-file limit is low",
        extra={"asked": limits.max_connections, "allowed": most, "open_files": open_files},
    )
    return dataclasses.replace(limits, max_connections=most)


async def serve(options: ServeOptions) -> None:
    # Bad settings fail here, before anything starts.
    http_restrictions, grpc_restrictions = frontend_restrictions(
        options.restricted_api, options.http_restricted_api, options.grpc_restricted_protocol
    )
    tracer = tracer_from_config(options.trace_config)
    cache_bytes = cache_size_from_config(options.cache_config)
    open_files = raise_open_file_limit()
    limits = _within_open_files(options.limits, open_files)
    kept = keep_freed_memory()
    router = ModelRouter(ModelRepository(options.model_repository), options.cache, spare_hosts=options.spare_hosts)
    response_cache = ResponseCache(cache_bytes) if cache_bytes is not None else None
    plane = DataPlane(router, options.model_control_mode, options.allow_client_shm, tracer, response_cache)
    grpc_bytes = limits.grpc_message_bytes or grpc_message_bytes(router.repository, limits.max_body_bytes)
    member = None
    if options.cluster_control is not None:
        from adaserve.distributed.forward import Forwarder
        from adaserve.distributed.member import ClusterMember

        member = ClusterMember(options.cluster_node, plane, Forwarder(http_restrictions))
    relay, statistics = (member.grpc_relay, member.statistics) if member is not None else (None, None)
    servicer = InferenceServicer(plane, grpc_restrictions, relay, statistics)
    health = HealthService(plane, grpc_restrictions)
    calls = servicer.relayed_calls()
    # on a cluster, other nodes relay the calls for the models held here to the REST port
    internal = [grpc_route({rpc: calls[rpc] for rpc in FORWARDED})] if member is not None else []
    http_socket = _listen(options.host, options.http_port, options.reuse_port)
    app, body_limit = create_app(
        plane, limits.max_body_bytes, http_restrictions, member.rest_route if member is not None else None, internal
    )
    shortcut = member.shortcut if member is not None else None
    http = HttpServer(app, on_error=error_response, limits=limits, body_limit=body_limit, shortcut=shortcut)
    grpc_options = grpc_server_options(grpc_bytes, limits, options.reuse_port, options.grpc_compression_level)
    grpc_address = f"{options.host}:{options.grpc_port}"
    grpc_mode = grpc_frontend_mode(options.grpc_frontend)
    grpc_frontend: GrpcFrontend
    if grpc_mode == "process":
        grpc_frontend = GrpcFrontendProcess(
            grpc_address, grpc_options, options.grpc_tls, {**calls, **health.relayed_calls()}, limits
        )
    else:
        try:
            grpc_frontend = _inline_grpc(grpc_address, grpc_options, options.grpc_tls, servicer, health)
        except ConfigError:
            http_socket.close()
            raise

    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stopping.set)

    try:
        await grpc_frontend.start()  # in a process of its own, it listens once started
    except ConfigError:
        http_socket.close()
        raise
    await http.start(http_socket, options.http_tls.ssl_context() if options.http_tls is not None else None)
    if member is not None and options.cluster_control is not None:
        await member.start(options.cluster_control, on_end=stopping.set)  # the node actor gone: this server stops
    log.info(
        "listening",
        extra={
            "http": f"{options.host}:{options.http_port}",
            "grpc": grpc_address,
            "grpc_frontend": grpc_mode,
            "tls": [name for name, tls in (("http", options.http_tls), ("grpc", options.grpc_tls)) if tls is not None],
            "open_files": open_files,
            "grpc_message_bytes": grpc_bytes,
            "malloc_keeps_freed_memory": kept,
        },
    )
    dags = set(router.repository.dag_names())
    if member is None:  # on a cluster the controller places the models
        await router.load_all(None if options.models is None else [n for n in options.models if n not in dags])
    await plane.dags.load_all(options.models)  # after the models: loading a DAG query times its models
    plane.started = True
    frozen = freeze_startup_heap()
    watch_pauses()
    log.info(
        "serving", extra={"models": [e.name for e in router.index() if e.state == "READY"], "frozen_objects": frozen}
    )
    polling = None
    if options.repository_poll_s is not None:
        polling = loop.create_task(RepositoryPoller(router, plane.dags, options.models).run(options.repository_poll_s))

    await stopping.wait()
    log.info("stopping")
    plane.stopping = True  # not ready from now on: health checks tell load balancers to send no more
    if polling is not None:
        polling.cancel()  # no load may start now; one under way is the router's, which close() ends
    await asyncio.gather(http.stop(grace_s=5.0), grpc_frontend.stop(5.0))
    if member is not None:
        await member.close()
    await router.close()
    plane.shared_memory.close()
    tracer.close()
    log.info("stopped")


def _inline_grpc(
    address: str,
    grpc_options: list[tuple[str, int]],
    tls: TlsSettings | None,
    servicer: InferenceServicer,
    health: HealthService,
) -> grpc.aio.Server:
    """The gRPC frontend on this event loop; ConfigError when it cannot listen."""
    server = grpc.aio.server(options=grpc_options)
    add_to_server(servicer, server)
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    try:  # grpcio raises when the port is taken, with no reason: only its C core logs one
        if tls is None:
            server.add_insecure_port(address)
        else:
            server.add_secure_port(address, tls.grpc_credentials())
    except RuntimeError:
        raise ConfigError(f"cannot listen for gRPC on {address}") from None
    return server
