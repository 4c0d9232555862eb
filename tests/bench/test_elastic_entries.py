"""The elastic benchmark's entries are configs the server accepts, on both devices; a typo in one would otherwise
surface only minutes into a run (on a GPU machine, inside a lease)."""

from __future__ import annotations

import argparse
import sys

import pytest
import yaml

from adaserve.config import ModelConfig
from benchmarks.elastic_batching import (
    FIXED_ENTRIES,
    MAX_BATCH,
    Fixed,
    Policy,
    _entries,
    _parse_args,
    _strongest_qos,
    _worker_sets,
    policies,
    worker_sets,
)
from tests.server_utils import EXAMPLES


def served(entry: Policy) -> ModelConfig:
    """The config the benchmark's server reads for `entry`: the example CNN's with the entry's fields over it."""
    base = yaml.safe_load((EXAMPLES / "cnn" / "config.yaml").read_text())
    return ModelConfig.model_validate({**base, **entry.config})


#: Each fixed-timeout entry at its own setting, as the sweep would tune them.
TUNED = {"fixed-timeout": Fixed(1000, 1, 2), "fixed-timeout low": Fixed(500, 2, 1), "no wait": Fixed(0, 1, 1)}


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_every_entry_is_a_valid_config(device: str) -> None:
    entries = policies(TUNED, "cnn", device)
    assert len({entry.model for entry in entries}) == len(entries)
    for entry in entries:
        config = served(entry)
        assert config.device == device
        assert all(worker.batch <= MAX_BATCH for worker in config.workers or [])


def test_on_cuda_the_sensitivity_entries_limit_the_busy_streams() -> None:
    checks = [served(entry).batching for entry in policies(TUNED, "cnn", "cuda") if not entry.primary]
    limits = [(b.policy, b.max_busy_threads, b.max_busy_threads_saturated) for b in checks]
    assert limits == [("fixed-timeout", 0, None), ("elastic", 1, None), ("elastic", 2, None), ("elastic", None, 1)]


def test_fixed_timeout_entries_serve_their_tuned_settings_with_no_busy_thread_limit() -> None:
    """Triton's instances: each takes a batch when one is due, so the entries lift adaserve's busy-thread limit."""
    fixed = {entry.label: served(entry) for entry in policies(TUNED, "cnn", "cpu") if entry.label in FIXED_ENTRIES}
    assert set(fixed) == set(FIXED_ENTRIES)
    for label, config in fixed.items():
        setting = TUNED[label]
        assert config.batching.policy == "fixed-timeout" and config.batching.max_busy_threads == 0
        assert config.batching.max_queue_delay_us == setting.delay_us
        assert [(w.batch, w.threads) for w in config.workers or []] == [
            (MAX_BATCH, setting.threads)
        ] * setting.instances


@pytest.mark.parametrize(
    ("cores", "sets"),
    [(1, [(1, 1)]), (2, [(1, 1), (2, 1), (1, 2)]), (4, [(3, 1), (1, 2), (4, 1), (2, 2), (1, 4)])],
)
def test_worker_sets_split_all_the_cores_and_all_but_one(cores: int, sets: list[tuple[int, int]]) -> None:
    assert worker_sets(cores, "cpu") == sets


def test_worker_sets_option_reads_pairs_and_refuses_others() -> None:
    assert _worker_sets("2x1,1x2") == [(2, 1), (1, 2)]
    with pytest.raises(argparse.ArgumentTypeError, match="INSTANCESxTHREADS"):
        _worker_sets("2x")


def test_entries_picks_some_beside_the_two_compared(monkeypatch: pytest.MonkeyPatch) -> None:
    argv = ["elastic_batching", "--device", "cuda", "--model", "resnet50", "--entries", "elastic 1 busy"]
    monkeypatch.setattr(sys, "argv", argv)
    args = _parse_args()
    labels = [entry.label for entry in _entries(args, TUNED)]
    assert labels == ["elastic", "fixed-timeout", "fixed-timeout low", "elastic 1 busy"]


def test_entries_refuses_a_label_with_no_entry(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(sys, "argv", ["elastic_batching", "--entries", "elastic 1 busy"])  # a CUDA entry, on CPU
    with pytest.raises(SystemExit):
        _parse_args()
    assert "no entry ['elastic 1 busy'] on cpu" in capsys.readouterr().err


def test_the_throughput_bar_is_against_every_opt_wait_setting_searched() -> None:
    """In one run the setting tuned past capacity met QoS to 3,524/s while both OPT Wait entries stopped near
    2,950/s: the bar compared elastic (3,432/s) with the entries only, and passed against a weaker baseline."""

    def search(rps: float) -> dict[str, float]:
        return {"max_throughput_rps": rps, "first_failing_rate_rps": rps * 1.1}

    report = {
        "qos": {"fixed-timeout": search(2924.0), "fixed-timeout low": search(2995.0)},
        "opt_wait": {label: vars(setting) for label, setting in TUNED.items()},
        "opt_wait_qos_searches": [{"setting": vars(Fixed(2000, 2, 1)), **search(3524.0)}],
    }
    best, setting = _strongest_qos(report)
    assert best["max_throughput_rps"] == 3524.0 and setting == "searched for the high rate (2000 µs, 2 × 1 threads)"
    report["opt_wait_qos_searches"] = []  # and a result from before these searches: the entries alone
    assert _strongest_qos(report) == (report["qos"]["fixed-timeout low"], "fixed-timeout low (500 µs, 2 × 1 threads)")
