"""The GATI benchmark's networks on Fashion-MNIST: the base CNNs, their students, trained once and kept.

Training runs on the train split in the benchmark's own process (one thread); the weights go to
`results/tmp/gati/weights/` under a name that holds every setting that shapes them, so a re-run with the same
settings loads them instead of training again.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from adaserve import zoo
from adaserve.adaptive.gati.predictors import distillation_loss
from adaserve.config import ModelConfig, TensorSpec
from adaserve.export import write_model
from adaserve.repository import ModelRepository, ModelSpec
from benchmarks.common import DEFAULT_SET_ONLY, SCRATCH

WEIGHTS = SCRATCH / "gati" / "weights"
ROW_SHAPE = (1, 28, 28)
CLASSES = 10


@dataclass(frozen=True)
class Net:
    """A base network and the smaller one distilled from it (the distillation baseline and the cascade's first
    model); `epochs` are the base's, the student and a pruned network's fine-tune take their own."""

    name: str
    base: Callable[[], nn.Sequential]
    student: Callable[[], nn.Sequential]
    epochs: int
    description: str


NETS = {
    "resnet": Net(
        "resnet",
        lambda: zoo.resnet((2, 2, 2, 2), width=16, in_channels=1, num_classes=CLASSES, small_input=True),
        lambda: zoo.resnet((1, 1, 1, 1), width=8, in_channels=1, num_classes=CLASSES, small_input=True),
        1,
        "ResNet-18-style: 3×3 stride-1 stem, 4 stages of 2 basic blocks, width 16 (0.70M parameters); "
        "student: 1 block per stage, width 8",
    ),
    "vgg": Net(
        "vgg",
        lambda: zoo.vgg((32, 32, "M", 64, 64, "M", 128, 128), in_channels=1, num_classes=CLASSES, hidden=256),
        lambda: zoo.vgg((16, "M", 32, "M", 64), in_channels=1, num_classes=CLASSES, hidden=128),
        1,
        "VGG-style: conv 32,32,M,64,64,M,128,128 and a 256-wide head; student: conv 16,M,32,M,64, head 128",
    ),
}


def trained(
    key: str,
    build: Callable[[], nn.Module],
    data: tuple[np.ndarray, np.ndarray],
    epochs: int,
    *,
    teacher: Teacher | None = None,
    seed: int = 0,
) -> tuple[nn.Module, dict[str, object]]:
    """`build()` trained on `data` (on the teacher's outputs too, with the distillation loss, when there is one), or
    its stored weights when this exact setting was trained before; with a record of how it came about."""
    model = build()
    setting = f"{model!r}|{epochs}|{seed}|{teacher is not None}|{torch.__version__}|{len(data[0])}"
    setting += f"|{teacher.weights}" if teacher else ""
    path = WEIGHTS / f"{key}-{hashlib.sha256(setting.encode()).hexdigest()[:12]}.pt"
    record: dict[str, object] = {"weights": str(path.name), "epochs": epochs, "seed": seed}
    if path.exists():
        model.load_state_dict(torch.load(path, weights_only=True))
        return model.eval(), record | {"reused": True}
    began = time.perf_counter()
    fit(model, data, epochs, soft=teacher.probs() if teacher else None, seed=seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(model.state_dict(), path)
    print(f"trained {path.name} in {time.perf_counter() - began:.0f} s", flush=True)
    return model.eval(), record | {"reused": False, "train_s": round(time.perf_counter() - began, 1)}


class Teacher:
    """A trained network whose softmax on the training rows students learn from: computed once, when first asked."""

    def __init__(self, model: nn.Module, weights: str, x: np.ndarray) -> None:
        self.model = model
        self.weights = weights  # its weights file: what the students' own weights depend on
        self.x = x
        self._probs: torch.Tensor | None = None

    def probs(self) -> torch.Tensor:
        if self._probs is None:
            with torch.inference_mode():
                parts = [self.model(torch.from_numpy(self.x[i : i + 500])) for i in range(0, len(self.x), 500)]
            self._probs = torch.softmax(torch.cat(parts), 1)
        return self._probs


def fit(
    model: nn.Module,
    data: tuple[np.ndarray, np.ndarray],
    epochs: int,
    *,
    soft: torch.Tensor | None = None,
    seed: int = 0,
    lr: float = 2e-3,
    batch_size: int = 128,
) -> nn.Module:
    """Adam with a cosine schedule; with a teacher's softmax `soft` per row, the distillation loss GATI's predictors
    use (soft targets from the teacher, hard ones from the labels), else cross-entropy."""
    x, y = torch.from_numpy(data[0]), torch.from_numpy(data[1])
    assert soft is None or len(soft) >= len(x), "the teacher's rows must start with the training rows"
    generator = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, epochs * -(-len(x) // batch_size))
    model.train()
    for _ in range(epochs):
        for batch in torch.randperm(len(x), generator=generator).split(batch_size):
            logits = model(x[batch])
            if soft is None:
                loss = nn.functional.cross_entropy(logits, y[batch])
            else:
                loss = distillation_loss(logits, soft[batch], y[batch])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            schedule.step()
    return model.eval()


def predict(model: Callable[[torch.Tensor], torch.Tensor], x: np.ndarray, batch_size: int = 500) -> np.ndarray:
    with torch.inference_mode():
        return np.concatenate(
            [model(torch.from_numpy(x[i : i + batch_size])).argmax(1).numpy() for i in range(0, len(x), batch_size)]
        )


def export(repository: Path, name: str, module: nn.Module, **config: object) -> ModelSpec:
    """`module` as a repository model (`torch.export`, batch ≤ 8), `config` adding fields such as `caches`."""
    spec = ModelConfig(
        name=name,
        max_batch_size=8,
        inputs=(TensorSpec(name="image", datatype="FP32", shape=(-1, *ROW_SHAPE)),),
        outputs=(TensorSpec(name="logits", datatype="FP32", shape=(-1, CLASSES)),),
        **{"packrat": DEFAULT_SET_ONLY, **config},  # type: ignore[arg-type]
    )
    write_model(repository, spec, module.eval(), (torch.rand(2, *ROW_SHAPE),))
    return ModelRepository(repository).read(name)
