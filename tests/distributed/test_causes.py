"""Why a node went, in words (`adaserve.distributed.causes`): Ray's account of a dead actor."""

from __future__ import annotations

from typing import Any

import pytest

from adaserve.distributed.causes import actor_death
from tests.distributed.fakes import actor_died

ray = pytest.importorskip("ray", reason="Ray's errors are what is worded")
EXIT = (
    "The actor is dead because its worker process has died. Worker exit type: SYSTEM_ERROR Worker exit detail: "
    "Worker unexpectedly exits with a connection error code 2. End of file."
)


@pytest.mark.parametrize(
    ("message", "fields", "cause"),
    [
        (
            EXIT,
            {"pid": 4242},
            "its process (pid 4242) exited (SYSTEM_ERROR): Worker unexpectedly exits with a connection error code 2. "
            "End of file.",
        ),
        ("The actor died because its node has died. Node Id: 9076dc1f", {}, "its Ray node died (Ray node 9076dc1f)"),
        ("The actor is dead because it was killed by `ray.kill`.", {"pid": 7}, "it was killed (ray.kill)"),
        ("The actor is dead because its owner has died. Owner Id: 01ab", {}, "the process that created it died"),
        ("Something Ray says in a later version.", {}, "Something Ray says in a later version."),
    ],
)
def test_a_dead_actor_is_named_by_what_happened_to_it(message: str, fields: dict[str, Any], cause: str) -> None:
    assert actor_death(actor_died(message, **fields)) == cause


def test_a_death_ray_gave_no_cause_for_or_another_error_is_its_first_line() -> None:
    assert actor_death(ray.exceptions.ActorDiedError()) == "The actor died unexpectedly before finishing this task."
    assert actor_death(TimeoutError()) == "TimeoutError"
    assert actor_death(ConnectionError("the node server stopped\nmore")) == "the node server stopped"
