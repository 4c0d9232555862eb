"""Scenarios on a real 3-node Ray cluster (`adaserve cluster up --nodes 3`), run by `test_cluster.py` inside a
loopback-only network namespace: every node answers for every model, as the model run directly does; a model
resident on one node answers through the others; concurrent load with several models; a node server killed by its
PID under load loses no request, and one that stops answering (SIGSTOP) is killed and replaced, losing none, as is
a node actor that stops answering; the controller killed, routing goes on and placement resumes; bad input is
answered as on one node; a second start on the Ray cluster is refused; a node drained under load loses no request
and leaves, and comes back when undrained; with scale-in on, an idle node is given back, down to the floor; trace
settings changed on one node are every node's, a restarted node server's too."""

from __future__ import annotations

import json
import logging
import os
import random
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from adaserve.distributed.state import DeploymentState, RayKeyValue
from tests.server.reference import MODEL_INPUT_SHAPES, reference_outputs
from tests.server_utils import Clients, link_example, write_slow_model

if os.environ.get("ADASERVE_IN_NAMESPACE") != "1":
    pytest.skip("run by test_cluster.py inside a loopback-only network namespace", allow_module_level=True)

MODELS = ("mlp", "cnn", "mlp_torchscript")
#: A node server that answers its actor nothing for this long is killed (`--node-unresponsive-s`): long enough that
#: a server on a busy 2-core machine always answers in time.
UNRESPONSIVE_S = 10


@dataclass
class Node:
    name: str
    http: str
    grpc: str
    pid: int


@dataclass
class Cluster:
    process: subprocess.Popen[str]
    ray_address: str
    deployment: str
    nodes: list[Node]
    log: Path


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    root = tmp_path_factory.mktemp("cluster")
    repository = root / "models"
    repository.mkdir()
    for name in MODELS:
        link_example(repository, name, workers=[{"batch": 1}, {"batch": 4}])
    link_example(repository, "mlp", "mlp_later", workers=[{"batch": 1}])  # asked for once the controller restarted
    write_slow_model(repository, "slow", rounds=2000)  # tens of ms a request: one replica cannot keep up
    log = root / "cluster.log"
    command = [sys.executable, "-m", "adaserve", "cluster", "up", "--nodes", "3", "--model-repository", str(repository)]
    command += ["--trace-config", f"triton,file={root / 'trace-{node}.json'}"]  # one file per node server
    command += ["--node-unresponsive-s", str(UNRESPONSIVE_S)]
    with log.open("w") as errors:
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=errors, text=True)
    assert process.stdout is not None
    nodes, ray_address, deployment = [], "", ""
    try:
        for line in process.stdout:
            announced = json.loads(line)
            if "ray" in announced:
                ray_address, deployment = announced["ray"], announced["deployment"]
            elif "node" in announced:
                nodes.append(Node(announced["node"], announced["http"], announced["grpc"], announced["pid"]))
            elif "ready" in announced:
                break
        assert len(nodes) == 3, log.read_text()[-5000:]
        yield Cluster(process, ray_address, deployment, nodes, log)
    finally:
        process.stdout.close()
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _rows(model: str, seed: int, count: int = 3) -> np.ndarray:
    return np.random.default_rng(seed).random((count, *MODEL_INPUT_SHAPES[model]), dtype=np.float32)


def _infer(clients: Clients, node: Node, protocol: str, model: str, rows: np.ndarray) -> np.ndarray:
    if protocol == "http":
        tensor: Any = httpclient.InferInput("image", list(rows.shape), "FP32")
        tensor.set_data_from_numpy(rows)
        answer: Any = clients.http(node.http, network_timeout=120.0).infer(model, [tensor])
    else:
        tensor = grpcclient.InferInput("image", list(rows.shape), "FP32")
        tensor.set_data_from_numpy(rows)
        answer = clients.grpc(node.grpc).infer(model, [tensor], client_timeout=120)
    return answer.as_numpy("logits")  # type: ignore[no-any-return]


def _ready_on(clients: Clients, node: Node) -> set[str]:
    """The models node `node` holds itself (its repository index says READY, and not held elsewhere)."""
    index = clients.http(node.http).get_model_repository_index()
    return {row["name"] for row in index if row.get("state") == "READY" and not row.get("reason")}


def _close(actual: np.ndarray, expected: np.ndarray) -> None:
    np.testing.assert_allclose(actual, expected, rtol=1e-4, atol=1e-5)


def test_every_node_answers_for_every_model_as_the_model_does(cluster: Cluster) -> None:
    with Clients() as clients:
        for model in MODELS:
            rows = _rows(model, 0)
            expected = reference_outputs(model, rows)
            for node in cluster.nodes:
                for protocol in ("http", "grpc"):
                    _close(_infer(clients, node, protocol, model, rows), expected)
        holders = {model: [n.name for n in cluster.nodes if model in _ready_on(clients, n)] for model in MODELS}
    assert all(len(nodes) == 1 for nodes in holders.values()), holders  # placed once, answered everywhere
    listing = subprocess.run(
        [sys.executable, "-m", "adaserve", "models", "list", "--cluster", cluster.nodes[0].http],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    for model, nodes in holders.items():
        held_here = nodes[0] == cluster.nodes[0].name
        assert (f"{model}\tREADY\theld here" if held_here else f"held on 1 other node(s): {nodes[0]}") in listing
    assert (
        f'adaserve_cluster_placement_decisions_total{{decision="placed",node="{cluster.nodes[0].name}"}} 3.0' in listing
    )
    # the cluster's metrics, from any node: every node answered, each model's series under its holder's name
    metrics = urllib.request.urlopen(f"http://{cluster.nodes[1].http}/metrics/cluster", timeout=30).read().decode()
    for node in cluster.nodes:
        assert f'adaserve_cluster_node_up{{node="{node.name}"}} 1.0' in metrics
    for model, nodes in holders.items():
        assert f'adaserve_inference_request_success_total{{model="{model}",node="{nodes[0]}",version="1"}}' in metrics


def test_concurrent_load_over_several_models(cluster: Cluster) -> None:
    picks = random.Random(1)
    jobs = [
        (picks.choice(cluster.nodes), picks.choice(("http", "grpc")), picks.choice(MODELS), seed) for seed in range(90)
    ]

    def run(job: tuple[Node, str, str, int]) -> None:
        node, protocol, model, seed = job
        rows = _rows(model, seed, count=1 + seed % 4)
        with Clients() as clients:
            _close(_infer(clients, node, protocol, model, rows), reference_outputs(model, rows))

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(run, jobs))


def test_bad_input_is_answered_as_on_one_node(cluster: Cluster) -> None:
    with Clients() as clients:
        for node in cluster.nodes:
            wrong = httpclient.InferInput("pixels", [1, 784], "FP32")
            wrong.set_data_from_numpy(np.zeros((1, 784), dtype=np.float32))
            with pytest.raises(InferenceServerException, match="unknown input 'pixels'"):
                clients.http(node.http).infer("mlp", [wrong])
            with pytest.raises(InferenceServerException, match="unknown model 'nope'"):
                clients.http(node.http).infer("nope", [wrong])
            short = grpcclient.InferInput("image", [1, 3], "FP32")
            short.set_data_from_numpy(np.zeros((1, 3), dtype=np.float32))
            with pytest.raises(InferenceServerException) as refused:
                clients.grpc(node.grpc).infer("mlp", [short])
            assert refused.value.status() == "StatusCode.INVALID_ARGUMENT"


def test_a_second_start_on_the_ray_cluster_is_refused_naming_the_running_deployment(cluster: Cluster) -> None:
    repository = cluster.log.parent / "models"
    command = [sys.executable, "-m", "adaserve", "serve", "--ray", cluster.ray_address, "--model-repository"]
    refused = subprocess.run([*command, str(repository)], capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2, refused.stderr[-3000:]  # a configuration error: nothing was started or stopped
    assert f"adaserve deployment {cluster.deployment} runs on this Ray cluster" in refused.stderr, refused.stderr
    with Clients() as clients:  # the running deployment serves on
        rows = _rows("mlp", 2)
        _close(_infer(clients, cluster.nodes[2], "http", "mlp", rows), reference_outputs("mlp", rows))


def _trace_settings(node: Node, model: str = "") -> dict[str, Any]:
    path = f"/v2/models/{model}/trace/setting" if model else "/v2/trace/setting"
    with urllib.request.urlopen(f"http://{node.http}{path}", timeout=30) as answer:
        return json.loads(answer.read())  # type: ignore[no-any-return]


def _server_pid(name: str) -> int | None:
    """The process id of node `name`'s server (`adaserve serve --cluster-node NAME`), None while it has none."""
    for entry in Path("/proc").iterdir():
        try:
            command = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if entry.name.isdigit() and b"serve" in command and name.encode() in command:
            return int(entry.name)
    return None


def test_trace_settings_changed_on_one_node_are_every_nodes(cluster: Cluster) -> None:
    first, second, third = cluster.nodes
    with Clients() as clients:
        clients.http(first.http).update_trace_settings(settings={"trace_rate": "7", "trace_count": "3"})
        clients.grpc(second.grpc).update_trace_settings("cnn", {"trace_rate": ["2"]})
        busy = {n.name for n in cluster.nodes if {"mlp", "cnn"} & _ready_on(clients, n)}
    for node in cluster.nodes:
        assert (_trace_settings(node)["trace_rate"], _trace_settings(node)["trace_count"]) == ("7", "3")
        assert _trace_settings(node, "cnn")["trace_rate"] == "2" and _trace_settings(node, "mlp")["trace_rate"] == "7"
    # a node server that restarts takes the cluster's settings (one holding neither model, if one holds neither)
    restarted = next((n for n in (third, second, first) if n.name not in busy), third)
    os.kill(restarted.pid, signal.SIGKILL)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        pid = _server_pid(restarted.name)
        try:
            if pid not in (None, restarted.pid) and _trace_settings(restarted)["trace_rate"] == "7":
                break
        except OSError:
            pass
        time.sleep(0.5)
    assert _trace_settings(restarted, "cnn")["trace_rate"] == "2"
    restarted.pid = _server_pid(restarted.name) or restarted.pid
    with Clients() as clients:  # back to the settings at start, and every model held, for the scenarios after this
        clients.http(third.http).update_trace_settings(settings={"trace_rate": None, "trace_count": None})
        clients.http(third.http).update_trace_settings("cnn", {})
        for model in MODELS:  # placed again if the restarted server held it
            rows = _rows(model, 5)
            _close(_infer(clients, first, "http", model, rows), reference_outputs(model, rows))
    assert _trace_settings(first)["trace_rate"] == "1000" and _trace_settings(first, "cnn")["trace_rate"] == "1000"


def test_tracing_turned_on_at_one_node_traces_requests_entering_every_node(cluster: Cluster) -> None:
    on = {"trace_level": ["TIMESTAMPS"], "trace_rate": "1", "log_frequency": "1"}  # each trace a file of its own
    with Clients() as clients:
        clients.http(cluster.nodes[0].http).update_trace_settings(settings=on)
        for node in cluster.nodes:
            rows = _rows("mlp", 6, count=1)
            _close(_infer(clients, node, "http", "mlp", rows), reference_outputs("mlp", rows))
        clients.http(cluster.nodes[1].http).update_trace_settings(settings=dict.fromkeys(on))  # back to the start's

    deadline = time.monotonic() + 30
    while not all(_traced(cluster, node) for node in cluster.nodes) and time.monotonic() < deadline:
        time.sleep(0.2)
    for node in cluster.nodes:  # the request that entered there (and any a node sent it), in its own file
        assert {entry["model_name"] for entry in _traced(cluster, node)} == {"mlp"}, node.name


def test_a_trace_count_is_taken_once_in_all_wherever_the_requests_enter(cluster: Cluster) -> None:
    """Five traces asked of three nodes, every request entering one of them: it takes its share, then what the
    others hand on (a second or so behind), five in all; every node reads what is left of the cluster's count."""
    entry = cluster.nodes[2]
    on = {"trace_level": ["TIMESTAMPS"], "trace_rate": "1", "log_frequency": "1", "trace_count": "5"}

    def taken() -> int:  # traces sampled where requests entered (a holder's of a forwarded one names its parent)
        return sum(1 for n in cluster.nodes for entry in _traced(cluster, n) if "parent_span_id" not in entry)

    before = taken()
    with Clients() as clients:
        clients.http(cluster.nodes[0].http).update_trace_settings(settings=on)
        assert {_trace_settings(node)["trace_count"] for node in cluster.nodes} == {"5"}
        deadline = time.monotonic() + 60
        while _trace_settings(entry)["trace_count"] != "0" and time.monotonic() < deadline:
            for seed in range(3):
                rows = _rows("mlp", seed, count=1)
                _close(_infer(clients, entry, "http", "mlp", rows), reference_outputs("mlp", rows))
            time.sleep(1.0)  # the entry's next report asks for more of the count
        assert {_trace_settings(node)["trace_count"] for node in cluster.nodes} == {"0"}
        clients.http(cluster.nodes[1].http).update_trace_settings(settings=dict.fromkeys(on))  # back to the start's
    deadline = time.monotonic() + 30
    while taken() < before + 5 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert taken() == before + 5


def _traced(cluster: Cluster, node: Node) -> list[dict[str, Any]]:
    """The head entries (those naming a model) of node `node`'s own trace files (parts .0, .1, ...: `log_frequency`
    1)."""
    parts = cluster.log.parent.glob(f"trace-{node.name}.json.*")
    return [entry for part in parts for entry in json.loads(part.read_text()) if "model_name" in entry]


def test_a_node_server_killed_under_load_loses_no_request(cluster: Cluster) -> None:
    with Clients() as clients:
        holder = next(n for n in cluster.nodes if "mlp" in _ready_on(clients, n))
    others = [n for n in cluster.nodes if n is not holder]
    outcomes: list[str] = []

    with ThreadPoolExecutor(4) as pool:
        running = [pool.submit(_send_and_judge, others[seed % 2], "mlp", seed, outcomes) for seed in range(40)]
        time.sleep(0.3)
        os.kill(holder.pid, signal.SIGKILL)
        running += [pool.submit(_send_and_judge, others[seed % 2], "mlp", seed, outcomes) for seed in range(40, 120)]
        for future in running:
            future.result(timeout=300)
    assert len(outcomes) == 120
    assert outcomes.count("answered") >= 100, outcomes  # a retry elsewhere answers nearly all of them
    with Clients() as clients:  # mlp is served again, and the dead node's server was restarted and answers
        rows = _rows("mlp", 7)
        _close(_infer(clients, others[0], "http", "mlp", rows), reference_outputs("mlp", rows))
        _wait_live(clients, holder)
        _close(_infer(clients, holder, "http", "mlp", rows), reference_outputs("mlp", rows))


def test_a_node_server_that_stops_answering_is_killed_and_replaced_losing_no_request(cluster: Cluster) -> None:
    rows = _rows("cnn", 3)
    with Clients() as clients:  # cnn placed somewhere
        _close(_infer(clients, cluster.nodes[0], "http", "cnn", rows), reference_outputs("cnn", rows))
        holder = next(n for n in cluster.nodes if "cnn" in _ready_on(clients, n))
    others = [n for n in cluster.nodes if n is not holder]
    stopped = _server_pid(holder.name)
    assert stopped is not None
    os.kill(stopped, signal.SIGSTOP)  # alive, answering nothing: neither Ray nor a dead process tells
    outcomes: list[str] = []
    try:
        with ThreadPoolExecutor(4) as pool:
            for future in [pool.submit(_send_and_judge, others[seed % 2], "cnn", seed, outcomes) for seed in range(24)]:
                future.result(timeout=300)
    finally:
        if _server_pid(holder.name) == stopped:  # not killed (the test failed): let it go on
            os.kill(stopped, signal.SIGCONT)
    assert len(outcomes) == 24
    assert outcomes.count("answered") >= 20, outcomes
    deadline = time.monotonic() + 120  # its actor killed it, and started a fresh server in its place
    while _server_pid(holder.name) in (stopped, None) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert _server_pid(holder.name) not in (stopped, None)
    with Clients() as clients:
        _wait_live(clients, holder)
        _close(_infer(clients, holder, "grpc", "cnn", rows), reference_outputs("cnn", rows))


def test_a_node_actor_that_stops_answering_is_killed_and_its_node_started_afresh(cluster: Cluster) -> None:
    rows = _rows("cnn", 5)
    with Clients() as clients:
        _close(_infer(clients, cluster.nodes[0], "http", "cnn", rows), reference_outputs("cnn", rows))
        holder = next(n for n in cluster.nodes if "cnn" in _ready_on(clients, n))
    others = [n for n in cluster.nodes if n is not holder]
    server = _server_pid(holder.name)
    assert server is not None
    actor = int(Path(f"/proc/{server}/stat").read_text().rsplit(")", 1)[1].split()[1])  # its parent: the actor
    os.kill(actor, signal.SIGSTOP)  # listed by Ray as alive, answering nothing
    outcomes: list[str] = []
    try:
        deadline = time.monotonic() + UNRESPONSIVE_S + 60  # the controller kills it; a fresh one starts a server
        seed = 100
        while _server_pid(holder.name) in (server, None) and time.monotonic() < deadline:
            _send_and_judge(others[seed % 2], "cnn", seed, outcomes)  # its node's server still serves meanwhile
            seed += 1
            time.sleep(0.2)
    finally:
        if _running(actor):  # not killed (the test failed): let it go on
            os.kill(actor, signal.SIGCONT)
    assert not _running(actor) and _server_pid(holder.name) not in (server, None)
    assert outcomes.count("answered") >= len(outcomes) - 2, outcomes
    with Clients() as clients:
        _wait_live(clients, holder)
        _close(_infer(clients, holder, "grpc", "cnn", rows), reference_outputs("cnn", rows))


def _running(pid: int) -> bool:
    """Whether process `pid` exists and has not exited (a zombie has)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _send_and_judge(node: Node, model: str, seed: int, outcomes: list[str]) -> None:
    """One request for `model` to `node`, over REST or gRPC by seed: its outcome, "answered" (correctly) or
    "refused" (a 503 / UNAVAILABLE that names why), in `outcomes`; anything else fails the test."""
    rows = _rows(model, seed)
    with Clients() as clients:
        try:
            _close(_infer(clients, node, "http" if seed % 3 else "grpc", model, rows), reference_outputs(model, rows))
            outcomes.append("answered")
        except InferenceServerException as exc:  # a 503 that names why, never a silent loss
            assert "503" in str(exc.status()) or "UNAVAILABLE" in str(exc.status()), exc
            assert "node" in str(exc) or "placed" in str(exc), exc
            outcomes.append("refused")


def _wait_live(clients: Clients, node: Node, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if clients.http(node.http).is_server_live():
                return
        except (InferenceServerException, OSError):
            time.sleep(0.5)


def test_routing_goes_on_while_the_controller_restarts_and_placement_resumes(cluster: Cluster) -> None:
    import ray

    ray.init(address=cluster.ray_address, namespace="adaserve", logging_level=logging.ERROR)
    try:
        controller = ray.get_actor("adaserve-controller")
        before: dict[str, Any] = ray.get(controller.snapshot.remote())
        ray.kill(controller, no_restart=False)  # Ray restarts it; it rebuilds its books from the nodes
        with Clients() as clients:  # routing goes on by the tables the nodes hold
            for node in cluster.nodes:
                rows = _rows("cnn", 3)
                _close(_infer(clients, node, "grpc", "cnn", rows), reference_outputs("cnn", rows))
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                after = ray.get(ray.get_actor("adaserve-controller").snapshot.remote(), timeout=10)
                if len(after["nodes"]) == 3:
                    break
            except Exception:
                time.sleep(0.5)
        assert after["deployment"] == before["deployment"]  # restarted with its arguments: its state's keys
        resident = {name: set(node["residents"]) for name, node in after["nodes"].items()}
        assert resident == {name: set(node["residents"]) for name, node in before["nodes"].items()}
        with Clients() as clients:  # placement resumes: a model unloaded by hand is placed again on its request
            holder = next(n for n in cluster.nodes if "mlp_torchscript" in _ready_on(clients, n))
            clients.http(holder.http).unload_model("mlp_torchscript")
            rows = _rows("mlp_torchscript", 4)
            _close(
                _infer(clients, cluster.nodes[0], "http", "mlp_torchscript", rows),
                reference_outputs("mlp_torchscript", rows),
            )
    finally:
        ray.shutdown()


def test_a_model_one_replica_cannot_serve_is_replicated(cluster: Cluster) -> None:
    """Eight clients keep the slow model's queue full: demand (arrivals plus the queue drained in 2 s) passes what
    one replica serves, and the controller adds replicas; every answer stays right (y = x)."""
    stop = threading.Event()

    def client(index: int) -> int:
        node = cluster.nodes[index % len(cluster.nodes)]
        answered = 0
        with Clients() as clients:
            while not stop.is_set() and answered < 2000:
                rows = np.full((1, 4), index + answered, dtype=np.float32)
                tensor = httpclient.InferInput("x", [1, 4], "FP32")
                tensor.set_data_from_numpy(rows)
                answer = clients.http(node.http, network_timeout=120.0).infer("slow", [tensor]).as_numpy("y")
                np.testing.assert_array_equal(answer, rows)
                answered += 1
        return answered

    holders: list[str] = []
    with ThreadPoolExecutor(8) as pool, Clients() as clients:
        running = [pool.submit(client, index) for index in range(8)]
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and len(holders) < 2:
            time.sleep(0.5)
            holders = [node.name for node in cluster.nodes if "slow" in _ready_on(clients, node)]
        stop.set()
        answered = sum(future.result(timeout=300) for future in running)
    assert len(holders) >= 2, f"one replica after {answered} requests"


def _json_infer(node: Node, rows: np.ndarray) -> np.ndarray:
    """mlp's answer to `rows` from `node`, by plain HTTP: a connection the node refuses is a ConnectionRefusedError."""
    document = {
        "inputs": [{"name": "image", "shape": list(rows.shape), "datatype": "FP32", "data": rows.ravel().tolist()}]
    }
    request = urllib.request.Request(
        f"http://{node.http}/v2/models/mlp/infer", json.dumps(document).encode(), {"content-type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=120) as answer:
            output = json.load(answer)["outputs"][0]
    except urllib.error.URLError as exc:
        if isinstance(exc.reason, ConnectionRefusedError):
            raise exc.reason from None
        raise
    return np.array(output["data"], dtype=np.float32).reshape(output["shape"])


def test_a_node_drained_under_load_answers_every_request_and_leaves(cluster: Cluster) -> None:
    """Three clients send mlp requests to every node in turn while the node holding mlp is drained: every request a
    node accepted is answered right (the drained node refuses connections only once it is gone); mlp is then
    served from another node, the drained node's actor is gone, and `undrain` brings it back."""
    import ray

    with Clients() as clients:
        holder = next(n for n in cluster.nodes if "mlp" in _ready_on(clients, n))
    stop, holder_answered = threading.Event(), threading.Event()

    def client(index: int) -> Counter[str]:
        outcomes: Counter[str] = Counter()
        while not stop.is_set():
            node = cluster.nodes[(index + sum(outcomes.values())) % len(cluster.nodes)]
            rows = _rows("mlp", 1000 * index + sum(outcomes.values()), count=1)
            try:
                _close(_json_infer(node, rows), reference_outputs("mlp", rows))
            except ConnectionRefusedError:
                assert node is holder, f"{node.name} refused a connection"
                outcomes["refused"] += 1
                continue
            outcomes["answered by the drained node" if node is holder else "answered"] += 1
            if node is holder:
                holder_answered.set()
            time.sleep(0.05)  # a small load: the drain's load elsewhere has cores to run on
        return outcomes

    command = [sys.executable, "-m", "adaserve", "cluster", "drain", holder.name[:12], "--ray", cluster.ray_address]
    with ThreadPoolExecutor(3) as pool:
        running = [pool.submit(client, index) for index in range(3)]
        holder_answered.wait(timeout=60)  # the drain starts under load (not after a fixed second)
        drained = subprocess.run([*command, "--timeout-s", "20"], capture_output=True, text=True, timeout=300)
        time.sleep(1.0)
        stop.set()
        outcomes = sum((future.result(timeout=300) for future in running), Counter())
    assert drained.returncode == 0, drained.stderr[-3000:]
    summary = json.loads(drained.stdout.splitlines()[-1])
    assert summary["node"] == holder.name and summary["busy"] == [], summary
    assert "mlp" not in summary["written_off"], summary  # it had load: moved, unless another replica held it
    assert outcomes["answered"] > 0 and outcomes["answered by the drained node"] > 0, outcomes
    others = [n for n in cluster.nodes if n is not holder]
    with Clients() as clients:
        assert any("mlp" in _ready_on(clients, n) for n in others)
        rows = _rows("mlp", 9)
        _close(_infer(clients, others[0], "grpc", "mlp", rows), reference_outputs("mlp", rows))
    ray.init(address=cluster.ray_address, namespace="adaserve", logging_level=logging.ERROR)
    try:
        with pytest.raises(ValueError):
            ray.get_actor("adaserve-node-" + holder.name)
        controller = ray.get_actor("adaserve-controller")
        snapshot = ray.get(controller.snapshot.remote())
        assert holder.name not in snapshot["nodes"] and snapshot["drained"] == [holder.name]
        store = RayKeyValue("adaserve")  # the drained node kept under this deployment's id, and nothing else there
        assert DeploymentState(snapshot["deployment"], store).drained() == {holder.name}
        assert all(key.startswith(f"deployment/{snapshot['deployment']}/") for key in store.list_keys())
        undrain = [sys.executable, "-m", "adaserve", "cluster", "undrain", holder.name, "--ray", cluster.ray_address]
        subprocess.run(undrain, capture_output=True, text=True, timeout=120, check=True)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and holder.name not in ray.get(controller.snapshot.remote())["nodes"]:
            time.sleep(0.5)
        snapshot = ray.get(controller.snapshot.remote())
        assert holder.name in snapshot["nodes"] and snapshot["drained"] == [], snapshot
    finally:
        ray.shutdown()
    rows = _rows("mlp", 10, count=1)
    _close(_json_infer(holder, rows), reference_outputs("mlp", rows))  # it serves again, on its ports


def test_with_scale_in_on_an_idle_node_is_given_back_down_to_the_floor(cluster: Cluster) -> None:
    """Every model used, then scale-in on (idle 3 s, at least 2 nodes): one node is drained once idle, the models
    it held moved first (they had requests), every model still answered; then scale-in off."""
    import ray

    with Clients() as clients:
        for model in MODELS:
            rows = _rows(model, 20)
            _close(_infer(clients, cluster.nodes[0], "http", model, rows), reference_outputs(model, rows))

    def scale_in(*args: str) -> dict[str, Any]:
        command = [sys.executable, "-m", "adaserve", "cluster", "scale-in", *args, "--ray", cluster.ray_address]
        done = subprocess.run(command, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr[-3000:]
        return json.loads(done.stdout.splitlines()[-1])  # type: ignore[no-any-return]

    assert scale_in("3", "--min-nodes", "2") == {"scale_in_idle_s": 3.0, "min_nodes": 2}
    ray.init(address=cluster.ray_address, namespace="adaserve", logging_level=logging.ERROR)
    try:
        controller = ray.get_actor("adaserve-controller")
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and not ray.get(controller.snapshot.remote())["decisions"]["scaled_in"]:
            time.sleep(0.5)
        snapshot = ray.get(controller.snapshot.remote())
    finally:
        ray.shutdown()
    assert scale_in("0") == {"scale_in_idle_s": None, "min_nodes": None}
    (given_back,) = snapshot["drained"]
    assert snapshot["decisions"]["scaled_in"] == 1 and len(snapshot["nodes"]) == 2, snapshot
    serving = [node for node in cluster.nodes if node.name != given_back]
    with Clients() as clients:
        held = set().union(*(_ready_on(clients, node) for node in serving))
        assert set(MODELS) <= held  # moved before the node went, not written off
        for model in MODELS:
            rows = _rows(model, 21)
            _close(_infer(clients, serving[1], "grpc", model, rows), reference_outputs(model, rows))
