"""The elastic benchmark's entries are configs the server accepts, on both devices; a typo in one would otherwise
surface only minutes into a run (on a GPU machine, inside a lease)."""

from __future__ import annotations

import pytest
import yaml

from adaserve.config import ModelConfig
from benchmarks.elastic_batching import MAX_BATCH, policies
from tests.server_utils import EXAMPLES


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_every_entry_is_a_valid_config(device: str) -> None:
    base = yaml.safe_load((EXAMPLES / "cnn" / "config.yaml").read_text())
    entries = policies(1000, 500, "cnn", device)
    assert len({entry.model for entry in entries}) == len(entries)
    for entry in entries:
        config = ModelConfig.model_validate({**base, **entry.config})
        assert config.device == device
        assert all(worker.batch <= MAX_BATCH for worker in config.workers or [])


def test_on_cuda_the_sensitivity_entry_lets_two_streams_be_busy() -> None:
    (two_busy,) = [entry for entry in policies(1000, 500, "cnn", "cuda") if not entry.primary]
    base = yaml.safe_load((EXAMPLES / "cnn" / "config.yaml").read_text())
    config = ModelConfig.model_validate({**base, **two_busy.config})
    assert (config.batching.policy, config.batching.max_busy_threads) == ("elastic", 2)
