"""The recipe for a `transformers` classifier, as the site shows it (docs/examples/bert_classifier.py, written by
`adaserve.export.write_sequence_classifier`): a BERT built from a config with random weights, its tokenizer on the
client's side, served by a real server and called with `adaserve infer`, answers what the model answers run
directly, and `--classes` names its labels."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.docs.test_examples import example
from tests.server_utils import ROOT, running_server

TEXTS = ["the film was good", "not good at all", "bad"]


def test_a_bert_classifier_answers_as_it_does_run_directly(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    recipe = example("bert_classifier")
    written = subprocess.run(
        [sys.executable, str(ROOT / "docs" / "examples" / "bert_classifier.py"), "models"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env={"PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"},
    )
    assert written.returncode == 0, written.stderr[-3000:]
    batch = recipe.tokenize(TEXTS, tmp_path)
    assert batch["attention_mask"].sum(axis=1).tolist() == [6, 6, 3]  # padded rows: the mask matters
    model = recipe.build()
    with torch.no_grad():
        expected = model(**{name: torch.from_numpy(array) for name, array in batch.items()}).logits.numpy()

    inputs = [f"--input={name}={tmp_path / name}.npy" for name in ("attention_mask", "input_ids")]  # any order
    with running_server(tmp_path / "models", "--model", "sentiment") as server:
        answer = infer("sentiment", *inputs, "--url", server.http_url)
        classes = infer("sentiment", *inputs, "--url", server.http_url, "--classes", "1")
    logits = json.loads(answer.splitlines()[0])
    assert logits["name"] == "logits" and logits["shape"] == [3, 2]
    np.testing.assert_allclose(np.array(logits["data"], np.float32), expected, rtol=1e-4, atol=1e-5)
    top = [row[0].split(":") for row in json.loads(classes.splitlines()[0])["data"]]
    assert [(int(index), label) for _, index, label in top] == [
        (int(i), model.config.id2label[int(i)]) for i in expected.argmax(axis=1)
    ]


def infer(*args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "adaserve", "infer", *args], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return done.stdout
