"""The engine's end of `--grpc-frontend process`: the relayed calls served on a Unix socket, and the frontend's
process (`server/grpc_frontend.py`) started, watched and stopped.

The socket lies in a directory of its own that only the server's user may enter (0700), not on the REST port: a
REST client cannot reach a gRPC-only path, nor a user of the machine a gRPC call past the gRPC port's TLS. The
frontend's process is started again whenever it ends while the server runs (logged); it is told to stop on the
server's stop and given the same grace as the REST frontend, and the socket is served until it has stopped, so the
calls in progress are answered. It logs as the server's log switches say (`adaserve.logs.SWITCHES`, which the
logging extension sets over either protocol): each process is written their settings, a JSON line on its stdin, as
it starts and after every change.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import shutil
import signal
import socket
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from adaserve.errors import ConfigError
from adaserve.logs import SWITCHES
from adaserve.server.grpc_frontend import FrontendSettings
from adaserve.server.grpc_relay import RelayedCall, relay_app
from adaserve.server.http import LISTEN_BACKLOG, HttpServer
from adaserve.server.limits import ClientLimits
from adaserve.server.rest import error_response
from adaserve.server.tls import TlsSettings

log = logging.getLogger("adaserve.grpc")

#: How long after it ended the frontend's process is started again, when starting it failed.
RESTART_DELAY_S = 1.0


class GrpcFrontendProcess:
    """The gRPC frontend in its own process, relaying every call to `calls` (`start`, then `stop`)."""

    def __init__(
        self,
        address: str,
        options: list[tuple[str, int]],
        tls: TlsSettings | None,
        calls: Mapping[str, RelayedCall],
        limits: ClientLimits,
    ) -> None:
        """`options`: the grpc.aio server's (`grpc_server_options`); `calls`: the relayed calls by RPC;
        `limits`: the socket's, as the REST frontend's."""
        self._directory = Path(tempfile.mkdtemp(prefix="adaserve-grpc-"))  # mkdtemp makes it 0700: a private one
        self.settings = FrontendSettings(address, str(self._directory / "engine.sock"), options, tls)
        self._http = HttpServer(relay_app(calls), on_error=error_response, limits=limits)
        self._process: asyncio.subprocess.Process | None = None
        self._watcher: asyncio.Task[None] | None = None

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    async def start(self) -> None:
        """Serve the socket, then start the frontend's process; ConfigError when it cannot listen."""
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.bind(self.settings.engine)
        sock.listen(LISTEN_BACKLOG)
        await self._http.start(sock)
        SWITCHES.listeners.append(self._send_log_settings)
        try:
            await self._spawn()
        except ConfigError:
            SWITCHES.listeners.remove(self._send_log_settings)
            await self._http.stop(grace_s=0)
            shutil.rmtree(self._directory, ignore_errors=True)
            raise
        self._watcher = asyncio.get_running_loop().create_task(self._watch())

    async def _spawn(self) -> None:
        """Start the frontend's process, with the log settings of now, and wait until it listens."""
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "adaserve.server.grpc_frontend",
            self.settings.to_json(),
            stdin=asyncio.subprocess.PIPE,  # log settings; closed when this process ends: the frontend's then stops
            stdout=asyncio.subprocess.PIPE,
            start_new_session=True,  # a terminal's Ctrl-C stops the server, which stops it, not it alone
        )
        self._process = process
        self._send_log_settings(SWITCHES.settings())  # no await since: a change from now on is sent to it
        assert process.stdout is not None
        if not await process.stdout.readline():  # it says a line once it listens
            await process.wait()
            raise ConfigError(f"cannot listen for gRPC on {self.settings.address}")
        log.debug("gRPC frontend started", extra={"pid": process.pid})

    def _send_log_settings(self, settings: dict[str, Any]) -> None:
        """Write the log settings to the frontend's process, unless it has ended (the next one starts with them)."""
        process = self._process
        if process is not None and process.returncode is None and process.stdin is not None:
            process.stdin.write(json.dumps(settings).encode() + b"\n")

    async def _watch(self) -> None:
        """Start the frontend's process again whenever it ends."""
        while True:
            assert self._process is not None
            returncode = await self._process.wait()
            log.warning(
                "the gRPC frontend's process ended: starting it again",
                extra={"pid": self._process.pid, "returncode": returncode},
            )
            try:
                await self._spawn()
            except ConfigError as exc:
                log.error("the gRPC frontend's process did not start", extra={"error": str(exc)})
                await asyncio.sleep(RESTART_DELAY_S)

    async def stop(self, grace: float) -> None:
        """Stop the frontend's process (SIGTERM: it finishes its calls within `grace` s), then the socket."""
        SWITCHES.listeners.remove(self._send_log_settings)
        if self._watcher is not None:
            self._watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watcher
        process = self._process
        if process is not None and process.returncode is None:
            process.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(process.wait(), grace + 1.0)
            except TimeoutError:
                process.kill()
                await process.wait()
        await self._http.stop(grace_s=grace)
        shutil.rmtree(self._directory, ignore_errors=True)
