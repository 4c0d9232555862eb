"""Reference networks: output shapes, published parameter counts, and block-by-block execution by module path."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import nn

from adaserve import zoo


def n_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def on_meta(build: Callable[[], nn.Module]) -> nn.Module:
    """Build a large network without allocating its weights: parameter counts need only shapes."""
    with torch.device("meta"):
        return build()


def test_mlp_layers_and_shape() -> None:
    model = zoo.mlp([784, 256, 256, 10])
    assert [type(m) for m in model] == [nn.Linear, nn.ReLU, nn.Linear, nn.ReLU, nn.Linear]
    assert model(torch.randn(3, 784)).shape == (3, 10)
    assert n_params(model) == 784 * 256 + 256 + 256 * 256 + 256 + 256 * 10 + 10


def test_mlp_needs_two_sizes() -> None:
    with pytest.raises(ValueError, match="at least an input and an output size"):
        zoo.mlp([784])


def test_fashion_cnn_shape_and_size() -> None:
    model = zoo.FashionCNN()
    assert model(torch.randn(3, 1, 28, 28)).shape == (3, 10)
    assert 80_000 <= n_params(model) <= 130_000
    assert [name for name, _ in model.named_children()] == ["stage1", "stage2", "head"]


@pytest.mark.parametrize(
    ("build", "expected"),
    [
        (zoo.resnet50_style, 25_557_032),  # torchvision resnet50
        (zoo.resnet, 11_689_512),  # torchvision resnet18
        (zoo.vgg16_style, 138_357_544),  # torchvision vgg16
    ],
)
def test_published_parameter_counts(build: Callable[[], nn.Module], expected: int) -> None:
    assert abs(n_params(on_meta(build)) - expected) <= 0.01 * expected


def test_resnet50_style_module_paths() -> None:
    names = dict(on_meta(zoo.resnet50_style).named_modules())
    assert [name for name in names if name.count(".") == 0 and name] == [
        "stem", "layer1", "layer2", "layer3", "layer4", "head",
    ]  # fmt: skip
    assert {"layer1.0", "layer1.2", "layer3.5", "layer4.2.conv3", "layer2.0.shortcut"} <= names.keys()


@pytest.mark.parametrize(
    ("model", "input_shape"),
    [
        (zoo.resnet(width=8, num_classes=5), (3, 32, 32)),
        (zoo.resnet((1, 1, 1, 1), width=4, in_channels=1, num_classes=5, bottleneck=True), (1, 40, 40)),
        (zoo.resnet(width=4, in_channels=1, num_classes=5, small_input=True), (1, 28, 28)),
        (zoo.vgg([8, "M", 16, 16, "M", 16], in_channels=3, num_classes=5, hidden=32), (3, 32, 32)),
        (zoo.FashionCNN(num_classes=5), (1, 28, 28)),
    ],
    ids=["resnet-basic", "resnet-bottleneck", "resnet-small-input", "vgg", "fashion-cnn"],
)
def test_block_by_block_equals_whole(model: nn.Sequential, input_shape: tuple[int, ...]) -> None:
    """Running the blocks one level below the stages (`layer1.0`, `head.2`) in order is the whole forward."""
    model.eval()
    paths = [f"{stage}.{block}" for stage, module in model.named_children() for block, _ in module.named_children()]
    x = torch.randn(2, *input_shape)
    with torch.no_grad():
        whole = model(x)
        staged = x
        for path in paths:
            staged = model.get_submodule(path)(staged)
    assert whole.shape == (2, 5)
    torch.testing.assert_close(staged, whole, rtol=0, atol=0)


def test_resnet_small_input_keeps_the_resolution_to_layer1() -> None:
    """The 3×3 stride-1 stem without max-pool: 28×28 stays 28×28 through `layer1` and is 4×4 at `layer4`."""
    model = zoo.resnet(width=4, in_channels=1, num_classes=10, small_input=True).eval()
    assert [name for name, _ in model.named_children()] == ["stem", "layer1", "layer2", "layer3", "layer4", "head"]
    x = torch.randn(1, 1, 28, 28)
    with torch.no_grad():
        after_layer1 = model.layer1(model.stem(x))
        assert after_layer1.shape == (1, 4, 28, 28)
        assert model.layer4(model.layer3(model.layer2(after_layer1))).shape == (1, 32, 4, 4)


def test_resnet_needs_four_stages() -> None:
    with pytest.raises(ValueError, match="4 stages"):
        zoo.resnet((2, 2, 2))


def test_vgg_rejects_unknown_cfg_entry() -> None:
    with pytest.raises(ValueError, match="'X'"):
        zoo.vgg([8, "X"])
