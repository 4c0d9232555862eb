from pathlib import Path

import pytest
import torch

from adaserve.cache import budget
from adaserve.cache.budget import device_memory_bytes, gpu_memory_bytes, host_memory_bytes, parse_budget
from adaserve.cli import _budget_bytes, memory_budget
from adaserve.errors import ConfigError
from tests.server_utils import link_example


@pytest.mark.parametrize(
    ("text", "expected"),
    [("40%", 400), ("12.5 %", 125), ("123", 123), ("2KiB", 2048), ("1.5kb", 1500), ("3 GiB", 3 * 2**30)],
)
def test_bytes_or_a_share_of_the_whole(text: str, expected: int) -> None:
    assert parse_budget(text, 1000) == expected


@pytest.mark.parametrize("text", ["forty", "40 parsecs", "-5%", "0%", "0"])
def test_anything_else_is_a_config_error(text: str) -> None:
    with pytest.raises(ConfigError, match="budget"):
        parse_budget(text, 1000)


def test_a_percentage_is_of_host_memory_for_cpu_models_and_of_the_gpus_for_cuda_ones(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(budget, "gpu_memory_bytes", lambda: 80 * 2**30)
    assert device_memory_bytes({"cuda"}) == 80 * 2**30
    assert device_memory_bytes({"cpu"}) == device_memory_bytes(()) == host_memory_bytes() > 0
    with pytest.raises(ConfigError, match="models on cpu and on cuda; give the budget in bytes"):
        device_memory_bytes({"cpu", "cuda"})


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_without_a_gpu_a_percentage_for_cuda_models_says_why_it_cannot_be_had() -> None:
    with pytest.raises(ConfigError, match="needs the GPU's memory, and torch could not tell: "):
        gpu_memory_bytes()


def test_the_server_reads_which_device_a_percentage_is_of_from_the_repository(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(budget, "gpu_memory_bytes", lambda: 1000)
    link_example(tmp_path, "mlp", device="cuda")
    assert _budget_bytes(memory_budget("40%"), tmp_path) == 400
    assert _budget_bytes(memory_budget("2KiB"), tmp_path) == 2048
    link_example(tmp_path, "cnn")
    with pytest.raises(ConfigError, match="models on cpu and on cuda"):
        _budget_bytes(memory_budget("40%"), tmp_path)
