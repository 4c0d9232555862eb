"""Reference networks shared by examples, tests and benchmarks; defined once so they measure the same thing.

Every network is an `nn.Sequential` of named stages (`stem`, `layer1`, ..., `head`) whose children take and
return one tensor, so a model can be run block by block by module path (`layer1.0`, `head`).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from itertools import pairwise

import torch
from torch import nn

#: VGG-16's layer configuration ("D" in Simonyan & Zisserman): output channels of 3×3 convs, "M" a 2×2 max-pool.
VGG16_CFG: tuple[int | str, ...] = (
    64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M",
)  # fmt: skip


def mlp(sizes: Sequence[int]) -> nn.Sequential:
    """Linear layers `sizes[0] -> ... -> sizes[-1]` with ReLU between them; the input is already flat."""
    if len(sizes) < 2:
        raise ValueError(f"an MLP needs at least an input and an output size, got {list(sizes)}")
    layers: list[nn.Module] = []
    for i, (n_in, n_out) in enumerate(pairwise(sizes)):
        if i:
            layers.append(nn.ReLU())
        layers.append(nn.Linear(n_in, n_out))
    return nn.Sequential(*layers)


class FashionCNN(nn.Sequential):
    """A ~100k-parameter CNN for 1×28×28 Fashion-MNIST: two conv+pool stages, then a small MLP head.

    5×5 convs with few channels keep an epoch to seconds on two CPU cores while reaching ~90% test accuracy.
    """

    def __init__(self, num_classes: int = 10, channels: tuple[int, int] = (16, 32), hidden: int = 64) -> None:
        c1, c2 = channels
        super().__init__(
            OrderedDict(
                stage1=_conv_pool(1, c1),  # 28×28 -> 14×14
                stage2=_conv_pool(c1, c2),  # 14×14 -> 7×7
                head=nn.Sequential(
                    nn.Flatten(), nn.Linear(c2 * 7 * 7, hidden), nn.ReLU(), nn.Linear(hidden, num_classes)
                ),
            )
        )


def _conv_pool(n_in: int, n_out: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(n_in, n_out, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2))


class BasicBlock(nn.Module):
    """ResNet's two 3×3 convs with an identity (or 1×1 projection) shortcut."""

    expansion = 1

    def __init__(self, n_in: int, width: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(n_in, width, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.relu = nn.ReLU()
        self.shortcut = _shortcut(n_in, width, stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + self.shortcut(x))


class Bottleneck(nn.Module):
    """ResNet-50's 1×1 reduce, 3×3 (strided, as in torchvision's "v1.5"), 1×1 expand ×4, plus a shortcut."""

    expansion = 4

    def __init__(self, n_in: int, width: int, stride: int = 1) -> None:
        super().__init__()
        n_out = width * self.expansion
        self.conv1 = nn.Conv2d(n_in, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, n_out, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(n_out)
        self.relu = nn.ReLU()
        self.shortcut = _shortcut(n_in, n_out, stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return self.relu(out + self.shortcut(x))


def _shortcut(n_in: int, n_out: int, stride: int) -> nn.Module:
    if stride == 1 and n_in == n_out:
        return nn.Identity()
    return nn.Sequential(nn.Conv2d(n_in, n_out, 1, stride=stride, bias=False), nn.BatchNorm2d(n_out))


def resnet(
    stage_blocks: Sequence[int] = (2, 2, 2, 2),
    width: int = 64,
    in_channels: int = 3,
    num_classes: int = 1000,
    bottleneck: bool = False,
) -> nn.Sequential:
    """A ResNet: 7×7/2 stem + max-pool, four stages (`layer1`..`layer4`) doubling width, pooled linear head.

    The defaults are ResNet-18; `resnet50_style()` is ResNet-50. Any input of 32×32 or more works.
    """
    if len(stage_blocks) != 4:
        raise ValueError(f"a ResNet has 4 stages, got stage_blocks={list(stage_blocks)}")
    block = Bottleneck if bottleneck else BasicBlock
    stages: OrderedDict[str, nn.Module] = OrderedDict(
        stem=nn.Sequential(
            nn.Conv2d(in_channels, width, 7, stride=2, padding=3, bias=False),
            nn.BatchNorm2d(width),
            nn.ReLU(),
            nn.MaxPool2d(3, stride=2, padding=1),
        )
    )
    n_in = width
    for i, blocks in enumerate(stage_blocks):
        stage_width = width * 2**i
        layers: list[nn.Module] = []
        for j in range(blocks):
            layers.append(block(n_in, stage_width, stride=2 if i and not j else 1))
            n_in = stage_width * block.expansion
        stages[f"layer{i + 1}"] = nn.Sequential(*layers)
    stages["head"] = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(n_in, num_classes))
    return nn.Sequential(stages)


def resnet50_style(num_classes: int = 1000) -> nn.Sequential:
    """ResNet-50 (25,557,032 parameters at 1000 classes) for 3×224×224 inputs."""
    return resnet((3, 4, 6, 3), bottleneck=True, num_classes=num_classes)


def vgg(
    cfg: Sequence[int | str], in_channels: int = 3, num_classes: int = 1000, *, hidden: int = 4096
) -> nn.Sequential:
    """A VGG: 3×3 conv+ReLU stages split at each "M" (`stage1`, ...), a 7×7 average pool and a 3-layer head."""
    stages: OrderedDict[str, nn.Module] = OrderedDict()
    layers: list[nn.Module] = []
    n_in = in_channels
    for item in cfg:
        if item == "M":
            layers.append(nn.MaxPool2d(2))
            stages[f"stage{len(stages) + 1}"] = nn.Sequential(*layers)
            layers = []
        elif isinstance(item, int):
            layers += [nn.Conv2d(n_in, item, 3, padding=1), nn.ReLU()]
            n_in = item
        else:
            raise ValueError(f"VGG cfg entries are channel counts or 'M', got {item!r}")
    if layers:
        stages[f"stage{len(stages) + 1}"] = nn.Sequential(*layers)
    stages["head"] = nn.Sequential(
        nn.AdaptiveAvgPool2d(7),
        nn.Flatten(),
        nn.Linear(n_in * 7 * 7, hidden),
        nn.ReLU(),
        nn.Dropout(),
        nn.Linear(hidden, hidden),
        nn.ReLU(),
        nn.Dropout(),
        nn.Linear(hidden, num_classes),
    )
    return nn.Sequential(stages)


def vgg16_style(num_classes: int = 1000) -> nn.Sequential:
    """VGG-16 (138,357,544 parameters at 1000 classes) for 3×224×224 inputs."""
    return vgg(VGG16_CFG, num_classes=num_classes)
