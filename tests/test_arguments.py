"""The option value types the subcommands share."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from adaserve.arguments import InputFile, input_file, positive_integer, positive_number, server_url


@pytest.mark.parametrize(("text", "value"), [("1", 1), ("16", 16)])
def test_a_positive_integer_is_read(text: str, value: int) -> None:
    assert positive_integer(text) == value


@pytest.mark.parametrize("text", ["0", "-3", "1.5", "four", ""])
def test_anything_else_is_refused_as_a_count(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match=f"expected a whole number above 0; got '{text}'"):
        positive_integer(text)


@pytest.mark.parametrize(("text", "value"), [("0.25", 0.25), ("75", 75.0), ("1e3", 1000.0)])
def test_a_positive_number_is_read(text: str, value: float) -> None:
    assert positive_number(text) == value


@pytest.mark.parametrize("text", ["0", "-1", "nan", "inf", "soon"])
def test_anything_else_is_refused_as_an_amount(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match=f"expected a number above 0; got '{text}'"):
        positive_number(text)


def test_an_input_file_is_named_or_not() -> None:
    assert input_file("ids=a/b.npy") == InputFile("ids", Path("a/b.npy"))
    assert input_file("a/b.npy") == InputFile(None, Path("a/b.npy"))
    for text in ("=b.npy", "ids="):
        with pytest.raises(argparse.ArgumentTypeError, match=r"expected NAME=FILE\.npy"):
            input_file(text)


def test_a_client_finds_the_default_server_unless_told_another() -> None:
    assert server_url(None) == "127.0.0.1:8000"
    assert server_url(None, "grpc") == "127.0.0.1:8001"
    assert server_url("10.0.0.5:9000", "grpc") == "10.0.0.5:9000"
