"""Small MLPs, a small CNN with an MLP head, and activators built in seconds, shared by the activator's unit tests."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from adaserve.adaptive.activator.artifact import Activator
from adaserve.adaptive.activator.build import BuildData, BuildOptions, build_tables
from adaserve.adaptive.activator.layers import MLPLayers, extract_layers
from adaserve.zoo import FashionCNN, mlp

SIZES = (20, 48, 48, 4)
GRID = (0.1, 0.25, 0.5, 1.0)


def tiny_mlp(seed: int = 0) -> torch.nn.Sequential:
    torch.manual_seed(seed)
    return mlp(list(SIZES)).eval()


def masked_forward(x: np.ndarray, masks: list[np.ndarray] | None = None) -> np.ndarray:
    """The model in torch, hidden nodes outside `masks` zeroed (dropped)."""
    model = tiny_mlp()
    h = torch.from_numpy(x)
    linears = [m for m in model if isinstance(m, torch.nn.Linear)]
    with torch.inference_mode():
        for index, linear in enumerate(linears):
            h = linear(h)
            if index < len(linears) - 1:
                h = torch.relu(h) * (torch.from_numpy(masks[index]) if masks else 1)
    return h.numpy()


#: The small CNN: 1×28×28 rows, two conv stages of 2 and 4 channels, then a 196-32-10 MLP head.
CNN_ROW = (1, 28, 28)
CNN_SIZES = (196, 32, 10)


def tiny_cnn(seed: int = 0) -> FashionCNN:
    torch.manual_seed(seed)
    return FashionCNN(channels=(2, 4), hidden=32).eval()


def tiny_images(rows: int, seed: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """Random images and the small CNN's own argmax as labels."""
    x = np.random.default_rng(seed).random((rows, *CNN_ROW), dtype=np.float32)
    with torch.inference_mode():
        y = tiny_cnn()(torch.from_numpy(x)).argmax(1).numpy()
    return x, y


def tiny_data(rows: int, seed: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """Inputs with ReLU-like sparsity and labels of the tiny model's own argmax (its accuracy is 1 by design)."""
    rng = np.random.default_rng(seed)
    x = np.maximum(rng.standard_normal((rows, SIZES[0])), 0).astype(np.float32)
    with torch.inference_mode():
        y = tiny_mlp()(torch.from_numpy(x)).argmax(1).numpy()
    return x, y


@pytest.fixture(scope="package")
def layers() -> MLPLayers:
    return extract_layers(tiny_mlp(), (SIZES[0],), "tiny")


@pytest.fixture(scope="package")
def activator(layers: MLPLayers) -> Activator:
    x, y = tiny_data(3000)
    data = BuildData(x[:2400], x[2400:], y[2400:], "tiny")
    options = BuildOptions(bits=3, tables=4, k_grid=GRID, busy_levels=1, latency_repeats=20)
    return build_tables(layers, data, options)
