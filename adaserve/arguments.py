"""Value types for the command line's options that more than one subcommand takes: each turns the text into the
value or gives argparse a message that names what was expected (argparse prefixes the option)."""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

__all__ = [
    "CLUSTER_TRACE_FILE",
    "DEFAULT_GRPC_PORT",
    "DEFAULT_HOST",
    "DEFAULT_HTTP_PORT",
    "EXAMPLE_REPOSITORY",
    "PROCESS_FRONTEND_CORES",
    "InputFile",
    "add_grpc_frontend",
    "add_model_repository",
    "add_trace_config",
    "add_url_argument",
    "input_file",
    "positive_integer",
    "positive_number",
    "server_url",
]

#: Where `adaserve serve` listens unless told otherwise, and so where the client commands look for it.
DEFAULT_HOST = "127.0.0.1"
DEFAULT_HTTP_PORT = 8000
DEFAULT_GRPC_PORT = 8001
#: `serve --grpc-frontend auto` puts gRPC in a process of its own where the server may use at least this many cores,
#: and on the engine's event loop below (`adaserve.server.grpc_frontend`).
PROCESS_FRONTEND_CORES = 4
#: The example repository shipped in the source tree; `adaserve serve` with no arguments serves it.
EXAMPLE_REPOSITORY = Path(__file__).resolve().parent.parent / "examples" / "models"


def add_model_repository(parser: argparse.ArgumentParser) -> None:
    """`--model-repository DIR`, the example repository unless given."""
    parser.add_argument(
        "--model-repository",
        type=Path,
        default=EXAMPLE_REPOSITORY,
        metavar="DIR",
        help="the model repository: a folder per model or DAG query (default: the example repository, examples/models)",
    )


#: What `--trace-config`'s file must say on a cluster (`adaserve.distributed.cli.cluster_settings` checks it).
CLUSTER_TRACE_FILE = (
    "; on a cluster whose node servers share a machine (cluster up; --servers-per-node above 1), the file's path "
    "must hold {node}, which each node server replaces by its name"
)


def add_trace_config(parser: argparse.ArgumentParser, file_note: str = "") -> None:
    """Triton's `--trace-config` (`adaserve.server.trace.tracer_from_config`); `file_note`: what else the file's
    path must say (on a cluster)."""
    parser.add_argument(
        "--trace-config",
        action="append",
        default=[],
        metavar="[triton,]SETTING=VALUE",
        help="Triton's: trace sampled requests' timestamps (and tensors) into a file, e.g. --trace-config "
        "triton,file=/tmp/trace.json --trace-config level=TIMESTAMPS --trace-config rate=100 (settings level, rate, "
        "count, mode, and triton,file and triton,log-frequency); the trace API changes all but the file at run "
        f"time{file_note}",
    )


def add_grpc_frontend(parser: argparse.ArgumentParser, whose: str) -> None:
    """`--grpc-frontend inline|process|auto` (`adaserve.server.grpc_frontend`); `whose`: the servers it sets."""
    parser.add_argument(
        "--grpc-frontend",
        choices=("inline", "process", "auto"),
        default="auto",
        help=f"where {whose} gRPC frontend runs: inline, on the engine's event loop; process, in a process of its "
        "own that relays each call to the engine over a Unix socket (grpc.aio no longer shares the engine's GIL); "
        f"auto (the default), process where a server may use {PROCESS_FRONTEND_CORES} or more cores, else inline",
    )


def positive_integer(text: str) -> int:
    """A count: a whole number, 1 or more."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number above 0; got {text!r}")
    return value


def positive_number(text: str) -> float:
    """An amount such as seconds or megabytes: a finite number above 0."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 < value < math.inf:
        raise argparse.ArgumentTypeError(f"expected a number above 0; got {text!r}")
    return value


@dataclass(frozen=True)
class InputFile:
    """`--input NAME=FILE.npy`: the array in FILE for the input NAME; `--input FILE.npy` (no name) for the model's
    only input."""

    name: str | None
    path: Path


def input_file(text: str) -> InputFile:
    """`--input`: NAME=FILE.npy, or FILE.npy alone."""
    name, sep, path = text.partition("=")
    if not sep:
        return InputFile(None, Path(text))
    if not name or not path:
        raise argparse.ArgumentTypeError(f"expected NAME=FILE.npy (or FILE.npy for a model's only input); got {text!r}")
    return InputFile(name, Path(path))


def add_url_argument(parser: argparse.ArgumentParser | argparse._ArgumentGroup, what: str) -> None:
    """`--url` of a client command (`infer`, `bench`); `server_url` reads it."""
    parser.add_argument(
        "--url",
        help=f"{what} (default: where `adaserve serve` listens by default, {DEFAULT_HOST}:{DEFAULT_HTTP_PORT} over "
        f"HTTP, {DEFAULT_HOST}:{DEFAULT_GRPC_PORT} over gRPC)",
    )


def server_url(url: str | None, protocol: Literal["http", "grpc"] = "http") -> str:
    """`--url`, or the address `adaserve serve` listens on by default for `protocol`."""
    if url:
        return url
    return f"{DEFAULT_HOST}:{DEFAULT_HTTP_PORT if protocol == 'http' else DEFAULT_GRPC_PORT}"
