"""Starting adaserve on a Ray cluster: `adaserve cluster up --nodes N` (a local cluster of N Ray nodes on this
machine, for trying it and for tests) and `adaserve serve --ray ADDRESS` (an existing cluster, one node server on
each of its machines). Either way this process is Ray's driver: it starts the placement controller, prints each
node server's address as it comes up, calls the controller every PING_EVERY_S, and on SIGTERM or SIGINT stops the
node servers and leaves.

Each start is a deployment with an id of its own, which the controller keeps its state under (`state.py`). One
deployment runs on a Ray cluster at a time (its controller is one named actor). A start that finds one running
refuses to start, naming it, while its driver calls (`takes_over`); one whose driver has not called for
ORPHANED_AFTER_S (it died) is taken over: its node servers and actors are stopped, and a fresh deployment starts
from this command line."""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import threading
import time
import uuid
from typing import Any

from adaserve.distributed.controller import CONTROLLER, NAMESPACE, ClusterSettings, Controller, named_actors
from adaserve.errors import ConfigError
from adaserve.extras import needs_extra

#: Each local Ray node's object store: adaserve passes no data through it, so the least Ray accepts.
OBJECT_STORE_BYTES = 80 * 1024 * 1024
#: How often the driver calls the controller (which brings a restarted one back at once).
PING_EVERY_S = 2.0
#: A deployment whose driver has not called its controller for this long was left by it: a new start takes it over.
ORPHANED_AFTER_S = 15 * PING_EVERY_S
#: How long a start that takes a deployment over waits for its node servers, then its actors, to stop.
TAKE_OVER_TIMEOUT_S = 60.0
#: How long `cluster up` waits for every node server to answer.
UP_TIMEOUT_S = 300.0

log = logging.getLogger("adaserve.cluster")


def run(settings: ClusterSettings, *, nodes: int | None = None, address: str | None = None) -> int:
    """Serve on the cluster until SIGTERM or SIGINT: a local one of `nodes` Ray nodes, or the one at `address`."""
    with needs_extra("cluster", "running on a Ray cluster"):
        import ray

    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})  # taken by sigwait below
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")  # the node servers' log lines are distinct events, not repeats
    cluster = None
    if nodes is not None:
        from ray.cluster_utils import Cluster

        cpus = max(1, len(os.sched_getaffinity(0)) // nodes)
        node_args: dict[str, Any] = {"num_cpus": cpus, "object_store_memory": OBJECT_STORE_BYTES}
        cluster = Cluster(initialize_head=True, head_node_args={**node_args, "include_dashboard": False})
        for _ in range(nodes - 1):
            cluster.add_node(**node_args)
        cluster.wait_for_nodes()
        address = cluster.address
    try:
        ray.init(address=address, namespace=NAMESPACE, logging_level=logging.WARNING)
        deployment = uuid.uuid4().hex
        return _serve(_controller(settings, deployment), deployment, nodes)
    finally:
        ray.shutdown()
        if cluster is not None:
            cluster.shutdown()


def takes_over(deployment: str, running: str, silent_s: float) -> bool:
    """Whether the start of deployment `deployment` takes over deployment `running`, whose controller it found (its
    own: no), its driver silent for `silent_s`: yes once that is ORPHANED_AFTER_S (its driver died); before, a
    ConfigError names it and says what to do."""
    if running == deployment:
        return False
    if silent_s < ORPHANED_AFTER_S:
        raise ConfigError(
            f"adaserve deployment {running} runs on this Ray cluster, and its driver (the serve --ray or cluster up "
            f"that started it) called it {silent_s:.0f} s ago: stop that process first (SIGTERM or Ctrl-C stops the "
            f"deployment), then start this one; a deployment whose driver has not called for {ORPHANED_AFTER_S:g} s "
            "is taken over"
        )
    return True


def _controller(settings: ClusterSettings, deployment: str) -> Any:
    """The controller of deployment `deployment`, made (not started yet) once no other deployment runs: one whose
    driver died is stopped first; a live one is refused (`takes_over`)."""
    import ray

    while True:
        controller: Any = (
            ray.remote(Controller)
            .options(
                name=CONTROLLER,
                namespace=NAMESPACE,
                lifetime="detached",
                get_if_exists=True,  # two starts at once: one makes it, the other finds it and is refused
                max_restarts=-1,
                max_task_retries=-1,
                num_cpus=0,
            )
            .remote(settings, deployment)  # Ray restarts it with these arguments: the same deployment
        )
        running = ray.get(controller.driver.remote())
        if not takes_over(deployment, running["deployment"], running["silent_s"]):
            return controller
        log.warning(
            "taking over an adaserve deployment whose driver has not called for a while: stopping it",
            extra={"deployment": running["deployment"], "silent_s": round(running["silent_s"], 1)},
        )
        _stop_orphan(controller)


def _stop_orphan(controller: Any) -> None:
    """Stop a deployment whose driver died: its node servers (SIGTERM: accepted requests finish), then its
    controller and node actors, and wait until Ray lists none (a new controller would be handed the old one, and
    would adopt the old node actors)."""
    import ray

    try:
        ray.get(controller.stop.remote(), timeout=TAKE_OVER_TIMEOUT_S)
    except (ray.exceptions.RayError, TimeoutError) as exc:  # its node actors are killed all the same
        log.warning("the orphaned controller did not stop its node servers", extra={"error": str(exc)})
    deadline = time.monotonic() + TAKE_OVER_TIMEOUT_S
    while actors := named_actors():
        if time.monotonic() > deadline:
            raise ConfigError(f"the orphaned deployment's actors did not stop in {TAKE_OVER_TIMEOUT_S:g} s: {actors}")
        for name in actors:
            try:
                ray.kill(ray.get_actor(name, namespace=NAMESPACE), no_restart=True)
            except ValueError:  # gone meanwhile
                continue
        time.sleep(0.2)


def _serve(controller: Any, deployment: str, nodes: int | None) -> int:
    """Start the controller, print the node servers as they come up, and serve until SIGTERM or SIGINT, calling the
    controller every PING_EVERY_S (`_ping`); then stop the deployment. 1 if the controller was killed meanwhile."""
    import ray

    stopping, gone = threading.Event(), threading.Event()
    threading.Thread(target=_ping, args=(controller, stopping, gone), daemon=True).start()
    try:
        ray.get(controller.start.remote())
        print(json.dumps({"ray": ray.get_runtime_context().gcs_address, "deployment": deployment}), flush=True)
        _announce(controller, nodes)
        signal.sigwait({signal.SIGTERM, signal.SIGINT})
    finally:
        stopping.set()
        if not gone.is_set():
            ray.get(controller.stop.remote())
            ray.kill(controller, no_restart=True)
    if gone.is_set():
        log.error(
            "the controller was stopped from outside: another start took this deployment over (it found no call "
            f"from this process for {ORPHANED_AFTER_S:g} s), or it was killed",
            extra={"deployment": deployment},
        )
        return 1
    return 0


def _ping(controller: Any, stopping: threading.Event, gone: threading.Event) -> None:
    """Call the controller every PING_EVERY_S until `stopping`, from the start on (its start waits for the node
    servers): a controller Ray restarted starts on its first call, and the calls tell a later start that this
    deployment has its driver. A controller killed for good sets `gone` and ends this process as SIGTERM does."""
    import ray

    while not stopping.wait(PING_EVERY_S):
        try:
            ray.get(controller.ping.remote(), timeout=60)
        except ray.exceptions.ActorDiedError:
            if not stopping.is_set():  # not this process's own stop
                gone.set()
                os.kill(os.getpid(), signal.SIGTERM)
            return
        except (ray.exceptions.RayError, TimeoutError):
            continue


def _announce(controller: Any, expected: int | None) -> None:
    """Print each node server as it answers (a JSON line: node, http, grpc, pid), then `ready` once `expected`
    are up (a local cluster) or once the first is (an existing one, which may grow)."""
    import ray

    deadline = time.monotonic() + UP_TIMEOUT_S
    announced: set[str] = set()
    failures: dict[str, Any] = {}
    while time.monotonic() < deadline:
        snapshot = ray.get(controller.snapshot.remote())
        nodes, failures = snapshot["nodes"], snapshot.get("start_failures", {})
        for name, node in sorted(nodes.items()):
            if name not in announced:
                announced.add(name)
                print(json.dumps({"node": name, "http": node["http"], "grpc": node["grpc"], "pid": node["pid"]}))
        if announced and len(announced) >= (expected or 1):
            print(json.dumps({"ready": sorted(announced)}), flush=True)
            return
        sys.stdout.flush()
        time.sleep(0.5)
    why = "; ".join(f"node {name} failed to start {f['failures']} times: {f['error']}" for name, f in failures.items())
    started = f"{len(announced)} of {expected or 1} node servers started within {UP_TIMEOUT_S:g} s"
    raise TimeoutError(started + (f"; {why}" if why else ""))
