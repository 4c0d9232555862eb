"""The recipe for a `transformers` classifier (adaserve.export.write_sequence_classifier, README "A transformers
classifier"): a BERT built from a config with random weights, its tokenizer on the client's side, served by a real
server and called with `adaserve infer`, answers what the model answers run directly."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from adaserve.export import write_sequence_classifier
from tests.server_utils import running_server

WORDS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "film", "was", "good", "bad", "not", "at", "all"]
TEXTS = ["the film was good", "not good at all", "bad"]
SEQUENCE = 12


def test_a_bert_classifier_answers_as_it_does_run_directly(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    from transformers import BertConfig, BertForSequenceClassification, BertTokenizer

    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=len(WORDS),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=SEQUENCE,
        id2label={0: "negative", 1: "positive"},
    )
    model = BertForSequenceClassification(config).eval()  # in practice: .from_pretrained(...)
    repository = tmp_path / "models"
    write_sequence_classifier(repository, model, name="sentiment", sequence_length=SEQUENCE, max_batch_size=4)

    tokenizer = BertTokenizer(vocab={word: index for index, word in enumerate(WORDS)})
    batch = tokenizer(TEXTS, padding="max_length", truncation=True, max_length=SEQUENCE, return_tensors="np")
    assert batch["attention_mask"].sum(axis=1).tolist() == [6, 6, 3]  # padded rows: the mask matters
    for name in ("input_ids", "attention_mask"):
        np.save(tmp_path / f"{name}.npy", batch[name])
    with torch.no_grad():
        expected = model(
            input_ids=torch.from_numpy(batch["input_ids"]), attention_mask=torch.from_numpy(batch["attention_mask"])
        ).logits.numpy()

    inputs = [f"--input={name}={tmp_path / name}.npy" for name in ("attention_mask", "input_ids")]  # any order
    with running_server(repository, "--model", "sentiment") as server:
        answer = infer("sentiment", *inputs, "--url", server.http_url)
        classes = infer("sentiment", *inputs, "--url", server.http_url, "--classes", "1")
    logits = json.loads(answer.splitlines()[0])
    assert logits["name"] == "logits" and logits["shape"] == [3, 2]
    np.testing.assert_allclose(np.array(logits["data"], np.float32), expected, rtol=1e-4, atol=1e-5)
    top = [row[0].split(":") for row in json.loads(classes.splitlines()[0])["data"]]
    assert [(int(index), label) for _, index, label in top] == [
        (int(i), config.id2label[int(i)]) for i in expected.argmax(axis=1)
    ]


def infer(*args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "adaserve", "infer", *args], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return done.stdout
