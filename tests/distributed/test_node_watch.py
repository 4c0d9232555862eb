"""A node server whose process lives but answers nothing is killed and started again, without Ray: the node actor
(`NodeServer`) runs over a real child process that speaks the control channel, which the test stops (SIGSTOP)."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys

import pytest

from adaserve import logs
from adaserve.distributed import node as node_module
from adaserve.distributed.control import Channel
from adaserve.distributed.messages import FromNode
from adaserve.distributed.node import NodeServer, NodeSettings, _Server
from tests.distributed.fakes import FakeController

#: A node server reduced to its control channel: it answers every `Report` with what it holds (nothing).
ANSWERING = """
import asyncio, socket, sys
from adaserve.distributed.control import Channel
from adaserve.distributed.messages import Report, Resident, ToNode

async def main():
    channel = await Channel.open(socket.socket(fileno=int(sys.argv[1])), ToNode)
    while (message := await channel.receive()) is not None:
        if isinstance(message, Report):
            channel.send(Resident({}))

asyncio.run(main())
"""


async def _answering_server(node: NodeServer) -> _Server:
    ours, theirs = socket.socketpair()
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-c", ANSWERING, str(theirs.fileno()), pass_fds=(theirs.fileno(),)
    )
    theirs.close()
    server = _Server(process, await Channel[FromNode].open(ours, FromNode))
    asyncio.get_running_loop().create_task(node._follow(server))
    await asyncio.wait_for(server.report(), 60)
    return server


def test_a_server_that_stops_answering_is_killed_started_again_and_reported_lost_with_why(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(logs, "configure_logging", lambda level: None)  # it would take the root logger from caplog
    monkeypatch.setattr(node_module, "PROBE_EVERY_S", 0.1)
    monkeypatch.setattr(node_module, "RESTART_BACKOFF_S", (0.1, 0.1))
    node = NodeServer("node-a", NodeSettings("/models", unresponsive_s=3.0), "controller", "ns", "info")
    controller = FakeController()
    monkeypatch.setattr(node, "_controller", lambda: controller)

    async def start_server(index: int, cpus: tuple[int, ...]) -> _Server:
        return await _answering_server(node)

    monkeypatch.setattr(node, "_start_server", start_server)

    async def scenario() -> None:
        await node.start()
        first = node._servers[0]
        await asyncio.sleep(4.0)  # answering: probed many times over, never killed
        assert first.process.returncode is None and not first.unresponsive
        assert controller.calls == []

        os.kill(first.process.pid, signal.SIGSTOP)
        assert await asyncio.wait_for(first.process.wait(), 60) == -signal.SIGKILL
        assert first.unresponsive
        while len(controller.calls) < 2:  # lost, then ready again with a fresh server
            await asyncio.sleep(0.1)
        assert controller.calls[0] == ("node_lost", ("node-a", "its server answered nothing for 3 s and was killed"))
        assert controller.calls[1][0] == "node_ready"
        fresh = node._servers[0]
        assert fresh is not first and fresh.process.returncode is None
        assert await asyncio.wait_for(fresh.report(), 60) == {}
        await node.stop()

    asyncio.run(scenario())


def test_the_setting_reaches_each_node_server_from_the_command_line() -> None:
    from adaserve.cli import build_parser
    from adaserve.distributed.cli import cluster_settings

    parser = build_parser("cluster")
    args = parser.parse_args(["cluster", "up", "--model-repository", "/models", "--node-unresponsive-s", "12.5"])
    assert cluster_settings(args, port_stride=10, host_from_ray=False).node.unresponsive_s == 12.5
    args = parser.parse_args(["cluster", "up", "--model-repository", "/models"])
    assert cluster_settings(args, port_stride=10, host_from_ray=False).node.unresponsive_s == 30.0
    with pytest.raises(SystemExit):
        parser.parse_args(["cluster", "up", "--model-repository", "/models", "--node-unresponsive-s", "0"])
