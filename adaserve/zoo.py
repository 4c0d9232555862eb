"""Reference networks shared by examples, tests and benchmarks; defined once so they measure the same thing.

The MLP and the CNNs (ResNet, VGG, Inception, Fashion-MNIST) are `nn.Sequential`s of named stages (`stem`,
`layer1`, ..., `head`) whose children take and return one tensor, so a model can be run block by block by module
path (`layer1.0`, `head`). The transformers (BERT, GPT-2) are built from `transformers` configs with random weights
(no hub download) and wrapped whole as `input_ids` → logits; `transformers` is imported only when one is built.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from itertools import pairwise

import torch
from torch import nn

from adaserve.export import LogitsOf
from adaserve.extras import needs_extra

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
    small_input: bool = False,
) -> nn.Sequential:
    """A ResNet: 7×7/2 stem + max-pool, four stages (`layer1`..`layer4`) doubling width, pooled linear head.

    The defaults are ResNet-18; `resnet50_style()` is ResNet-50. Any input of 32×32 or more works. `small_input`
    makes the stem a 3×3 stride-1 conv without max-pool (the CIFAR form): a 28×28 image would otherwise be 7×7
    before `layer1` and 1×1 by `layer4`.
    """
    if len(stage_blocks) != 4:
        raise ValueError(f"a ResNet has 4 stages, got stage_blocks={list(stage_blocks)}")
    block = Bottleneck if bottleneck else BasicBlock
    stem: list[nn.Module] = (
        [nn.Conv2d(in_channels, width, 3, padding=1, bias=False), nn.BatchNorm2d(width), nn.ReLU()]
        if small_input
        else [
            nn.Conv2d(in_channels, width, 7, stride=2, padding=3, bias=False),
            nn.BatchNorm2d(width),
            nn.ReLU(),
            nn.MaxPool2d(3, stride=2, padding=1),
        ]
    )
    stages: OrderedDict[str, nn.Module] = OrderedDict(stem=nn.Sequential(*stem))
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


class InceptionBlock(nn.Module):
    """GoogLeNet's Inception module: 1×1, 1×1→3×3, 1×1→3×3 and pool→1×1 branches, concatenated on channels."""

    def __init__(self, n_in: int, c1: int, c3_reduce: int, c3: int, c5_reduce: int, c5: int, pool: int) -> None:
        super().__init__()
        self.branch1 = _conv_bn(n_in, c1, 1)
        self.branch2 = nn.Sequential(_conv_bn(n_in, c3_reduce, 1), _conv_bn(c3_reduce, c3, 3))
        # torchvision's GoogLeNet uses a 3×3 where the paper has a 5×5 in this branch; so does this one.
        self.branch3 = nn.Sequential(_conv_bn(n_in, c5_reduce, 1), _conv_bn(c5_reduce, c5, 3))
        self.branch4 = nn.Sequential(nn.MaxPool2d(3, stride=1, padding=1, ceil_mode=True), _conv_bn(n_in, pool, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.branch1(x), self.branch2(x), self.branch3(x), self.branch4(x)], 1)


def _conv_bn(n_in: int, n_out: int, kernel: int, stride: int = 1) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(n_in, n_out, kernel, stride=stride, padding=kernel // 2, bias=False),
        nn.BatchNorm2d(n_out, eps=0.001),
        nn.ReLU(),
    )


#: GoogLeNet's Inception modules per stage (Szegedy et al. 2015, table 1): (c1, c3_reduce, c3, c5_reduce, c5, pool).
GOOGLENET_STAGES: tuple[tuple[tuple[int, int, int, int, int, int], ...], ...] = (
    ((64, 96, 128, 16, 32, 32), (128, 128, 192, 32, 96, 64)),
    ((192, 96, 208, 16, 48, 64), (160, 112, 224, 24, 64, 64), (128, 128, 256, 24, 64, 64),
     (112, 144, 288, 32, 64, 64), (256, 160, 320, 32, 128, 128)),
    ((256, 160, 320, 32, 128, 128), (384, 192, 384, 48, 128, 128)),
)  # fmt: skip


def inception_style(num_classes: int = 1000, in_channels: int = 3) -> nn.Sequential:
    """GoogLeNet / Inception v1 (6,624,904 parameters at 1000 classes, torchvision's form without the auxiliary
    classifiers) for 3×224×224 inputs: the paper's Inception-v3 is a later member of this family, and at 1.5 GFLOPs
    a row this one keeps a sweep to B = 256 within minutes on two cores."""
    stages: OrderedDict[str, nn.Module] = OrderedDict(
        stem=nn.Sequential(
            _conv_bn(in_channels, 64, 7, stride=2),
            nn.MaxPool2d(3, stride=2, ceil_mode=True),
            _conv_bn(64, 64, 1),
            _conv_bn(64, 192, 3),
            nn.MaxPool2d(3, stride=2, ceil_mode=True),
        )
    )
    n_in = 192
    for index, modules in enumerate(GOOGLENET_STAGES):
        blocks: list[nn.Module] = []
        for c1, c3r, c3, c5r, c5, pool in modules:
            blocks.append(InceptionBlock(n_in, c1, c3r, c3, c5r, c5, pool))
            n_in = c1 + c3 + c5 + pool
        if index < len(GOOGLENET_STAGES) - 1:
            blocks.append(nn.MaxPool2d(2 if index else 3, stride=2, ceil_mode=True))  # torchvision's maxpool3, 4
        stages[f"stage{index + 1}"] = nn.Sequential(*blocks)
    stages["head"] = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Dropout(0.2), nn.Linear(n_in, num_classes))
    return nn.Sequential(stages)


# -- transformers (built from `transformers` configs with random weights; imported only when one is built) ---------


def bert_base_style(
    *,
    layers: int = 12,
    hidden: int = 768,
    heads: int | None = None,
    num_labels: int = 2,
    vocab_size: int = 30522,
    max_positions: int = 512,
) -> LogitsOf:
    """BERT (base by default: 12 layers, 768 hidden, 12 heads; 109.5M parameters) with a sequence-classification
    head and random weights, for `input_ids` of up to `max_positions` tokens; `heads` defaults to hidden / 64."""
    with needs_extra("zoo", "the BERT reference model"):
        from transformers import BertConfig, BertForSequenceClassification

    config = BertConfig(
        vocab_size=vocab_size,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads or max(1, hidden // 64),
        intermediate_size=4 * hidden,
        max_position_embeddings=max_positions,
    )
    config.num_labels = num_labels
    return LogitsOf(BertForSequenceClassification(config).eval())


def gpt2_style(
    *,
    layers: int = 6,
    hidden: int = 768,
    heads: int | None = None,
    vocab_size: int = 50257,
    max_positions: int = 1024,
) -> LogitsOf:
    """A GPT-2 (default: GPT-2 small's width with 6 of its 12 layers, 81.9M parameters) with random weights that
    returns the next-token logits at the last position ([B, vocab_size]) for `input_ids` of up to `max_positions`
    tokens; `heads` defaults to hidden / 64."""
    with needs_extra("zoo", "the GPT-2 reference model"):
        from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(
        vocab_size=vocab_size,
        n_positions=max_positions,
        n_embd=hidden,
        n_layer=layers,
        n_head=heads or max(1, hidden // 64),
    )
    return LogitsOf(GPT2LMHeadModel(config).eval(), last_position=True)
