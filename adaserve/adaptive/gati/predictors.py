"""GATI's predictor networks (§3.1, Table 3): small models that read a block's output and predict the base model's
final class distribution, trained with a distillation loss.

The paper names three families and gives their sizes only in FLOPs and bytes (Tables 3 and 4); the shapes here are
read from those figures and adapted to each block's activation:

- `FC(h)`: flatten → Linear(D, h) → ReLU → Linear(h, classes). Table 3's 33.5 MFLOPs for FC(1024) is a
  32,768 × 1,024 layer: ResNet-18 block 3's activation (on CIFAR) into h.
- `Pool(h)`: average-pool over space to at most h values (channels kept, so at least one value per channel; each
  side at least halved, so on a small activation the pooling still pools), flatten → Linear(·, 512) → ReLU →
  Linear(512, classes). Table 3's 4.3 MFLOPs for Pool(8192) is an 8192 × 512 layer. On a flat activation,
  Pool(h) pools only when D > h.
- `Conv(k,s)`: Conv2d(C, max(1, C/4), k, stride s, padding k//2) → ReLU → flatten → Linear(·, classes); only on
  activations with channels and space (C, H, W).

Variants that come out identical on a block's shape (two Pool sizes that pool to the same grid) are kept once.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

__all__ = [
    "DEFAULT_VARIANTS",
    "QUICK_VARIANTS",
    "TrainSettings",
    "VariantSpec",
    "build_predictor",
    "distillation_loss",
    "minibatches",
    "train_predictor",
]

#: Hidden width after pooling, from Table 3's FLOPs for Pool(8192).
POOL_HIDDEN = 512


@dataclass(frozen=True)
class VariantSpec:
    """One predictor family and its size: `FC(1024)`, `Pool(8192)`, `Conv(3,1)`."""

    kind: Literal["FC", "Pool", "Conv"]
    size: int  # h for FC and Pool, the kernel k for Conv
    stride: int = 1  # Conv only

    @property
    def name(self) -> str:
        return f"Conv({self.size},{self.stride})" if self.kind == "Conv" else f"{self.kind}({self.size})"

    @classmethod
    def parse(cls, text: str) -> VariantSpec:
        """`FC(1024)`, `Pool(4096)` or `Conv(3,1)` (case-insensitive)."""
        match = re.fullmatch(r"\s*(fc|pool|conv)\s*\(\s*(\d+)\s*(?:,\s*(\d+)\s*)?\)\s*", text, re.IGNORECASE)
        kind = {"fc": "FC", "pool": "Pool", "conv": "Conv"}[match.group(1).lower()] if match else None
        if match is None or kind is None or (kind == "Conv") != (match.group(3) is not None):
            raise ValueError(f"unknown predictor variant {text!r}; expected FC(h), Pool(h) or Conv(k,s)")
        spec = cls(kind, int(match.group(2)), int(match.group(3) or 1))  # type: ignore[arg-type]
        if spec.size < 1 or spec.stride < 1:
            raise ValueError(f"predictor variant {text!r}: sizes must be positive")
        return spec


#: The paper's six default variants (§7, "Default Parameters").
DEFAULT_VARIANTS = tuple(
    map(VariantSpec.parse, ("FC(1024)", "FC(512)", "Pool(8192)", "Pool(4096)", "Conv(3,1)", "Conv(5,2)"))
)
#: One of each family: the `--quick` exploration.
QUICK_VARIANTS = tuple(map(VariantSpec.parse, ("FC(512)", "Pool(4096)", "Conv(3,1)")))


def build_predictor(spec: VariantSpec, shape: tuple[int, ...], num_classes: int) -> nn.Module | None:
    """The predictor for one block's activation shape (without the batch dimension); None when the variant does not
    apply to it (Conv on a flat activation, Pool that would not pool)."""
    size = math.prod(shape)
    if spec.kind == "FC":
        return nn.Sequential(nn.Flatten(), nn.Linear(size, spec.size), nn.ReLU(), nn.Linear(spec.size, num_classes))
    if spec.kind == "Pool":
        pool = _pool(spec.size, shape)
        if pool is None:
            return None
        pooled, module = pool
        return nn.Sequential(
            module, nn.Flatten(), nn.Linear(pooled, POOL_HIDDEN), nn.ReLU(), nn.Linear(POOL_HIDDEN, num_classes)
        )
    if len(shape) != 3:
        return None
    channels, height, width = shape
    out = max(1, channels // 4)
    conv = nn.Conv2d(channels, out, spec.size, stride=spec.stride, padding=spec.size // 2)
    side_h, side_w = ((side + 2 * (spec.size // 2) - spec.size) // spec.stride + 1 for side in (height, width))
    if side_h < 1 or side_w < 1:
        return None
    return nn.Sequential(conv, nn.ReLU(), nn.Flatten(), nn.Linear(out * side_h * side_w, num_classes))


def _pool(target: int, shape: tuple[int, ...]) -> tuple[int, nn.Module] | None:
    """Values after pooling and the pooling module, or None when pooling would leave the activation as it is."""
    if len(shape) == 3:
        channels, height, width = shape
        side = max(1, math.isqrt(max(1, target // channels)))
        grid = (min(side, -(-height // 2)), min(side, -(-width // 2)))
        if grid == (height, width):
            return None
        return channels * grid[0] * grid[1], nn.AdaptiveAvgPool2d(grid)
    size = math.prod(shape)
    if size <= target:
        return None
    return target, nn.Sequential(nn.Flatten(), nn.Unflatten(1, (1, size)), nn.AdaptiveAvgPool1d(target))


def distillation_loss(
    logits: torch.Tensor,
    teacher_probs: torch.Tensor,
    labels: torch.Tensor,
    *,
    temperature: float = 2.0,
    soft_weight: float = 0.7,
) -> torch.Tensor:
    """The paper borrows from distillation "a loss function that takes into account the true labels and also the
    distribution of class probabilities" (§3.1); Hinton et al.'s form:

        L = w · T² · KL(softmax(log Y / T) ‖ softmax(z / T)) + (1 − w) · CE(z, y)

    z: predictor logits, Y: the base model's softmax, y: the true labels (the base model's argmax where the data has
    none). T² keeps the soft term's gradients on the scale of the hard one's."""
    soft_targets = F.softmax(teacher_probs.clamp_min(1e-12).log() / temperature, dim=1)
    soft = F.kl_div(F.log_softmax(logits / temperature, dim=1), soft_targets, reduction="batchmean")
    hard = F.cross_entropy(logits, labels)
    return soft_weight * temperature**2 * soft + (1 - soft_weight) * hard


@dataclass(frozen=True)
class TrainSettings:
    """Adam at the paper's retraining learning rate (§7.2.1: 0.002) for a few epochs."""

    epochs: int = 10
    batch_size: int = 128
    lr: float = 2e-3
    seed: int = 0


def train_predictor(
    predictor: nn.Module,
    activations: torch.Tensor,
    teacher_probs: torch.Tensor,
    labels: torch.Tensor,
    settings: TrainSettings,
) -> nn.Module:
    """Fit `predictor` to the base model's outputs on `activations`; returns it in eval mode."""
    optimizer = torch.optim.Adam(predictor.parameters(), lr=settings.lr)
    predictor.train()
    for batch in minibatches(len(activations), settings):
        loss = distillation_loss(predictor(activations[batch]), teacher_probs[batch], labels[batch])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return predictor.eval()


def minibatches(rows: int, settings: TrainSettings) -> Iterator[torch.Tensor]:
    """Shuffled minibatch indices for every epoch, seeded so a rebuild trains the same caches."""
    generator = torch.Generator().manual_seed(settings.seed)
    for _ in range(settings.epochs):
        yield from torch.randperm(rows, generator=generator).split(settings.batch_size)
