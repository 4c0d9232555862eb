"""The benchmark's two Fashion-MNIST MLPs, trained seeded once and cached in a model repository under the scratch
folder: the paper's 784-112-112-10 and a wide 784-2048-2048-10.

    .venv/bin/python -m benchmarks.slo_nns.models      # trains what is missing (about 3 minutes on 2 cores)
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from adaserve.datasets import load_fashion_mnist
from adaserve.zoo import mlp
from benchmarks.common import SCRATCH
from examples.train import classifier_config, evaluate, train, write_classifier

REPOSITORY = SCRATCH / "slo_nns" / "models"


@dataclass(frozen=True)
class MLPSpec:
    name: str
    sizes: tuple[int, ...]
    epochs: int
    lr: float
    rows: int | None = None  # training rows, the first of the train split; None: all of them


SMALL = MLPSpec("mlp112", (784, 112, 112, 10), epochs=10, lr=2e-3)
WIDE = MLPSpec("mlp2048", (784, 2048, 2048, 10), epochs=4, lr=1e-3)
SEED = 0


def ensure_model(spec: MLPSpec, repository: Path = REPOSITORY) -> Path:
    """The model's directory, training and writing it first when it is not cached (same seed, same weights)."""
    directory = repository / spec.name
    metrics = directory / "1" / "metrics.json"
    if metrics.is_file():
        cached = json.loads(metrics.read_text())
        wanted = {"sizes": list(spec.sizes), "epochs": spec.epochs, "rows": spec.rows}
        if all(cached.get(key) == value for key, value in wanted.items()):
            return directory
    torch.set_num_threads(2)
    torch.use_deterministic_algorithms(True)
    train_x, train_y = (torch.from_numpy(a[: spec.rows]) for a in load_fashion_mnist("train"))
    test_x, test_y = load_fashion_mnist("test")
    torch.manual_seed(SEED)
    began = time.perf_counter()
    model = train(spec.name, mlp(list(spec.sizes)), train_x.flatten(1), train_y, spec.epochs, spec.lr, SEED)
    rows = test_x.reshape(len(test_x), -1)
    config = classifier_config(spec.name, rows.shape[1:]).model_copy(update={"workers": None})
    path = write_classifier(repository, config, model, rows)
    model.eval()
    accuracy = evaluate(model, rows, test_y)
    record = {
        "sizes": list(spec.sizes),
        "epochs": spec.epochs,
        "rows": spec.rows,
        "seed": SEED,
        "test_accuracy": accuracy,
        "train_s": round(time.perf_counter() - began, 1),
    }
    (path.parent / "metrics.json").write_text(json.dumps(record, indent=2) + "\n")
    print(f"{spec.name}: test accuracy {accuracy:.4f}", flush=True)
    return directory


if __name__ == "__main__":
    for each in (SMALL, WIDE):
        ensure_model(each)
