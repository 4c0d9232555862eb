"""A DAG query on a cluster, through two real node servers and this test as their node actor (no Ray, as in
`test_forwarding.py`): the query loads on both though neither holds its models; sent to `a`, whose models `b` holds,
it answers what its models answer run directly, its plan in its parameters, each stage forwarded once and counted;
an option `a` did not time at load is timed once a request finds it held; a stage whose model no node holds waits
for the controller to place it; a stage whose holder is dead is sent again to another, or answered 503 naming it;
a request and a query traced on `a` are one trace with their runs on `b`."""

from __future__ import annotations

import json
import re
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import yaml
from tritonclient.utils import InferenceServerException

from adaserve.distributed.messages import NodeAddress, Place, Report, Requests, Resident, Routes, Unload, Unloaded
from adaserve.distributed.testing import FakeActor, FakeController
from tests.distributed.test_forwarding import _node, _same, _table
from tests.server_utils import Clients, ServerHandle, free_ports, link_example

Nodes = dict[str, tuple[ServerHandle, FakeActor]]
#: Runs of each option when the query loads (or, on a cluster node, once a request finds the option held).
PROBES = 2
#: The classes of `classify`'s answer whose rows `refine` runs on.
REFINED = [0, 1, 2, 3, 4]


def _write_dag(repository: Path) -> None:
    """classify (mlp, on the flat image) → refine (cnn, on the 28×28 image) on rows classify puts in REFINED; each
    row's logits refine's where it ran, else classify's."""
    document: dict[str, Any] = {
        "max_batch_size": 4,
        "inputs": [
            {"name": "flat", "datatype": "FP32", "shape": [-1, 784]},
            {"name": "image", "datatype": "FP32", "shape": [-1, 1, 28, 28]},
        ],
        "outputs": [{"name": "logits", "datatype": "FP32", "shape": [-1, 10]}],
        "probes": PROBES,
        "nodes": [
            {"name": "classify", "options": [{"model": "mlp", "accuracy": 0.9}], "inputs": {"image": "flat"}},
            {
                "name": "refine",
                "when": {"source": "classify.logits", "argmax_in": REFINED},
                "options": [{"model": "cnn", "accuracy": 0.95}],
                "inputs": {"image": "image"},
            },
        ],
        "results": {"logits": ["refine.logits", "classify.logits"]},
    }
    (repository / "pipe").mkdir()
    (repository / "pipe" / "dag.yaml").write_text(yaml.safe_dump(document))


@pytest.fixture(scope="module")
def nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Nodes]:
    repository = tmp_path_factory.mktemp("cluster_dag") / "models"
    repository.mkdir()
    for name in ("mlp", "cnn"):
        link_example(repository, name, workers=[{"batch": 4}])
    _write_dag(repository)
    with ExitStack() as stack:  # each node writes its traces, once turned on, to traces/NAME (`_traces`)
        (repository.parent / "traces").mkdir()
        started = {
            name: _node(stack, repository, name, f"--trace-config=triton,file={repository.parent / 'traces' / name}")
            for name in ("a", "b")
        }
        FakeController(actor for _, actor in started.values())  # a trace setting changed on one is both nodes'
        yield started


def _settled(actor: FakeActor) -> None:
    """Wait until the node took what was sent before (its channel answers in order)."""
    actor.send(Report())
    actor.expect(Resident)


def _infer(url: str, model: str, inputs: dict[str, np.ndarray]) -> tuple[np.ndarray, dict[str, Any]]:
    with Clients() as clients:
        tensors = []
        for name, array in inputs.items():
            tensors.append(httpclient.InferInput(name, list(array.shape), "FP32"))
            tensors[-1].set_data_from_numpy(array)
        answer = clients.http(url).infer(model, tensors)
        return answer.as_numpy("logits"), answer.get_response().get("parameters", {})


def _rows(seed: int) -> dict[str, np.ndarray]:
    """Three images, each a bright rectangle (the models put noise in one class, rectangles in several)."""
    rng = np.random.default_rng(seed)
    image = np.zeros((3, 1, 28, 28), np.float32)
    for row in image:
        (top, left), (height, width) = rng.integers(0, 20, 2), rng.integers(4, 14, 2)
        row[0, top : top + height, left : left + width] = 1
    return {"flat": image.reshape(3, 784), "image": image}


def _direct(url: str, rows: dict[str, np.ndarray]) -> np.ndarray:
    """The query's answer from its models run directly, each on every row."""
    classified, _ = _infer(url, "mlp", {"image": rows["flat"]})
    refined, _ = _infer(url, "cnn", {"image": rows["image"]})
    return np.where(np.isin(classified.argmax(axis=1), REFINED)[:, None], refined, classified)


def _split_rows(url: str) -> dict[str, np.ndarray]:
    """Rows of which refine runs on some and not on others."""
    for seed in range(100):
        rows = _rows(seed)
        classes = _infer(url, "mlp", {"image": rows["flat"]})[0].argmax(axis=1)
        if 0 < np.isin(classes, REFINED).sum() < len(classes):
            return rows
    raise AssertionError("no seed splits the rows")


def _forwards(url: str, model: str) -> float:
    """How many requests for `model` node `url` (a) forwarded to b."""
    metrics = urllib.request.urlopen(f"http://{url}/metrics", timeout=10).read().decode()
    prefix = f'adaserve_cluster_forwarded_requests_total{{holder="b",model="{model}",node="a"}} '
    return next((float(line[len(prefix) :]) for line in metrics.splitlines() if line.startswith(prefix)), 0.0)


def test_a_query_loads_on_every_node_before_any_holds_its_models(nodes: Nodes) -> None:
    with Clients() as clients:
        for handle, _ in nodes.values():
            index = {row["name"]: row for row in clients.http(handle.http_url).get_model_repository_index()}
            assert index["pipe"]["state"] == "READY"
            assert index["mlp"]["state"] == "UNAVAILABLE"  # timing it at load would have placed it
            metadata = clients.http(handle.http_url).get_model_metadata("pipe")
            assert metadata["platform"] == "dag" and [t["name"] for t in metadata["inputs"]] == ["flat", "image"]


def test_a_query_whose_models_another_node_holds_answers_as_its_models_do(nodes: Nodes) -> None:
    (a, a_actor), (b, b_actor) = nodes["a"], nodes["b"]
    b_actor.load("mlp")
    b_actor.load("cnn")
    _table(nodes, 1, {"mlp": ["b"], "cnn": ["b"]})
    _settled(a_actor)
    rows = _split_rows(b.http_url)
    a_actor.drain()
    logits, parameters = _infer(a.http_url, "pipe", rows)
    _same(logits, _direct(b.http_url, rows))
    assert parameters["dag_plan"] == "classify=mlp,refine=cnn"
    with Clients() as clients:  # over gRPC too
        tensors = []
        for name, array in rows.items():
            tensors.append(grpcclient.InferInput(name, list(array.shape), "FP32"))
            tensors[-1].set_data_from_numpy(array)
        answer = clients.grpc(a.grpc_url).infer("pipe", tensors)
    _same(answer.as_numpy("logits"), logits)
    assert answer.get_response().parameters["dag_plan"].string_param == "classify=mlp,refine=cnn"
    # each stage one forwarded request; and each option, left untimed at a's start, timed once a request found it
    # held (PROBES runs, in the background)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and min(_forwards(a.http_url, m) for m in ("mlp", "cnn")) < 2 + PROBES:
        time.sleep(0.2)
    assert [_forwards(a.http_url, model) for model in ("mlp", "cnn")] == [2 + PROBES] * 2
    # counted where the query arrived, for the controller to learn the models' rates
    counted: dict[str, int] = {}
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and counted.get("cnn", 0) < 2 + PROBES:
        report = a_actor.expect(Requests, timeout_s=5)
        assert isinstance(report, Requests)
        for model, count in report.counts.items():
            counted[model] = counted.get(model, 0) + count
    assert counted == {"pipe": 2, "mlp": 2 + PROBES, "cnn": 2 + PROBES}


def test_a_stage_whose_model_no_node_holds_waits_for_its_placement(nodes: Nodes) -> None:
    (a, a_actor), (b, b_actor) = nodes["a"], nodes["b"]
    b_actor.send(Unload("cnn"))
    assert b_actor.expect(Unloaded) == Unloaded("cnn")
    _table(nodes, 2, {"mlp": ["b"]})
    _settled(a_actor)
    rows = _split_rows(b.http_url)
    a_actor.drain()
    with ThreadPoolExecutor(1) as pool:
        asked = pool.submit(_infer, a.http_url, "pipe", rows)
        place = a_actor.expect(Place)
        assert isinstance(place, Place) and place.model == "cnn" and place.avoid == []
        b_actor.load("cnn")
        _table(nodes, 3, {"mlp": ["b"], "cnn": ["b"]})
        logits, parameters = asked.result(timeout=120)
    _same(logits, _direct(b.http_url, rows))
    assert parameters["dag_plan"] == "classify=mlp,refine=cnn"


def test_a_stage_caught_by_a_dead_holder_is_sent_again_or_answered_503_naming_it(nodes: Nodes) -> None:
    (a, a_actor), (b, _) = nodes["a"], nodes["b"]
    dead = [f"127.0.0.1:{port}" for port in free_ports(2)]  # nothing listens there
    addresses = {
        "a": NodeAddress(a.http_url, a.grpc_url),
        "b": NodeAddress(b.http_url, b.grpc_url),
        "c": NodeAddress(dead[0], dead[0]),
        "d": NodeAddress(dead[1], dead[1]),
    }
    rows = _rows(0)
    expected = _direct(b.http_url, rows)
    a_actor.send(Routes(4, addresses, {"mlp": ["c", "b"], "cnn": ["c", "b"]}))
    _settled(a_actor)
    for _ in range(2):  # whichever holder each stage is sent to first
        _same(_infer(a.http_url, "pipe", rows)[0], expected)
    metrics = urllib.request.urlopen(f"http://{a.http_url}/metrics", timeout=10).read().decode()
    retried = re.search(r'adaserve_cluster_forward_retries_total\{model="mlp",node="a"\} (\S+)', metrics)
    assert retried is not None and float(retried[1]) >= 1  # sent to c first at least once (holders take turns)
    a_actor.send(Routes(5, addresses, {"mlp": ["c", "d"], "cnn": ["b"]}))
    _settled(a_actor)
    with pytest.raises(InferenceServerException, match="did not answer the forwarded request") as failed:
        _infer(a.http_url, "pipe", rows)
    assert failed.value.status() == "503"
    assert any(address in str(failed.value) for address in dead)


def _traces(handle: ServerHandle, node: str, count: int) -> dict[int, dict[str, Any]]:
    """Node `node`'s traces by id, each its head entry with its `forwards` (FORWARD entries) and timestamps' names,
    read from its trace files (`log_frequency` 1: a file per trace, written once it is answered) once there are
    `count` (or 30 s passed)."""
    deadline = time.monotonic() + 30
    while True:
        traces: dict[int, dict[str, Any]] = {}
        for path in (handle.log.parent / "traces").glob(f"{node}.*"):
            for entry in json.loads(path.read_text()):
                trace = traces.setdefault(entry["id"], {"forwards": [], "stamps": []})
                if entry.get("activity") == "FORWARD":
                    trace["forwards"].append(entry)
                elif "model_name" in entry:
                    trace.update(entry)
                else:
                    trace["stamps"] += [stamp["name"] for stamp in entry.get("timestamps", [])]
        if len(traces) >= count or time.monotonic() > deadline:
            return traces
        time.sleep(0.2)


def _one(traces: dict[int, dict[str, Any]], **fields: Any) -> dict[str, Any]:
    (found,) = [t for t in traces.values() if all(t.get(key) == value for key, value in fields.items())]
    return found


def test_a_request_and_a_query_entering_a_are_one_trace_with_their_runs_on_b(nodes: Nodes) -> None:
    """Traced on `a` (every request sampled), each forward is an entry of `a`'s trace naming `b` and a span id; `b`
    traces what came with that span as its child, in the same W3C trace."""
    (a, a_actor), (b, b_actor) = nodes["a"], nodes["b"]
    b_actor.send(Report())
    held = b_actor.expect(Resident)
    assert isinstance(held, Resident)
    for model in {"mlp", "cnn"} - set(held.models):
        b_actor.load(model)
    _table(nodes, 6, {"mlp": ["b"], "cnn": ["b"]})
    _settled(a_actor)
    rows = _split_rows(b.http_url)
    on = {"trace_level": ["TIMESTAMPS"], "trace_rate": "1", "log_frequency": "1"}
    with Clients() as clients:
        try:
            clients.http(a.http_url).update_trace_settings(settings=on)  # the cluster's: b's too
            _settled(b_actor)
            image = httpclient.InferInput("image", [3, 784], "FP32")
            image.set_data_from_numpy(rows["flat"])
            clients.http(a.http_url).infer("mlp", [image], request_id="traced-rest")
            tensor = grpcclient.InferInput("image", [3, 784], "FP32")
            tensor.set_data_from_numpy(rows["flat"])
            clients.grpc(a.grpc_url).infer("mlp", [tensor], request_id="traced-grpc")
            tensors = []
            for name, array in rows.items():
                tensors.append(httpclient.InferInput(name, list(array.shape), "FP32"))
                tensors[-1].set_data_from_numpy(array)
            clients.http(a.http_url).infer("pipe", tensors, request_id="traced-dag")
        finally:
            clients.http(b.http_url).update_trace_settings(settings={"trace_level": ["OFF"]})
            _settled(a_actor)
    on_b, on_a = _traces(b, "b", 4), _traces(a, "a", 5)
    for request_id, frontend in (("traced-rest", "HTTP"), ("traced-grpc", "GRPC")):
        served = _one(on_b, request_id=request_id)
        sent = _one(on_a, trace_id=served["trace_id"], model_name="mlp")
        (forward,) = sent["forwards"]
        assert forward["holder"] == "b" and forward["span_id"] == served["parent_span_id"]
        assert f"{frontend}_SEND_END" in sent["stamps"] and f"{frontend}_SEND_END" in served["stamps"]
        assert "COMPUTE_START" in served["stamps"] and "COMPUTE_START" not in sent["stamps"]
    query = _one(on_a, request_id="traced-dag", model_name="pipe")
    stages = [trace for trace in on_a.values() if trace.get("parent_id") == query["id"]]
    assert sorted(stage["model_name"] for stage in stages) == ["cnn", "mlp"]
    for stage in stages:
        (forward,) = stage["forwards"]
        served = _one(on_b, parent_span_id=forward["span_id"])
        assert served["model_name"] == stage["model_name"] and served["trace_id"] == query["trace_id"]
    assert len(on_b) == 4  # the two requests and the two stages, each once: b does not sample what a forwards
