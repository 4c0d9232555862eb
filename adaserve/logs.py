"""Structured logs: one JSON object a line on stderr, with the `extra=` fields of each call."""

from __future__ import annotations

import json
import logging
import sys
import time

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


def configure_logging(level: str = "info") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    grpc_core = logging.getLogger("grpc._cython.cygrpc")
    if not any(isinstance(f, CallAlreadyEnded) for f in grpc_core.filters):
        grpc_core.addFilter(CallAlreadyEnded())
