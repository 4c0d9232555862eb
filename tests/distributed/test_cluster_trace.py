"""The cluster's trace settings without Ray: a node server (`adaserve serve --cluster-control FD`) with this test as
its node actor and controller, whose trace setting requests go up as `TraceChange` and take effect when the
cluster's settings come down (`Tracing`); the controller's part, which applies each change to the cluster's
settings, names the nodes that did not confirm them and sends them again until they do; and `serve --ray` handing
its `--trace-config` on."""

from __future__ import annotations

import asyncio
import json
import queue
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from adaserve.cli import build_parser
from adaserve.distributed import trace_settings
from adaserve.distributed.cli import cluster_settings
from adaserve.distributed.controller import ClusterSettings, Controller
from adaserve.distributed.messages import (
    NodeAddress,
    Report,
    Requests,
    Resident,
    TraceChange,
    TraceChanged,
    TraceCountLeft,
    TraceCountRead,
    Traced,
    TraceGive,
    TraceShare,
    TraceShareLeft,
    Tracing,
)
from adaserve.distributed.node import NodeSettings, server_arguments
from adaserve.distributed.state import DeploymentState
from adaserve.distributed.testing import FakeActor, node_server
from adaserve.distributed.trace_settings import ClusterTracing, split
from adaserve.errors import ConfigError
from adaserve.server.trace import TraceFile, Tracer
from adaserve.server.trace_state import TraceSettings, TraceState
from tests.distributed.fakes import FakeNode, MemoryKeyValue, started
from tests.server_utils import ServerHandle, link_example, running_server


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerHandle, FakeActor]]:
    root = tmp_path_factory.mktemp("cluster-trace")
    repository = root / "models"
    repository.mkdir()
    link_example(repository, "mlp", workers=[{"batch": 1}])
    trace = ("--trace-config", f"triton,file={root / 'trace.json'}")
    with ExitStack() as stack:
        starter = lambda args, fds: running_server(repository, *args, *trace, pass_fds=fds)  # noqa: E731
        yield stack.enter_context(node_server(starter, "a"))


def _post(handle: ServerHandle, path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    request = urllib.request.Request(f"http://{handle.http_url}{path}", json.dumps(body).encode(), method="POST")
    try:
        with urllib.request.urlopen(request, timeout=60) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as refused:
        return refused.code, json.loads(refused.read())


def _get(handle: ServerHandle, path: str = "/v2/trace/setting") -> dict[str, Any]:
    with urllib.request.urlopen(f"http://{handle.http_url}{path}", timeout=60) as answer:
        return json.loads(answer.read())  # type: ignore[no-any-return]


def _in_thread(call: Callable[[], Any]) -> queue.Queue[Any]:
    """Run `call` (a request that waits for the controller's answer) while the test answers as the controller."""
    outcome: queue.Queue[Any] = queue.Queue()

    def run() -> None:
        try:
            outcome.put(call())
        except Exception as exc:
            outcome.put(exc)

    threading.Thread(target=run, daemon=True).start()
    return outcome


def _answer_as_the_controller(actor: FakeActor, version: int, missing: dict[str, str]) -> TraceChange:
    """Take the node's change, send it the cluster's settings after it (checking it confirms), then the answer."""
    change = actor.expect(TraceChange)
    assert isinstance(change, TraceChange)
    actor.send(Tracing(version, change.current.changed(change.initial, change.model, change.changes)))
    assert actor.expect(Traced) == Traced(version)
    actor.send(TraceChanged(change.ask, missing))
    return change


def test_a_change_made_on_a_node_takes_effect_as_the_clusters(node: tuple[ServerHandle, FakeActor]) -> None:
    handle, actor = node
    posting = _in_thread(lambda: _post(handle, "/v2/trace/setting", {"trace_rate": "7"}))
    change = _answer_as_the_controller(actor, 10, {})
    assert (change.model, change.changes, change.initial) == ("", {"trace_rate": ["7"]}, TraceSettings())
    status, settings = posting.get(timeout=60)
    assert status == 200 and settings["trace_rate"] == "7"
    assert _get(handle)["trace_rate"] == "7"
    # older settings (a message overtaken by a newer change) are confirmed but not taken
    actor.send(Tracing(9, TraceState(TraceSettings(rate=99))))
    assert actor.expect(Traced) == Traced(9)
    assert _get(handle)["trace_rate"] == "7"


def test_a_bad_change_is_refused_on_the_node_before_the_cluster_hears_of_it(
    node: tuple[ServerHandle, FakeActor],
) -> None:
    handle, actor = node
    actor.drain()
    status, answer = _post(handle, "/v2/trace/setting", {"trace_rate": "0"})
    assert status == 400 and "trace setting 'trace_rate' must be at least 1, got 0" in answer["error"]
    status, answer = _post(handle, "/v2/models/nope/trace/setting", {"trace_rate": "5"})
    assert status == 404 and answer["error"] == "unknown model 'nope'"
    actor.send(Report())  # its answer comes after anything the request sent up: a TraceChange fails `expect`
    actor.expect(Resident)


def test_a_change_some_nodes_did_not_confirm_is_unavailable_naming_them(
    node: tuple[ServerHandle, FakeActor],
) -> None:
    handle, actor = node
    missing = {"b7": "no answer within 10 s"}

    def set_over_grpc() -> Any:
        client = grpcclient.InferenceServerClient(handle.grpc_url)
        try:
            return client.update_trace_settings("mlp", {"trace_level": ["TIMESTAMPS"]}, client_timeout=60)
        finally:
            client.close()

    setting = _in_thread(set_over_grpc)
    change = _answer_as_the_controller(actor, 20, missing)
    assert (change.model, change.changes) == ("mlp", {"trace_level": ["TIMESTAMPS"]})
    refused = setting.get(timeout=60)
    assert isinstance(refused, InferenceServerException) and refused.status() == "StatusCode.UNAVAILABLE"
    assert "1 node(s) did not confirm them (b7: no answer within 10 s)" in str(refused.message())
    assert _get(handle, "/v2/models/mlp/trace/setting")["trace_level"] == ["TIMESTAMPS"]  # taken here all the same
    assert _get(handle)["trace_level"] == ["OFF"]


def test_a_node_counts_its_share_of_the_count_and_reads_the_clusters(node: tuple[ServerHandle, FakeActor]) -> None:
    handle, actor = node
    actor.drain()
    state = TraceState(TraceSettings()).changed(TraceSettings(), "", {"trace_count": ["5"]})
    serial = state.recounted("")
    actor.send(Tracing(30, state, {"": 2}))
    assert actor.expect(Traced) == Traced(30)
    reading = _in_thread(lambda: _get(handle))
    read = actor.expect(TraceCountRead)
    assert isinstance(read, TraceCountRead) and read.scope == ""
    actor.send(TraceCountLeft(read.ask, 7))  # what the controller says the nodes have left, together
    assert reading.get(timeout=60)["trace_count"] == "7"
    actor.send(TraceShare(1, "", serial, take=True))
    assert actor.expect(TraceShareLeft) == TraceShareLeft(1, 2)  # its share, given back
    actor.send(TraceGive("", serial, 3))
    actor.send(TraceGive("", serial - 1, 50))  # for an older count: not taken
    actor.send(TraceShare(2, "", serial))
    assert actor.expect(TraceShareLeft) == TraceShareLeft(2, 3)
    actor.send(Tracing(40, state.changed(TraceSettings(), "", {"trace_count": None})))  # no limit again
    assert actor.expect(Traced) == Traced(40)
    assert _get(handle)["trace_count"] == "-1"  # no limit: read here, not asked of the cluster


def test_a_trace_count_is_the_clusters_handed_on_to_the_nodes_that_want_traces(tmp_path: Path) -> None:
    """Ten traces asked of three nodes: split 4/3/3; a node whose share ran out with requests still due a trace
    gets what the others have left, until the cluster has taken ten in all."""
    controller = Controller(ClusterSettings(NodeSettings("/models")), "test", MemoryKeyValue())
    on = TraceSettings(level=("TIMESTAMPS",), rate=1)
    tracers = {name: Tracer(on, TraceFile(tmp_path / name)) for name in "abc"}
    nodes = {name: FakeNode(tracer=tracer) for name, tracer in tracers.items()}
    change = TraceChange(1, "", {"trace_count": ["10"]}, on, TraceState(on))

    def traced(name: str, requests: int) -> int:
        tracer = tracers[name]
        taken = [trace for trace in (tracer.begin("mlp", "") for _ in range(requests)) if trace is not None]
        for trace in taken:
            tracer.finish(trace)
        return len(taken)

    def counts() -> list[str]:
        return [tracer.settings()["trace_count"] for tracer in tracers.values()]

    async def reports(name: str) -> None:  # the node's next report, and the hand-on it starts
        controller._take_report(name, Requests({}, traces_wanted=tracers[name].wanting()), time.monotonic())
        await asyncio.gather(*list(controller.tracing._handing_on.values()))

    async def scenario() -> None:
        started(controller)
        for name, node in nodes.items():
            controller._join(name, node, NodeAddress(f"{name}:8000", f"{name}:8001"), 1, {}, 100)
        assert await controller.change_trace("a", change) == {}
        assert counts() == ["4", "3", "3"] and await controller.trace_left("") == 10
        assert (traced("a", 6), traced("b", 1)) == (4, 1)  # a's share used up, two requests due a trace untraced
        await reports("b")  # b's share lasts: it wants none
        assert counts() == ["0", "2", "3"]
        await reports("a")  # a is handed what b and c have left
        assert counts() == ["5", "0", "0"] and await controller.trace_left("") == 5
        assert (traced("b", 3), traced("a", 8)) == (0, 5)
        await reports("b")  # b wants some now, and none is left
        assert counts() == ["0", "0", "0"] and await controller.trace_left("") == 0
        await reports("a")  # nothing asked of the nodes for a count used up
        assert all(len(node.got) == 1 for node in nodes.values())

    asyncio.run(scenario())
    for tracer in tracers.values():
        tracer.close()
    assert sum(len(json.loads((tmp_path / name).read_text())) for name in tracers) == 10  # a head entry each


def test_a_count_is_split_as_evenly_as_can_be() -> None:
    assert (split(10, 3), split(2, 3), split(0, 2), split(5, 1)) == ([4, 3, 3], [1, 1, 0], [0, 0], [5])


def test_the_controller_names_each_node_that_did_not_confirm(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(trace_settings, "CONFIRM_TIMEOUT_S", 0.05)
    answers = {"a": "", "b": "trace mode triton does not record trace_level ['TENSORS']", "c": None}
    nodes = {name: FakeNode(answer) for name, answer in answers.items()}
    nodes["d"] = FakeNode(ConnectionError("The actor died unexpectedly before finishing this task.\n\tclass_name: X"))
    cluster = ClusterTracing(DeploymentState("test", MemoryKeyValue()), nodes)
    tracing = Tracing(1, TraceState(TraceSettings(rate=3)))
    missing = asyncio.run(cluster.send(tracing, list(nodes)))
    assert missing == {
        "b": "trace mode triton does not record trace_level ['TENSORS']",
        "c": "no answer within 0.05 s",
        "d": "The actor died unexpectedly before finishing this task.",
    }
    assert all(handle.got == [tracing] for handle in nodes.values())


def test_the_controller_applies_each_change_to_the_clusters_settings() -> None:
    initial = TraceSettings(rate=100)
    behind = TraceState(initial)  # what a node that has not taken the first change yet says it has
    first = trace_settings.changed(None, TraceChange(1, "", {"trace_rate": ["5"]}, initial, behind))
    second = trace_settings.changed(first, TraceChange(1, "mlp", {"trace_count": ["2"]}, initial, behind))
    assert second.version > first.version
    assert second.state.of("") == TraceSettings(rate=5)  # the first change kept: built on the cluster's settings
    assert second.state.of("mlp") == TraceSettings(rate=5, count=2)


def test_a_node_that_missed_a_change_is_sent_it_again_until_it_confirms(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(trace_settings, "CONFIRM_TIMEOUT_S", 0.05)
    controller = Controller(ClusterSettings(NodeSettings("/models")), "test", MemoryKeyValue())
    cannot = "trace mode triton does not record trace_level ['TENSORS']"
    nodes = {"a": FakeNode(""), "b": FakeNode(None), "c": FakeNode(cannot)}  # b does not answer in time
    change = TraceChange(1, "", {"trace_rate": ["5"]}, TraceSettings(), TraceState(TraceSettings()))

    async def catch_up() -> None:
        controller.tracing.catch_up()
        await controller.tracing.caught_up()

    async def scenario() -> None:
        started(controller)
        for name, handle in nodes.items():
            controller._join(name, handle, NodeAddress(f"{name}:8000", f"{name}:8001"), 1, {}, 100)
        assert await controller.change_trace("a", change) == {"b": "no answer within 0.05 s", "c": cannot}
        tracing = controller.tracing.current
        assert tracing is not None and tracing.state.of("").rate == 5
        await catch_up()  # b is sent them again, and still does not answer; c said it cannot: not sent again
        nodes["b"].answer = ""
        await catch_up()  # now b confirms
        assert controller.tracing.confirmed == dict.fromkeys(nodes, tracing.version)
        controller.tracing.catch_up()  # nobody behind: nothing sent
        assert [len(handle.got) for handle in nodes.values()] == [1, 3, 1]
        assert all(got == tracing for handle in nodes.values() for got in handle.got)

    asyncio.run(scenario())


def test_serve_ray_starts_every_node_server_with_its_trace_config(tmp_path: Path) -> None:
    trace = ["--trace-config", "triton,file=/tmp/trace.json", "--trace-config", "level=TIMESTAMPS"]
    command = ["serve", "--ray", "head:6379", "--model-repository", str(tmp_path), *trace]
    args = build_parser("serve").parse_args(command)
    settings = cluster_settings(args, port_stride=0, host_from_ray=True)
    assert settings.node.serve_args[-2:] == (
        "--trace-config=triton,file=/tmp/trace.json",
        "--trace-config=level=TIMESTAMPS",
    )
    assert build_parser("serve").parse_args(["serve", *settings.node.serve_args]).trace_config == trace[1::2]


def test_cluster_up_refuses_one_trace_file_for_its_node_servers(tmp_path: Path) -> None:
    args = build_parser("cluster").parse_args(
        ["cluster", "up", "--nodes", "2", "--model-repository", str(tmp_path), "--trace-config", "triton,file=/t.json"]
    )
    with pytest.raises(ConfigError, match=r"2 node servers share this machine .*put \{node\} in its path"):
        cluster_settings(args, port_stride=10, host_from_ray=False, nodes_here=2)


@pytest.mark.parametrize(("servers", "names"), [(1, ["node-a"]), (2, ["node-a-0", "node-a-1"])])
def test_each_node_server_writes_the_trace_file_named_for_it(tmp_path: Path, servers: int, names: list[str]) -> None:
    command = ["cluster", "up", "--nodes", "2", "--model-repository", str(tmp_path)]
    command += ["--servers-per-node", str(servers), "--trace-config", "triton,file=/tmp/trace-{node}.json"]
    settings = cluster_settings(build_parser("cluster").parse_args(command), port_stride=10, host_from_ray=False)
    node = settings.node_settings(1, "127.0.0.1")  # the second node's, as the controller starts it
    assert (node.servers, node.http_port, node.grpc_port) == (servers, 8010, 8011)
    files = [server_arguments(node, "node-a", index)[-1] for index in range(servers)]
    assert files == [f"--trace-config=triton,file=/tmp/trace-{name}.json" for name in names]
