"""BERT and GPT-2 from `transformers` configs: exported with a dynamic batch, loaded as a worker loads them."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from torch import nn

from adaserve import zoo
from adaserve.config import ModelConfig
from adaserve.export import write_model
from adaserve.repository import load_artifact
from tests.server_utils import without_packages

SEQ = 16
VOCAB = 64


@pytest.mark.parametrize(
    ("build", "width"),
    [
        (lambda: zoo.bert_base_style(layers=1, hidden=32, heads=2, vocab_size=VOCAB, num_labels=3), 3),
        (lambda: zoo.gpt2_style(layers=1, hidden=32, heads=2, vocab_size=VOCAB), VOCAB),
    ],
    ids=["bert", "gpt2"],
)
def test_tiny_transformer_exports_with_a_dynamic_batch(
    build: Callable[[], nn.Module], width: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    torch.manual_seed(0)
    model = build()
    config = ModelConfig.model_validate(
        {
            "name": "tiny",
            "max_batch_size": 4,
            "inputs": [{"name": "input_ids", "datatype": "INT64", "shape": [-1, SEQ]}],
            "outputs": [{"name": "logits", "datatype": "FP32", "shape": [-1, width]}],
        }
    )
    tokens = torch.randint(0, VOCAB, (3, SEQ))
    artifact = write_model(tmp_path, config, model, (tokens[:1],))
    loaded = load_artifact(artifact, config.max_batch_size)
    with torch.no_grad():
        for batch in (3, 1):
            logits = loaded(tokens[:batch])
            assert logits.shape == (batch, width)
            torch.testing.assert_close(logits, model(tokens[:batch]), rtol=1e-4, atol=1e-5)


def test_default_sizes() -> None:
    """BERT-base and the 6-layer GPT-2 at their published widths, counted without allocating weights."""
    with torch.device("meta"):
        bert, gpt2 = zoo.bert_base_style(), zoo.gpt2_style()
    assert sum(p.numel() for p in bert.parameters()) == 109_483_778
    assert sum(p.numel() for p in gpt2.parameters()) == 81_912_576


def test_without_transformers_the_zoo_names_the_extra(tmp_path: Path) -> None:
    code = "from adaserve import zoo; zoo.bert_base_style(layers=1, hidden=32)"
    env = without_packages(tmp_path / "blocked", "transformers")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert done.returncode == 1 and "pip install 'adaserve[zoo]'" in done.stderr, done.stderr
