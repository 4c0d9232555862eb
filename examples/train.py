"""Train the example Fashion-MNIST models and write them into a model repository (`examples/models` by default).

Usage: python examples/train.py [--out examples/models] [--mlp-epochs 10] [--cnn-epochs 5] [--seed 0]

Seeded and single-process with two threads, so a rerun on the same machine writes the same weights; about a
minute and a half on two cores. Each version gets a `metrics.json` with the test accuracy of the written artifact.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from torch import nn

from adaserve.config import ModelConfig, TensorSpec
from adaserve.datasets import FASHION_MNIST_CLASSES, load_fashion_mnist
from adaserve.export import ArtifactFormat, write_model
from adaserve.zoo import FashionCNN, mlp

MAX_BATCH_SIZE = 16
LABELS = "labels.txt"
BATCH_SIZE = 128


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("examples/models"), help="model repository to write")
    parser.add_argument("--mlp-epochs", type=int, default=10)
    parser.add_argument("--cnn-epochs", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    trained_with = shlex.join(["python", *sys.argv])

    torch.set_num_threads(2)
    torch.use_deterministic_algorithms(True)
    train_x, train_y = (torch.from_numpy(a) for a in load_fashion_mnist("train"))
    test_x, test_y = load_fashion_mnist("test")

    started = time.perf_counter()
    torch.manual_seed(args.seed)
    mlp_model = train("mlp", mlp([784, 256, 256, 10]), train_x.flatten(1), train_y, args.mlp_epochs, 2e-3, args.seed)
    torch.manual_seed(args.seed)
    cnn_model = train("cnn", FashionCNN(), train_x, train_y, args.cnn_epochs, 3e-3, args.seed)
    print(f"trained in {time.perf_counter() - started:.0f} s")

    flat_x = test_x.reshape(len(test_x), -1)
    artifacts: list[tuple[str, nn.Module, np.ndarray, ArtifactFormat]] = [
        ("mlp", mlp_model, flat_x, "torch_export"),
        ("cnn", cnn_model, test_x, "torch_export"),
        ("mlp_torchscript", mlp_model, flat_x, "torchscript"),
    ]
    for name, model, rows, fmt in artifacts:
        path = write_classifier(args.out, classifier_config(name, rows.shape[1:]), model, rows, fmt)
        accuracy = evaluate(load_artifact(path), rows, test_y)
        metrics = {"test_accuracy": accuracy, "trained_with": trained_with, "seed": args.seed}
        (path.parent / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
        print(f"{path}: test accuracy {accuracy:.4f}")


def write_classifier(
    repository: Path, config: ModelConfig, model: nn.Module, rows: np.ndarray, fmt: ArtifactFormat = "torch_export"
) -> Path:
    """Write the model (traced on two of `rows`) and the `labels.txt` its config names; returns the artifact."""
    path = write_model(repository, config, model, (torch.from_numpy(rows[:2]),), fmt=fmt)
    (path.parent.parent / LABELS).write_text("\n".join(FASHION_MNIST_CLASSES) + "\n")
    return path


def classifier_config(name: str, row_shape: tuple[int, ...]) -> ModelConfig:
    """`image` FP32 rows in, 10 `logits` out, named by the class names in `labels.txt` (the classification
    extension answers with them); batching and workers are left to the server's defaults."""
    return ModelConfig(
        name=name,
        max_batch_size=MAX_BATCH_SIZE,
        inputs=(TensorSpec(name="image", datatype="FP32", shape=(-1, *row_shape)),),
        outputs=(TensorSpec(name="logits", datatype="FP32", shape=(-1, 10), label_filename=LABELS),),
    )


def train(
    name: str, model: nn.Module, images: torch.Tensor, labels: torch.Tensor, epochs: int, lr: float, seed: int
) -> nn.Module:
    """Adam with a one-cycle learning-rate schedule: within ~1 point of the best accuracy in few epochs."""
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    steps_per_epoch = -(-len(images) // BATCH_SIZE)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=lr, total_steps=epochs * steps_per_epoch)
    shuffle = torch.Generator().manual_seed(seed)
    model.train()
    for epoch in range(1, epochs + 1):
        started, total_loss = time.perf_counter(), 0.0
        for batch in torch.randperm(len(images), generator=shuffle).split(BATCH_SIZE):
            loss = nn.functional.cross_entropy(model(images[batch]), labels[batch])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            schedule.step()
            total_loss += loss.item() * len(batch)
        print(f"{name} epoch {epoch}/{epochs}: train loss {total_loss / len(images):.4f}, "
              f"{time.perf_counter() - started:.1f} s", flush=True)  # fmt: skip
    return model


def load_artifact(path: Path) -> Callable[[torch.Tensor], torch.Tensor]:
    """Load what the server will load, so the recorded accuracy is the artifact's, not the eager module's."""
    if path.suffix == ".pt2":
        return torch.export.load(path).module()
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"`torch\.jit\.", category=DeprecationWarning)
        return torch.jit.load(str(path))


def evaluate(model: Callable[[torch.Tensor], torch.Tensor], images: np.ndarray, labels: np.ndarray) -> float:
    """Top-1 accuracy, in batches of `MAX_BATCH_SIZE` (the largest the exported artifacts accept)."""
    correct = 0
    with torch.no_grad():
        for start in range(0, len(images), MAX_BATCH_SIZE):
            logits = model(torch.from_numpy(images[start : start + MAX_BATCH_SIZE]))
            correct += int((logits.argmax(1).numpy() == labels[start : start + MAX_BATCH_SIZE]).sum())
    return correct / len(images)


if __name__ == "__main__":
    main()
