"""The elastic benchmark's entries are configs the server accepts, on both devices; a typo in one would otherwise
surface only minutes into a run (on a GPU machine, inside a lease)."""

from __future__ import annotations

import pytest
import yaml

from adaserve.config import ModelConfig
from benchmarks.elastic_batching import MAX_BATCH, Policy, policies
from tests.server_utils import EXAMPLES


def served(entry: Policy) -> ModelConfig:
    """The config the benchmark's server reads for `entry`: the example CNN's with the entry's fields over it."""
    base = yaml.safe_load((EXAMPLES / "cnn" / "config.yaml").read_text())
    return ModelConfig.model_validate({**base, **entry.config})


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_every_entry_is_a_valid_config(device: str) -> None:
    entries = policies(1000, 500, "cnn", device)
    assert len({entry.model for entry in entries}) == len(entries)
    for entry in entries:
        config = served(entry)
        assert config.device == device
        assert all(worker.batch <= MAX_BATCH for worker in config.workers or [])


def test_on_cuda_the_sensitivity_entry_lets_two_streams_be_busy() -> None:
    (two_busy,) = [entry for entry in policies(1000, 500, "cnn", "cuda") if not entry.primary]
    config = served(two_busy)
    assert (config.batching.policy, config.batching.max_busy_threads) == ("elastic", 2)
