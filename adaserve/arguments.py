"""Value types for the command line's options that more than one subcommand takes: each turns the text into the
value or gives argparse a message that names what was expected (argparse prefixes the option)."""

from __future__ import annotations

import argparse
import math
from pathlib import Path

__all__ = ["EXAMPLE_REPOSITORY", "add_model_repository", "positive_integer", "positive_number"]

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
