"""Triton's schedule-policy request parameters as the engine reads them: `priority` to a level, `timeout` under
the level's queue policy."""

from __future__ import annotations

import pytest

from adaserve.config import BatchingSpec, QueuePolicySpec
from adaserve.engine.schedule_policy import priority_level, queue_policy, queue_rank, queue_timeout_s
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


@pytest.mark.parametrize(
    ("policy", "asked", "seconds"),
    [
        (QueuePolicySpec(), None, None),  # no policy, no request timeout: no limit
        (QueuePolicySpec(), 0, None),
        (QueuePolicySpec(), 2500, 0.0025),  # the request's own, with no default to bound it
        (QueuePolicySpec(default_timeout_us=1000), None, 0.001),
        (QueuePolicySpec(default_timeout_us=1000), 400, 0.0004),  # shorter: it counts
        (QueuePolicySpec(default_timeout_us=1000), 5000, 0.001),  # longer: the default holds
        (QueuePolicySpec(default_timeout_us=1000, allow_timeout_override=False), 400, 0.001),
        (QueuePolicySpec(allow_timeout_override=False), 400, None),
    ],
)
def test_a_request_may_shorten_its_levels_timeout_never_lengthen_it(
    policy: QueuePolicySpec, asked: int | None, seconds: float | None
) -> None:
    """Triton's rule for `allow_timeout_override`, with 0 meaning no limit on either side."""
    parameters = {} if asked is None else {"timeout": asked}
    assert queue_timeout_s(parameters, policy) == seconds


@pytest.mark.parametrize("bad", [-1, 1.5, "soon", True])
def test_a_timeout_that_is_not_a_whole_number_is_refused_even_where_it_would_not_count(bad: object) -> None:
    for policy in (QueuePolicySpec(), QueuePolicySpec(allow_timeout_override=False)):
        with pytest.raises(InvalidInputError, match=r"parameter 'timeout' must be a whole number of microseconds"):
            queue_timeout_s({"timeout": bad}, policy)


def test_a_level_with_a_policy_of_its_own_uses_it_and_the_others_the_default() -> None:
    own = QueuePolicySpec(max_queue_size=8)
    spec = BatchingSpec(priority_levels=3, priority_queue_policy={1: own})
    assert [queue_policy(spec, level) for level in (1, 2, 3)] == [
        own,
        spec.default_queue_policy,
        spec.default_queue_policy,
    ]


def test_a_delayed_request_ranks_behind_its_level_and_ahead_of_the_next() -> None:
    ranks = [queue_rank(1), queue_rank(1, delayed=True), queue_rank(2), queue_rank(2, delayed=True)]
    assert ranks == sorted(ranks) and len(set(ranks)) == 4
