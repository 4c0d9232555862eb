"""The Linear + ReLU chain of a loaded model, as float32 numpy weights the activator and its kernel work on.

A node activator drops nodes of hidden layers, which is exact arithmetic only for a chain
`Linear → ReLU → Linear → ... → Linear` (a dropped ReLU node contributes 0 to the next layer). The chain is read
from the exported program's graph, or from the leaf modules of a TorchScript or eager module, and then checked
numerically against the model itself, so a model that only looks like a chain is refused rather than served wrong.
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from adaserve.errors import ConfigError


class NotAnMLPError(ConfigError):
    """The model is not a chain of Linear layers with ReLU between them; the message says what was found."""


#: Operations that only reshape the input before the first Linear (a flattened image); they are skipped.
_RESHAPES = {"flatten", "view", "reshape", "_unsafe_view", "Flatten", "Identity", "Dropout"}


@dataclass(frozen=True)
class MLPLayers:
    """`weights[l]` is (out, in) and `biases[l]` (out,), float32 and C-contiguous; ReLU follows every layer but
    the last."""

    weights: tuple[np.ndarray, ...]
    biases: tuple[np.ndarray, ...]

    @property
    def sizes(self) -> tuple[int, ...]:
        """Input width, then each layer's output width: (784, 112, 112, 10)."""
        return (self.weights[0].shape[1], *(w.shape[0] for w in self.weights))

    @property
    def hidden(self) -> int:
        """Layers followed by ReLU: the ones a node activator sparsifies."""
        return len(self.weights) - 1

    def digest(self) -> str:
        """sha256 of every weight and bias: an activator is bound to the exact weights it was built for."""
        sha = hashlib.sha256()
        for array in (*self.weights, *self.biases):
            sha.update(str(array.shape).encode())
            sha.update(np.ascontiguousarray(array, dtype=np.float32).tobytes())
        return sha.hexdigest()

    def pre_activations(self, x: np.ndarray) -> list[np.ndarray]:
        """Every layer's pre-activations (w·h + b) for a batch, dense (torch's GEMM: several times numpy's here)."""
        h = torch.from_numpy(np.ascontiguousarray(x.reshape(len(x), -1), dtype=np.float32))
        result = []
        with torch.inference_mode():
            for index, (w, b) in enumerate(zip(self.weights, self.biases, strict=True)):
                pre = torch.addmm(torch.from_numpy(b), h, torch.from_numpy(w).T)
                result.append(pre.numpy())
                if index < len(self.weights) - 1:
                    h = torch.relu(pre)
        return result

    def forward(self, x: np.ndarray) -> np.ndarray:
        """The dense reference forward of a batch: the logits."""
        return self.pre_activations(x)[-1]


def extract_layers(model: Callable[..., Any], row_shape: tuple[int, ...], name: str = "model") -> MLPLayers:
    """The model's Linear + ReLU chain for input rows shaped `row_shape`; `NotAnMLPError` names what else the
    model holds."""
    graph = getattr(model, "graph", None)
    if isinstance(model, torch.fx.GraphModule) and isinstance(graph, torch.fx.Graph):
        steps = _steps_from_graph(model, name)
    elif isinstance(model, torch.nn.Module):
        steps = _steps_from_modules(model, name)
    else:
        raise NotAnMLPError(f"{name}: cannot read layers from a {type(model).__name__}")
    layers = _chain(steps, name)
    if int(np.prod(row_shape)) != layers.sizes[0]:
        raise NotAnMLPError(
            f"{name}: input rows {list(row_shape)} do not flatten to the first layer's {layers.sizes[0]}"
        )
    _check_reproduces(model, layers, row_shape, name)
    return layers


_Step = tuple[str, Any]  # ("linear", (weight, bias)) | ("relu", None) | ("reshape", None)


def _steps_from_graph(module: torch.fx.GraphModule, name: str) -> list[_Step]:
    """The call_function nodes of an exported program, in order; anything but linear, relu and reshapes refused."""
    steps: list[_Step] = []
    for node in module.graph.nodes:
        if node.op != "call_function":
            continue
        op = getattr(node.target, "__name__", str(node.target)).split(".")[0]
        if op == "linear":
            weight = _attribute(module, node.args[1])
            bias = _attribute(module, node.args[2]) if len(node.args) > 2 and node.args[2] is not None else None
            steps.append(("linear", (weight, bias)))
        elif op in ("relu", "relu_"):
            steps.append(("relu", None))
        elif op in _RESHAPES:
            steps.append(("reshape", None))
        else:
            raise NotAnMLPError(f"{name}: has a {op} operation; a node activator needs a chain of Linear and ReLU")
    return steps


def _attribute(module: torch.nn.Module, node: Any) -> torch.Tensor:
    value: Any = module
    for part in str(node.target).split("."):
        value = getattr(value, part)
    return value


def _steps_from_modules(module: torch.nn.Module, name: str) -> list[_Step]:
    """Leaf modules in registration order (TorchScript keeps each submodule's `original_name`)."""
    steps: list[_Step] = []
    for _, child in module.named_modules():
        if any(True for _ in child.children()):
            continue
        kind = getattr(child, "original_name", type(child).__name__)
        if kind == "Linear":
            steps.append(("linear", (child.weight, getattr(child, "bias", None))))
        elif kind == "ReLU":
            steps.append(("relu", None))
        elif kind in _RESHAPES:
            steps.append(("reshape", None))
        else:
            raise NotAnMLPError(f"{name}: has a {kind} layer; a node activator needs a chain of Linear and ReLU")
    return steps


def _chain(steps: list[_Step], name: str) -> MLPLayers:
    """Linear (ReLU Linear)*, reshapes only before the first Linear, at least one Linear + ReLU."""
    weights: list[np.ndarray] = []
    biases: list[np.ndarray] = []
    expect_linear = True
    for kind, payload in steps:
        if kind == "reshape" and not weights:
            continue
        if kind == "linear" and expect_linear:
            weight, bias = payload
            w = weight.detach().to(torch.float32).numpy()
            b = bias.detach().to(torch.float32).numpy() if bias is not None else np.zeros(len(w), np.float32)
            weights.append(np.ascontiguousarray(w))
            biases.append(np.ascontiguousarray(b))
            expect_linear = False
        elif kind == "relu" and not expect_linear:
            expect_linear = True
        else:
            raise NotAnMLPError(f"{name}: layers are not a Linear → ReLU → Linear chain (found {kind} out of place)")
    if len(weights) < 2 or expect_linear:
        raise NotAnMLPError(f"{name}: has no Linear + ReLU layer followed by another Linear; nothing to sparsify")
    for index, (w, nxt) in enumerate(itertools.pairwise(weights)):
        if nxt.shape[1] != w.shape[0]:
            raise NotAnMLPError(f"{name}: layer {index + 1} takes {nxt.shape[1]} inputs but gets {w.shape[0]}")
    return MLPLayers(tuple(weights), tuple(biases))


def _check_reproduces(model: Callable[..., Any], layers: MLPLayers, row_shape: tuple[int, ...], name: str) -> None:
    """The chain must compute what the model computes (on two random rows), or the model hides other work."""
    x = torch.rand(2, *row_shape, generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        result = model(x)
    if isinstance(result, tuple | list):
        result = result[0]
    if not isinstance(result, torch.Tensor) or tuple(result.shape) != (2, layers.sizes[-1]):
        raise NotAnMLPError(f"{name}: output is not a (batch, {layers.sizes[-1]}) tensor")
    ours = layers.forward(x.numpy())
    if not np.allclose(ours, result.numpy(), rtol=1e-3, atol=1e-4):
        raise NotAnMLPError(f"{name}: the Linear + ReLU layers read from it do not reproduce its output")
