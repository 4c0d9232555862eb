"""Two real node servers (`adaserve serve --cluster-control FD`) with this test as their node actor: it sends the
routing tables and load orders a controller would, over the same channel, and checks that a request for a model
held on the other node is forwarded there, its answer unchanged, over REST and gRPC (whose calls go to the holder's
endpoint for relayed calls, checked on its own too); that a model held nowhere is placed once for concurrent
requests; that a request caught by a dead node is sent again elsewhere, and one two nodes fail is answered naming
the node; and that a node server whose actor goes away stops. No Ray: the cluster's data path alone."""

from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from prometheus_client.core import Metric
from prometheus_client.parser import text_string_to_metric_families
from tritonclient.utils import InferenceServerException

from adaserve.distributed.member import HOPS, MAX_HOPS, PEER_TIMEOUT_S
from adaserve.distributed.messages import (
    Drain,
    Drained,
    NodeAddress,
    Place,
    Report,
    Requests,
    Resident,
    Routes,
    Unload,
    Unloaded,
)
from adaserve.distributed.routes import ASK_AGAIN_S
from adaserve.distributed.testing import FakeActor, node_server
from adaserve.server.documents import merge_statistics
from adaserve.server.grpc_relay import GRPC_PATH, METADATA_PREFIX
from adaserve.server.protos import grpc_service_pb2 as service_pb2
from tests.server_utils import Clients, ServerHandle, free_ports, link_example, running_server


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("cluster") / "models"
    root.mkdir()
    for name in ("mlp", "cnn"):
        link_example(root, name, workers=[{"batch": 1}, {"batch": 4}])
    return root


def _node(stack: ExitStack, repository: Path, name: str, *extra: str) -> tuple[ServerHandle, FakeActor]:
    starter = lambda args, fds: running_server(repository, *args, *extra, pass_fds=fds)  # noqa: E731
    return stack.enter_context(node_server(starter, name))


@pytest.fixture(scope="module")
def nodes(repository: Path) -> Iterator[dict[str, tuple[ServerHandle, FakeActor]]]:
    with ExitStack() as stack:
        started = {name: _node(stack, repository, name) for name in ("a", "b")}
        yield started


def _table(
    nodes: dict[str, tuple[ServerHandle, FakeActor]],
    version: int,
    replicas: dict[str, list[str]],
    to: str = "ab",
    members: str = "ab",
) -> None:
    """Send the routing table of the nodes named in `members` to those named in `to`."""
    addresses = {name: NodeAddress(handle.http_url, handle.grpc_url) for name, (handle, _) in nodes.items()}
    addresses = {name: address for name, address in addresses.items() if name in members}
    for name in to:
        nodes[name][1].send(Routes(version, addresses, replicas))


def _same(actual: np.ndarray, expected: np.ndarray) -> None:
    """Equal answers, up to what batching the rows differently changes (a few ulp)."""
    np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=1e-5)


def _image(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).random((3, 784), dtype=np.float32)


def _http_infer(url: str, model: str, image: np.ndarray, binary: bool = True) -> np.ndarray:
    with Clients() as clients:
        tensor = httpclient.InferInput("image", list(image.shape), "FP32")
        tensor.set_data_from_numpy(image, binary_data=binary)
        answer = clients.http(url).infer(model, [tensor])
        return answer.as_numpy("logits")


def _grpc_infer(url: str, model: str, image: np.ndarray) -> np.ndarray:
    with Clients() as clients:
        tensor = grpcclient.InferInput("image", list(image.shape), "FP32")
        tensor.set_data_from_numpy(image)
        return clients.grpc(url).infer(model, [tensor]).as_numpy("logits")


def test_forwarded_requests_are_answered_as_the_holder_answers(
    nodes: dict[str, tuple[ServerHandle, FakeActor]],
) -> None:
    (a, _), (b, b_actor) = nodes["a"], nodes["b"]
    loaded = b_actor.load("mlp")
    assert loaded.size_bytes > 0
    _table(nodes, 1, {"mlp": ["b"]})
    image = _image(0)
    direct = _http_infer(b.http_url, "mlp", image)
    _same(_http_infer(a.http_url, "mlp", image), direct)
    _same(_http_infer(a.http_url, "mlp", image, binary=False), direct)
    _same(_grpc_infer(a.grpc_url, "mlp", image), direct)
    with Clients() as clients:
        # metadata, config and statistics of a model held elsewhere come from its holder
        assert clients.http(a.http_url).get_model_metadata("mlp")["inputs"][0]["name"] == "image"
        assert clients.grpc(a.grpc_url).get_model_config("mlp").config.name == "mlp"
        stats = clients.http(a.http_url).get_inference_statistics("mlp")["model_stats"][0]
        assert stats["inference_stats"]["success"]["count"] >= 4  # counted on b, which served all four
        # a's index speaks for the cluster: mlp is ready, held on b; a itself holds nothing
        index = {row["name"]: row for row in clients.http(a.http_url).get_model_repository_index()}
        assert index["mlp"]["state"] == "READY" and index["mlp"]["reason"] == "held on 1 other node(s): b"
        assert index["cnn"]["state"] == "UNAVAILABLE"
        grpc_index = clients.grpc(a.grpc_url).get_model_repository_index(as_json=True)["models"]
        assert {row["name"]: row.get("state") for row in grpc_index}["mlp"] == "READY"
    metrics = urllib.request.urlopen(f"http://{a.http_url}/metrics", timeout=10).read().decode()
    # three inferences, then metadata and config (statistics are asked of every holder, not forwarded)
    assert 'adaserve_cluster_forwarded_requests_total{holder="b",model="mlp",node="a"} 5.0' in metrics
    assert 'adaserve_cluster_replicas{model="mlp",node="a"} 1.0' in metrics


def _relayed(url: str, rpc: str, raw: bytes, metadata: dict[str, str] | None = None) -> tuple[int, bytes]:
    """A call to node `url`'s endpoint for relayed gRPC calls, as a forwarding node makes it: status and body."""
    headers = {f"{METADATA_PREFIX}{key}": value for key, value in (metadata or {}).items()}
    sent = urllib.request.Request(f"http://{url}{GRPC_PATH}{rpc}", data=raw, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(sent, timeout=60) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as refused:
        return refused.code, refused.read()


def _infer_bytes(model: str, image: np.ndarray, name: str = "image") -> bytes:
    request = service_pb2.ModelInferRequest(model_name=model)
    request.inputs.add(name=name, datatype="FP32", shape=list(image.shape))
    request.raw_input_contents.append(image.tobytes())
    return bytes(request.SerializeToString())


def test_the_holder_answers_a_relayed_call_as_its_grpc_port_would(
    nodes: dict[str, tuple[ServerHandle, FakeActor]],
) -> None:
    """The endpoint a forwarding node sends gRPC calls to: the answer's bytes, or the call's status and message;
    the metadata it is sent with are the call's (here the hop count: a call forwarded twice is served where it
    lands, so `a`, which does not hold mlp, answers it not ready instead of forwarding it)."""
    (a, _), (b, _) = nodes["a"], nodes["b"]
    image = _image(3)
    status, raw = _relayed(b.http_url, "ModelInfer", _infer_bytes("mlp", image))
    assert status == 200
    answer = service_pb2.ModelInferResponse.FromString(raw)
    _same(
        np.frombuffer(answer.raw_output_contents[0], np.float32).reshape(3, -1), _http_infer(b.http_url, "mlp", image)
    )
    status, raw = _relayed(b.http_url, "ModelInfer", _infer_bytes("mlp", image, name="pixels"))
    refused = json.loads(raw)
    assert status == 500 and refused["grpc_status"] == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    assert "unknown input 'pixels'" in refused["error"]
    status, raw = _relayed(b.http_url, "ModelConfig", service_pb2.ModelConfigRequest(name="mlp").SerializeToString())
    assert status == 200 and service_pb2.ModelConfigResponse.FromString(raw).config.name == "mlp"
    assert _relayed(a.http_url, "ModelInfer", _infer_bytes("mlp", image))[0] == 200  # forwarded on to b
    status, raw = _relayed(a.http_url, "ModelInfer", _infer_bytes("mlp", image), {HOPS: str(MAX_HOPS)})
    assert status == 500 and json.loads(raw)["grpc_status"] == grpc.StatusCode.UNAVAILABLE.value[0]
    assert _relayed(b.http_url, "ServerLive", b"")[0] == 404  # only the calls that name a model are relayed


def _own_statistics(url: str, path: str = "/v2/models/stats") -> list[dict[str, Any]]:
    """What the node at `url` says of its own replicas (as another node asks it: a forwarded request)."""
    request = urllib.request.Request(f"http://{url}{path}", headers={HOPS: "1"})
    with urllib.request.urlopen(request, timeout=10) as answer:
        rows: list[dict[str, Any]] = json.load(answer)["model_stats"]
    return rows


def test_statistics_on_any_node_sum_every_replica(nodes: dict[str, tuple[ServerHandle, FakeActor]]) -> None:
    (a, a_actor), (b, _) = nodes["a"], nodes["b"]
    a_actor.load("mlp")
    _table(nodes, 2, {"mlp": ["a", "b"]})
    for seed in range(3):  # each node serves the requests it gets itself: it holds the model
        _http_infer(a.http_url, "mlp", _image(seed))
        _http_infer(b.http_url, "mlp", _image(seed))
    own = {name: _own_statistics(handle.http_url) for name, (handle, _) in nodes.items()}
    assert [row["name"] for row in own["a"]] == ["mlp"]
    expected = merge_statistics(own["a"] + own["b"])[0]
    assert expected["inference_count"] == own["a"][0]["inference_count"] + own["b"][0]["inference_count"]
    with Clients() as clients:
        for url in (a.http_url, b.http_url):
            assert clients.http(url).get_inference_statistics("mlp")["model_stats"] == [expected]
            assert clients.http(url).get_inference_statistics()["model_stats"] == [expected]
        answer = clients.grpc(a.grpc_url).get_inference_statistics("mlp", as_json=True)["model_stats"][0]
    assert int(answer["inference_count"]) == expected["inference_count"]
    assert int(answer["inference_stats"]["success"]["ns"]) == expected["inference_stats"]["success"]["ns"]
    a_actor.send(Unload("mlp"))
    assert a_actor.expect(Unloaded) == Unloaded("mlp")
    _table(nodes, 3, {"mlp": ["b"]})


def _families(url: str, path: str = "/metrics") -> list[Metric]:
    with urllib.request.urlopen(f"http://{url}{path}", timeout=30) as answer:
        return list(text_string_to_metric_families(answer.read().decode()))


def _series(families: list[Metric], node: str | None = None) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Each series (sample name, labels) → its value; only node `node`'s, if named."""
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in families
        for sample in family.samples
        if node is None or sample.labels.get("node") == node
    }


def test_the_cluster_metrics_of_any_node_hold_each_node_series_once(
    nodes: dict[str, tuple[ServerHandle, FakeActor]],
) -> None:
    """Both nodes serve mlp: `/metrics/cluster` of either holds each node's own series (its `/metrics`) once, with
    its name, and says both answered; `/metrics` stays the node's own."""
    (a, a_actor), (b, _) = nodes["a"], nodes["b"]
    a_actor.load("mlp")
    _table(nodes, 4, {"mlp": ["a", "b"]})
    for url in (a.http_url, b.http_url):
        _http_infer(url, "mlp", _image(4))
    own = {name: _series(_families(handle.http_url)) for name, (handle, _) in nodes.items()}
    assert all(dict(labels)["node"] == name for name, series in own.items() for _, labels in series)
    for handle, _ in nodes.values():
        families = _families(handle.http_url, "/metrics/cluster")
        names = [family.name for family in families]
        assert len(names) == len(set(names))  # one # HELP and # TYPE per family
        for node in nodes:
            assert _series(families, node).keys() - own[node].keys() == {
                ("adaserve_cluster_node_up", (("node", node),))
            }
            assert own[node].keys() <= _series(families, node).keys()
        success = {key: value for key, value in _series(families).items() if key[0].endswith("request_success_total")}
        assert sorted(dict(labels)["node"] for _, labels in success) == ["a", "b"] and all(success.values())
        assert {key: value for key, value in _series(families).items() if key[0].endswith("node_up")} == {
            ("adaserve_cluster_node_up", (("node", "a"),)): 1.0,
            ("adaserve_cluster_node_up", (("node", "b"),)): 1.0,
        }
    a_actor.send(Unload("mlp"))
    assert a_actor.expect(Unloaded) == Unloaded("mlp")
    _table(nodes, 5, {"mlp": ["b"]})


def test_a_node_drained_out_of_the_table_forwards_what_it_holds(
    nodes: dict[str, tuple[ServerHandle, FakeActor]],
) -> None:
    (a, a_actor), (b, b_actor) = nodes["a"], nodes["b"]
    a_actor.load("mlp")
    _table(nodes, 6, {"mlp": ["a"]}, members="a")  # b, which holds mlp too, is being drained
    b_actor.send(Report())
    b_actor.expect(Resident)  # answered after the table before it: b has it
    served_on_a = _own_statistics(a.http_url, "/v2/models/mlp/stats")[0]["inference_stats"]["success"]["count"]
    image = _image(5)
    _same(_http_infer(b.http_url, "mlp", image), _http_infer(a.http_url, "mlp", image))
    after = _own_statistics(a.http_url, "/v2/models/mlp/stats")[0]["inference_stats"]["success"]["count"]
    assert after == served_on_a + 2  # b forwarded its request to a
    b_actor.send(Drain(5.0))
    assert b_actor.expect(Drained) == Drained([])  # nothing was left to answer
    with Clients() as clients:
        assert not clients.http(b.http_url).is_server_ready()  # load balancers send it no more
    a_actor.send(Unload("mlp"))
    assert a_actor.expect(Unloaded) == Unloaded("mlp")
    _table(nodes, 7, {"mlp": ["b"]})


def test_a_forwarded_stream_is_answered_request_by_request(nodes: dict[str, tuple[ServerHandle, FakeActor]]) -> None:
    (a, _), (b, b_actor) = nodes["a"], nodes["b"]
    b_actor.send(Report())
    assert "mlp" in b_actor.expect(Resident).models  # type: ignore[union-attr]
    answers: queue.Queue[object] = queue.Queue()
    images = [_image(seed) for seed in range(5)]
    with Clients() as clients:
        client = clients.grpc(a.grpc_url)
        client.start_stream(callback=lambda result, error: answers.put(error or result))
        for index, image in enumerate(images):
            tensor = grpcclient.InferInput("image", list(image.shape), "FP32")
            tensor.set_data_from_numpy(image)
            client.async_stream_infer("mlp", [tensor], request_id=str(index))
        got = {}
        for _ in images:
            result = answers.get(timeout=60)
            assert isinstance(result, grpcclient.InferResult), result
            got[result.get_response().id] = result.as_numpy("logits")
        client.stop_stream()
    for index, image in enumerate(images):
        _same(got[str(index)], _http_infer(b.http_url, "mlp", image))


def test_bad_input_is_refused_by_the_holder_with_its_message(nodes: dict[str, tuple[ServerHandle, FakeActor]]) -> None:
    a, _ = nodes["a"]
    with Clients() as clients:
        wrong = httpclient.InferInput("pixels", [1, 784], "FP32")
        wrong.set_data_from_numpy(np.zeros((1, 784), dtype=np.float32))
        with pytest.raises(InferenceServerException, match="unknown input 'pixels'") as refused:
            clients.http(a.http_url).infer("mlp", [wrong])
        assert refused.value.status() == "400"
        wrong_grpc = grpcclient.InferInput("pixels", [1, 784], "FP32")
        wrong_grpc.set_data_from_numpy(np.zeros((1, 784), dtype=np.float32))
        with pytest.raises(InferenceServerException, match="unknown input 'pixels'") as refused:
            clients.grpc(a.grpc_url).infer("mlp", [wrong_grpc])
        assert refused.value.status() == "StatusCode.INVALID_ARGUMENT"
        with pytest.raises(InferenceServerException, match="unknown model 'nope'"):
            clients.http(a.http_url).infer("nope", [wrong])


def test_a_model_held_nowhere_is_placed_once_for_concurrent_requests(
    nodes: dict[str, tuple[ServerHandle, FakeActor]],
) -> None:
    (a, a_actor), (_, b_actor) = nodes["a"], nodes["b"]
    image = np.random.default_rng(1).random((2, 1, 28, 28), dtype=np.float32)

    def ask() -> np.ndarray:
        with Clients() as clients:
            tensor = httpclient.InferInput("image", list(image.shape), "FP32")
            tensor.set_data_from_numpy(image)
            return clients.http(a.http_url).infer("cnn", [tensor]).as_numpy("logits")

    with ThreadPoolExecutor(4) as pool:
        waiting = [pool.submit(ask) for _ in range(4)]
        place = a_actor.expect(Place)
        asked_at = time.monotonic()
        assert isinstance(place, Place) and place.model == "cnn" and place.avoid == [] and place.size_bytes > 0
        b_actor.load("cnn")
        _table(nodes, 8, {"mlp": ["b"], "cnn": ["b"]})
        answers = [future.result(timeout=120) for future in waiting]
    for answer in answers:
        _same(answer, answers[0])
    # one question for all four, asked again only every ASK_AGAIN_S while unanswered (the controller places a model
    # once however often it is asked); the four counted where they arrived, once (b, which served them, counts none)
    asked_again, counted = 0, 0
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:
        with contextlib.suppress(queue.Empty):
            report = a_actor.reports.get(timeout=0.2)
            asked_again += report == place
            counted += report.counts.get("cnn", 0) if isinstance(report, Requests) else 0
    assert asked_again <= (time.monotonic() - asked_at) / ASK_AGAIN_S
    assert counted == 4
    assert all(not (isinstance(r, Requests) and "cnn" in r.counts) for r in list(b_actor.reports.queue))


def test_a_request_caught_by_a_dead_node_is_sent_again_where_it_is_placed(
    nodes: dict[str, tuple[ServerHandle, FakeActor]],
) -> None:
    (a, a_actor), (b, b_actor) = nodes["a"], nodes["b"]
    b_actor.send(Unload("cnn"))
    assert b_actor.expect(Unloaded) == Unloaded("cnn")
    os.kill(b.pid, signal.SIGKILL)  # the table still sends mlp's requests to b
    a_actor.drain()
    image = _image(2)
    with ThreadPoolExecutor(2) as pool:
        answers = [
            pool.submit(_http_infer, a.http_url, "mlp", image),
            pool.submit(_grpc_infer, a.grpc_url, "mlp", image),
        ]
        place = a_actor.expect(Place)
        assert isinstance(place, Place) and place.model == "mlp" and place.avoid == ["b"]
        a_actor.load("mlp")
        _table(nodes, 9, {"mlp": ["a", "b"]}, to="a")
        served = [answer.result(timeout=120) for answer in answers]
    for answer in served:
        _same(answer, _http_infer(a.http_url, "mlp", image))


def test_a_request_two_nodes_fail_is_unavailable_naming_the_node(
    nodes: dict[str, tuple[ServerHandle, FakeActor]],
) -> None:
    """b is dead (the test before) and c never ran: a gRPC call and a REST request for cnn, which the table says
    both hold, are sent to one, then once more to the other, and answered UNAVAILABLE / 503 naming the second."""
    (a, _), (b, _) = nodes["a"], nodes["b"]
    closed = free_ports(1)[0]
    addresses = {
        "a": NodeAddress(a.http_url, a.grpc_url),
        "b": NodeAddress(b.http_url, b.grpc_url),
        "c": NodeAddress(f"127.0.0.1:{closed}", f"127.0.0.1:{closed}"),
    }
    nodes["a"][1].send(Routes(10, addresses, {"mlp": ["a"], "cnn": ["b", "c"]}))
    image = np.zeros((1, 1, 28, 28), dtype=np.float32)
    with pytest.raises(InferenceServerException, match="did not answer the forwarded request") as failed:
        _grpc_infer(a.grpc_url, "cnn", image)
    assert failed.value.status() == "StatusCode.UNAVAILABLE"
    assert any(address.http in str(failed.value) for name, address in addresses.items() if name != "a")
    with pytest.raises(InferenceServerException, match="did not answer the forwarded request") as failed:
        _http_infer(a.http_url, "cnn", image)
    assert failed.value.status() == "503"
    metrics = urllib.request.urlopen(f"http://{a.http_url}/metrics", timeout=10).read().decode()
    assert 'adaserve_cluster_forward_retries_total{model="cnn",node="a"} 2.0' in metrics


def test_statistics_leave_out_a_node_that_does_not_answer(nodes: dict[str, tuple[ServerHandle, FakeActor]]) -> None:
    a, _ = nodes["a"]  # b is dead (the tests before); the table still names it
    _table(nodes, 11, {"mlp": ["a", "b"], "cnn": ["b"]}, to="a")
    with Clients() as clients:
        rows = clients.http(a.http_url).get_inference_statistics("mlp")["model_stats"]
        assert rows == _own_statistics(a.http_url, "/v2/models/mlp/stats")  # a's own, b left out (logged)
        with pytest.raises(InferenceServerException, match="no node answered for the statistics: node ") as refused:
            clients.http(a.http_url).get_inference_statistics("cnn")
        assert refused.value.status() == "503"


def test_the_cluster_metrics_leave_out_a_node_that_does_not_answer(
    nodes: dict[str, tuple[ServerHandle, FakeActor]],
) -> None:
    """b is dead (the tests before) and c takes connections but never answers: a's `/metrics/cluster` holds its own
    series and names both, 0, after PEER_TIMEOUT_S, in its log too."""
    (a, _), (b, _) = nodes["a"], nodes["b"]
    with socket.create_server(("127.0.0.1", 0)) as silent:
        c = f"127.0.0.1:{silent.getsockname()[1]}"
        addresses = {"a": NodeAddress(a.http_url, a.grpc_url), "b": NodeAddress(b.http_url, b.grpc_url)}
        nodes["a"][1].send(Routes(12, {**addresses, "c": NodeAddress(c, c)}, {"mlp": ["a"]}))
        started = time.monotonic()
        families = _families(a.http_url, "/metrics/cluster")
    assert PEER_TIMEOUT_S <= time.monotonic() - started < PEER_TIMEOUT_S + 10
    up = {dict(labels)["node"]: value for (name, labels), value in _series(families).items() if name.endswith("up")}
    assert up == {"a": 1.0, "b": 0.0, "c": 0.0}
    assert {dict(labels)["node"] for name, labels in _series(families) if not name.endswith("up")} == {"a"}
    warning = [line for line in a.log.read_text().splitlines() if "metrics without some nodes" in line][-1]
    assert "did not answer within" in warning and "cannot connect" in warning


def test_a_node_server_whose_actor_is_gone_stops(repository: Path) -> None:
    with ExitStack() as stack:
        handle, actor = _node(stack, repository, "c")
        actor.close()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                os.kill(handle.pid, 0)
            except ProcessLookupError:
                break
            if _exited(handle.pid):
                break
            time.sleep(0.2)
        else:
            pytest.fail("the node server kept running without its actor")


def _exited(pid: int) -> bool:
    try:
        finished, _ = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return True
    return finished == pid


#: Inference, statistics and metrics restricted on both nodes, as a cluster's nodes all run with the same flags.
RESTRICTED = ("--restricted-api", "inference,statistics,metrics:admin-key=s3cret")


def test_restricted_apis_are_forwarded_with_their_header(repository: Path) -> None:
    """A client's restricted request is checked where it arrives, then reaches the holder with the category's header
    (the client's own travels no further than that node); a node's own questions to the others (statistics, the
    cluster's metrics) carry it too. Without the header the first node refuses it, before anything is forwarded."""
    key = {"admin-key": "s3cret"}

    def node(stack: ExitStack, name: str) -> tuple[ServerHandle, FakeActor]:
        start = lambda args, fds: running_server(repository, *RESTRICTED, *args, pass_fds=fds)  # noqa: E731
        return stack.enter_context(node_server(start, name))

    with ExitStack() as stack, Clients() as clients:
        pair = {name: node(stack, name) for name in ("r", "s")}
        (r, _), (s, s_actor) = pair["r"], pair["s"]
        s_actor.load("mlp")
        _table(pair, 1, {"mlp": ["s"]}, to="rs", members="rs")
        image = _image(9)
        tensor = httpclient.InferInput("image", list(image.shape), "FP32")
        tensor.set_data_from_numpy(image)
        client = clients.http(r.http_url)
        _same(client.infer("mlp", [tensor], headers=key).as_numpy("logits"), _http_infer_on(clients, s, image, key))
        with pytest.raises(InferenceServerException, match="expecting header 'admin-key'"):
            client.infer("mlp", [tensor])
        rows = client.get_inference_statistics("mlp", headers=key)["model_stats"]
        assert rows[0]["inference_stats"]["success"]["count"] == 2  # both requests s served, one forwarded
        request = urllib.request.Request(f"http://{r.http_url}/metrics/cluster", headers=key)
        with urllib.request.urlopen(request, timeout=30) as answer:
            families = list(text_string_to_metric_families(answer.read().decode()))
        up = {dict(labels)["node"]: value for (name, labels), value in _series(families).items() if "node_up" in name}
        assert up == {"r": 1.0, "s": 1.0}


def _http_infer_on(clients: Clients, handle: ServerHandle, image: np.ndarray, headers: dict[str, str]) -> np.ndarray:
    tensor = httpclient.InferInput("image", list(image.shape), "FP32")
    tensor.set_data_from_numpy(image)
    return clients.http(handle.http_url).infer("mlp", [tensor], headers=headers).as_numpy("logits")
