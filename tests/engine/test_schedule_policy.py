"""Triton's schedule-policy request parameters as the engine reads them: `priority` to a level, `timeout`."""

from __future__ import annotations

import pytest

from adaserve.config import BatchingSpec
from adaserve.engine.schedule_policy import priority_level
from adaserve.errors import InvalidInputError

THREE = BatchingSpec(priority_levels=3)


@pytest.mark.parametrize(("priority", "level"), [(1, 1), (2, 2), (3, 3), (0, 3), (None, 3), (4, 3), (99, 3)])
def test_a_priority_within_the_levels_is_its_level_and_any_other_the_default(priority: int | None, level: int) -> None:
    """Triton's rule: 0, absent, or above `priority_levels` waits at the default level (here the lowest)."""
    parameters = {} if priority is None else {"priority": priority}
    assert priority_level(parameters, THREE) == level


def test_the_default_level_can_be_set() -> None:
    spec = BatchingSpec(priority_levels=3, default_priority_level=2)
    assert [priority_level({"priority": p}, spec) for p in (0, 1, 3, 7)] == [2, 1, 3, 2]


def test_with_priority_off_every_request_waits_at_one_level() -> None:
    assert {priority_level({"priority": p}, BatchingSpec()) for p in (0, 1, 5)} == {0}


@pytest.mark.parametrize("bad", [-1, 1.5, "high", True])
@pytest.mark.parametrize("spec", [THREE, BatchingSpec()])
def test_a_priority_that_is_not_a_whole_number_is_refused_by_name(bad: object, spec: BatchingSpec) -> None:
    with pytest.raises(InvalidInputError, match=r"parameter 'priority' must be a whole number >= 0 \(1 the highest\)"):
        priority_level({"priority": bad}, spec)
