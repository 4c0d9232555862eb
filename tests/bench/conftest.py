"""Fixtures for the bench tests: one real `adaserve serve` on loopback for the module that needs it, and small
factories for records and results so the report math is tested without a server."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.bench.factories import SERVER_NICENESS, SLOW_ROUNDS
from tests.server_utils import ServerHandle, link_example, renice_tree, running_server, write_slow_model


@pytest.fixture(scope="session")
def bench_repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """mlp and cnn with one small worker each (a fast start, little CPU), and `slow`, one request at a time."""
    root = tmp_path_factory.mktemp("bench") / "models"
    root.mkdir()
    link_example(root, "mlp", workers=[{"batch": 1}, {"batch": 4}])
    link_example(root, "cnn", workers=[{"batch": 1}])
    write_slow_model(root, "slow", rounds=SLOW_ROUNDS, max_queue_size=1024)
    return root


@pytest.fixture(scope="session")
def bench_server(bench_repository: Path) -> Iterator[ServerHandle]:
    """The server at a lower CPU priority than the tests: on 2 cores the generator must not queue behind it, or the
    slow-server test would measure CPU contention instead of the generator's schedule."""
    with running_server(bench_repository) as handle:
        renice_tree(handle.pid, SERVER_NICENESS)
        yield handle
