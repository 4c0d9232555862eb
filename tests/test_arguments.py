"""The option value types the subcommands share."""

from __future__ import annotations

import argparse

import pytest

from adaserve.arguments import positive_integer, positive_number


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
