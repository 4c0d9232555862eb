import pytest

from adaserve.cache.budget import parse_budget
from adaserve.errors import ConfigError


@pytest.mark.parametrize(
    ("text", "expected"),
    [("40%", 400), ("12.5 %", 125), ("123", 123), ("2KiB", 2048), ("1.5kb", 1500), ("3 GiB", 3 * 2**30)],
)
def test_bytes_or_a_share_of_the_whole(text: str, expected: int) -> None:
    assert parse_budget(text, 1000) == expected


@pytest.mark.parametrize("text", ["forty", "40 parsecs", "-5%", "0%", "0"])
def test_anything_else_is_a_config_error(text: str) -> None:
    with pytest.raises(ConfigError, match="budget"):
        parse_budget(text, 1000)
