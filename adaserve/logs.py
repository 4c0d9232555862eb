"""Structured logs: one JSON object a line on stderr, with the `extra=` fields of each call."""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Callable
from typing import Any

from adaserve.errors import InvalidInputError

_STANDARD = set(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {"message", "asctime", "taskName"}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        document = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        document.update({k: v for k, v in record.__dict__.items() if k not in _STANDARD})
        if record.exc_info:
            document["exception"] = self.formatException(record.exc_info)
        return json.dumps(document, default=str)


class CallAlreadyEnded(logging.Filter):
    """grpcio's asyncio server logs an error, with a traceback, when it cannot send an answer because the call has
    ended already: the client cancelled it or its deadline passed as the answer left (grpc/grpc#32551). In a
    soak of clients with millisecond deadlines, 3 calls in 60 s. The client's doing, not a fault to page anyone
    for: it is kept, at info, saying what it means."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if record.levelno == logging.ERROR and message.startswith("ExecuteBatchError raised in core by servicer"):
            record.levelno, record.levelname = logging.INFO, "INFO"
            record.msg = (
                f"an answer was not sent: its call had ended (cancelled by the client, or past its deadline): {message}"
            )
            record.args, record.exc_info, record.exc_text = (), None, None
            return logging.getLogger().isEnabledFor(logging.INFO)  # the level it has now, not the one it came with
        return True


class LevelSwitches(logging.Filter):
    """Triton's log switches, which its logging extension reads and sets while the server runs (`GET/POST
    /v2/logging`, gRPC `LogSettings`): info, warning and error each on or off, and a verbose level (above 0: debug
    lines too). A filter on the handler, so any combination holds; the root logger's level follows the lowest
    switch that is on, so lines nobody wants are not even made. It governs the server process, and each of its
    `listeners` is told the settings after every change (the gRPC frontend's process follows them so); a model's
    host processes log at the level they started with."""

    def __init__(self) -> None:
        super().__init__()
        self.info = self.warning = self.error = True  # info and above, as `serve --log-level info`; the root
        self.verbose = 0  # logger is left alone until `set_level` or `update`: importing this must not change it
        self.listeners: list[Callable[[dict[str, Any]], None]] = []

    def set_level(self, level: int) -> None:
        """Every switch from a level: those at or above it on."""
        self.info, self.warning, self.error = level <= logging.INFO, level <= logging.WARNING, level <= logging.ERROR
        self.verbose = int(level <= logging.DEBUG)
        self._apply()

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.ERROR:
            return self.error
        if record.levelno >= logging.WARNING:
            return self.warning
        if record.levelno >= logging.INFO:
            return self.info
        return self.verbose > 0

    def settings(self) -> dict[str, Any]:
        """The switches under Triton's names. Logs go to stderr as JSON lines: no file, one format."""
        return {
            "log_file": "",
            "log_info": self.info,
            "log_warning": self.warning,
            "log_error": self.error,
            "log_verbose_level": self.verbose,
            "log_format": "default",
        }

    def update(self, changes: dict[str, Any]) -> dict[str, Any]:
        """Set the switches named in `changes` (Triton's names), all or none: InvalidInputError naming the first
        that is unknown or of the wrong kind. Returns every setting after."""
        known = self.settings()
        for name, value in changes.items():
            if name not in known:
                raise InvalidInputError(f"unknown log setting '{name}'; the settings are {', '.join(known)}")
            if name in ("log_info", "log_warning", "log_error") and not isinstance(value, bool):
                raise InvalidInputError(f"log setting '{name}' must be true or false, got {value!r}")
            if name == "log_verbose_level" and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
                raise InvalidInputError(f"log setting 'log_verbose_level' must be a whole number >= 0, got {value!r}")
            if name == "log_file" and value != "":
                raise InvalidInputError("log setting 'log_file': logs go to stderr here; only '' is accepted")
            if name == "log_format" and value != "default":
                raise InvalidInputError("log setting 'log_format': one format here (JSON lines); only 'default'")
        self.info = changes.get("log_info", self.info)
        self.warning = changes.get("log_warning", self.warning)
        self.error = changes.get("log_error", self.error)
        self.verbose = changes.get("log_verbose_level", self.verbose)
        self._apply()
        return self.settings()

    def _apply(self) -> None:
        """The root logger's level from the switches; each listener told the settings."""
        switched_on = [
            level
            for level, on in (
                (logging.DEBUG, self.verbose > 0),
                (logging.INFO, self.info),
                (logging.WARNING, self.warning),
                (logging.ERROR, self.error),
            )
            if on
        ]
        logging.getLogger().setLevel(min(switched_on, default=logging.CRITICAL + 1))
        for listener in self.listeners:
            listener(self.settings())


#: The server process's switches: `configure_logging` puts them on its handler, the logging extension sets them.
SWITCHES = LevelSwitches()


def configure_logging(level: str = "info") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    handler.addFilter(SWITCHES)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    SWITCHES.set_level(logging.getLevelName(level.upper()))
    grpc_core = logging.getLogger("grpc._cython.cygrpc")
    if not any(isinstance(f, CallAlreadyEnded) for f in grpc_core.filters):
        grpc_core.addFilter(CallAlreadyEnded())
