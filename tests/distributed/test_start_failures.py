"""The controller's back-off for node servers that fail to start (no Ray needed)."""

from __future__ import annotations

from adaserve.distributed.controller import StartFailures


def test_a_failed_start_waits_doubling_up_to_the_cap_and_a_start_clears_it() -> None:
    failures = StartFailures(first_s=2.0, max_s=10.0)
    assert failures.may_start("a", now=0.0)
    assert [failures.failed("a", "port taken", now=0.0) for _ in range(4)] == [2.0, 4.0, 8.0, 10.0]
    assert not failures.may_start("a", now=9.9) and failures.may_start("a", now=10.0)
    assert failures.may_start("b", now=0.0)  # another node is not held back
    assert failures.describe(now=4.0) == {"a": {"failures": 4, "error": "port taken", "retry_in_s": 6.0}}
    failures.started("a")
    assert failures.describe(now=4.0) == {} and failures.may_start("a", now=0.0)
