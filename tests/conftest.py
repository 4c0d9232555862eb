"""Shared fixtures: one real server for the session, on a test repository built from the example models."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from benchmarks.perf_load import PerfAnalyzer
from tests.server_utils import (
    ROOT,
    Clients,
    ServerHandle,
    link_example,
    running_server,
    write_broken_model,
    write_fussy_model,
    write_slow_model,
)

#: perf_analyzer's venv for the suite: in the user's cache, outside the checkout, so that a fresh clone (CI's) finds
#: it made rather than spending a minute and a half on it (`benchmarks/perf_analyzer_env.sh` remakes it when its
#: packages change).
PERF_VENV = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "adaserve" / "venv-perf"

#: The request body limit the session server runs with (for the 413 tests).
MAX_REQUEST_BYTES = 1_000_000


@pytest.fixture(scope="session")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("repository") / "models"
    root.mkdir()
    for name in ("mlp", "cnn", "mlp_torchscript"):
        link_example(root, name)
    fixed = {
        "policy": "fixed-timeout",
        "max_queue_delay_us": 2000,
        "priority_levels": 2,
        "priority_queue_policy": {
            1: {"timeout_action": "delay", "default_timeout_us": 5_000_000, "max_queue_size": 32}
        },
    }
    link_example(root, "mlp", "mlp_fixed", batching=fixed)
    link_example(root, "mlp", "mlp_none", batching={"policy": "none"}, workers=[{"batch": 1}])
    write_slow_model(root, "slow", rounds=300, max_queue_size=2)
    write_fussy_model(root)
    write_broken_model(root)
    return root


@pytest.fixture(scope="session")
def server(repository: Path) -> Iterator[ServerHandle]:
    with running_server(repository, "--max-request-bytes", str(MAX_REQUEST_BYTES), "--allow-client-shm") as handle:
        yield handle


@pytest.fixture
def clients() -> Iterator[Clients]:
    """Opens tritonclient clients for a test and closes them when it ends (see `Clients` for why)."""
    with Clients() as opened:
        yield opened


@pytest.fixture(scope="session")
def perf_analyzer() -> PerfAnalyzer:
    """Triton's perf_analyzer, set up (once) and found; in CI a set-up that fails is a failure, elsewhere a skip
    that says why."""
    done = subprocess.run(
        ["bash", str(ROOT / "benchmarks" / "perf_analyzer_env.sh")],
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, "PERF_VENV": str(PERF_VENV)},
    )
    if done.returncode != 0:
        reason = f"perf_analyzer could not be set up: {done.stderr.strip()[-500:]}"
        if os.environ.get("CI"):
            pytest.fail(reason)
        pytest.skip(reason)
    return PerfAnalyzer.find(PERF_VENV)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The files holding `slow` tests first, those with the most of them first: `make test` gives pytest-xdist's two
    workers a file at a time in this order (`--no-loadscope-reorder`), so the long files start at once and the many
    short ones fill in behind them, rather than a long one starting last while the other worker has nothing left."""
    slow_tests: dict[Path, int] = {}
    for item in items:
        slow_tests[item.path] = slow_tests.get(item.path, 0) + (item.get_closest_marker("slow") is not None)
    items.sort(key=lambda item: -slow_tests[item.path])  # stable: each file's tests, and the rest, keep their order
