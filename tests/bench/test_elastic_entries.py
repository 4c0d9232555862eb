"""The elastic benchmark's entries are configs the server accepts, on both devices; a typo in one would otherwise
surface only minutes into a run (on a GPU machine, inside a lease)."""

from __future__ import annotations

import sys

import pytest
import yaml

from adaserve.config import ModelConfig
from benchmarks.elastic_batching import MAX_BATCH, Policy, _entries, _parse_args, policies
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


def test_on_cuda_the_sensitivity_entries_limit_the_busy_streams() -> None:
    checks = [served(entry).batching for entry in policies(1000, 500, "cnn", "cuda") if not entry.primary]
    limits = [(b.policy, b.max_busy_threads, b.max_busy_threads_saturated) for b in checks]
    assert limits == [("elastic", 1, None), ("elastic", 2, None), ("elastic", None, 1)]


def test_entries_picks_some_beside_the_two_compared(monkeypatch: pytest.MonkeyPatch) -> None:
    argv = ["elastic_batching", "--device", "cuda", "--model", "resnet50", "--entries", "elastic 1 busy"]
    monkeypatch.setattr(sys, "argv", argv)
    args = _parse_args()
    assert [entry.label for entry in _entries(args, 5000)] == ["elastic", "fixed-timeout", "elastic 1 busy"]


def test_entries_refuses_a_label_with_no_entry(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(sys, "argv", ["elastic_batching", "--entries", "elastic 1 busy"])  # a CUDA entry, on CPU
    with pytest.raises(SystemExit):
        _parse_args()
    assert "no entry ['elastic 1 busy'] on cpu" in capsys.readouterr().err
