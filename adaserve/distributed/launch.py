"""Starting adaserve on a Ray cluster: `adaserve cluster up --nodes N` (a local cluster of N Ray nodes on this
machine, for trying it and for tests) and `adaserve serve --ray ADDRESS` (an existing cluster, one node server on
each of its machines). Either way this process is Ray's driver: it starts the placement controller, prints each
node server's address as it comes up, and on SIGTERM or SIGINT stops the node servers and leaves.

Each start is a deployment with an id of its own, which the controller keeps its state under (`state.py`). If an
adaserve controller already runs on the Ray cluster (another `serve --ray` started it, or one whose driver died),
this process joins that deployment rather than starting one: Ray hands back the running controller and its settings
stand, not this command line's (a warning says so); stopping this process stops that deployment."""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import time
import uuid
from typing import Any

from adaserve.distributed.controller import CONTROLLER, NAMESPACE, ClusterSettings, Controller
from adaserve.extras import needs_extra

#: Each local Ray node's object store: adaserve passes no data through it, so the least Ray accepts.
OBJECT_STORE_BYTES = 80 * 1024 * 1024
#: How often the driver calls the controller (which brings a restarted one back at once).
PING_EVERY_S = 2.0
#: How long `cluster up` waits for every node server to answer.
UP_TIMEOUT_S = 300.0

log = logging.getLogger("adaserve.cluster")


def run(settings: ClusterSettings, *, nodes: int | None = None, address: str | None = None) -> int:
    """Serve on the cluster until SIGTERM or SIGINT: a local one of `nodes` Ray nodes, or the one at `address`."""
    with needs_extra("cluster", "running on a Ray cluster"):
        import ray

    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})  # taken by sigtimedwait below
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
    ray.init(address=address, namespace=NAMESPACE, logging_level=logging.WARNING)
    deployment = uuid.uuid4().hex
    controller: Any = (
        ray.remote(Controller)
        .options(
            name=CONTROLLER,
            namespace=NAMESPACE,
            lifetime="detached",
            get_if_exists=True,
            max_restarts=-1,
            max_task_retries=-1,
            num_cpus=0,
        )
        .remote(settings, deployment)  # Ray restarts it with these arguments: the same deployment
    )
    try:
        ray.get(controller.start.remote())
        running = ray.get(controller.snapshot.remote())["deployment"]
        if running != deployment:
            log.warning(
                "an adaserve deployment runs on this Ray cluster already: this process joins it, under its settings "
                "(this command line's are not used); stopping this process stops it",
                extra={"deployment": running},
            )
        print(json.dumps({"ray": ray.get_runtime_context().gcs_address, "deployment": running}), flush=True)
        _announce(controller, nodes)
        while signal.sigtimedwait({signal.SIGTERM, signal.SIGINT}, PING_EVERY_S) is None:
            try:  # a controller Ray restarted starts again on its first call: this one, if no node calls first
                ray.get(controller.start.remote(), timeout=60)
            except (ray.exceptions.RayError, TimeoutError):
                continue
    finally:
        ray.get(controller.stop.remote())
        ray.kill(controller, no_restart=True)
        ray.shutdown()
        if cluster is not None:
            cluster.shutdown()
    return 0


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
