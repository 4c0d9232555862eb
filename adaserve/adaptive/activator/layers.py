"""A loaded model as a prefix and an MLP head: the Linear + ReLU chain the activator and its kernel work on.

A node activator drops nodes of hidden layers, which is exact arithmetic only for a chain
`Linear → ReLU → Linear → ... → Linear` (a dropped ReLU node contributes 0 to the next layer). Such a chain may be
the whole model (an MLP) or its tail (an MLP head, after convolutions or any other layers). The head is the
longest trailing run of the model's operations that is such a chain (reshapes allowed before its first Linear),
with at least one hidden ReLU layer; everything before it is the *prefix*, run by torch exactly as the model runs
it and sharing its weights:

* an exported program is read from its graph; the prefix is a copy of the graph up to the value the head reads
  (a flat graph of operations: there are no submodules to split along);
* a TorchScript or eager module is split into blocks by `gati.blocks.split_model`; the head is the longest run of
  trailing blocks whose leaf modules form the chain, the prefix the blocks before it (a module that does not
  split into blocks must be an MLP as a whole).

Prefix and head are then checked numerically against the model itself, so a model that only looks like a prefix
and a chain is refused rather than served wrong.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import torch

from adaserve.adaptive.gati.blocks import BlockChain, BlocksError, split_model
from adaserve.errors import ConfigError

__all__ = ["NO_PREFIX", "MLPHead", "MLPLayers", "NotAnMLPError", "Prefix", "extract_head", "extract_layers"]


class NotAnMLPError(ConfigError):
    """The model has no MLP head (Linear layers with ReLU between them at its end); the message says what was
    found."""


#: Operations that only reshape the input before the first Linear (a flattened image); they are skipped.
_RESHAPES = {"flatten", "view", "reshape", "_unsafe_view", "Flatten", "Identity", "Dropout"}
#: An MLP head over the kinds of steps (`_Step.kind`): reshapes, then Linear (ReLU Linear)+.
_HEAD = re.compile(r"S*L(?:RL)+")


def _sha256(arrays: Iterable[np.ndarray], names: Iterable[str] = ()) -> str:
    sha = hashlib.sha256()
    for name in names:
        sha.update(name.encode() + b"\0")
    for array in arrays:
        sha.update(str(array.shape).encode())
        sha.update(np.ascontiguousarray(array, dtype=np.float32).tobytes())
    return sha.hexdigest()


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
        return _sha256((*self.weights, *self.biases))

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


@dataclass(frozen=True)
class Prefix:
    """The model's operations before its MLP head, run by torch as the model runs them (with its own tensors);
    empty (`run` None) for a pure MLP, whose input rows go to the head as they are."""

    run: Callable[[torch.Tensor], torch.Tensor] | None = None
    row_shape: tuple[int, ...] = ()  # one input row, as the prefix takes it
    ops: tuple[str, ...] = ()  # what it runs, in order: graph operations or block names
    tensors: tuple[torch.Tensor, ...] = ()  # the weights, buffers and constants it reads

    @property
    def empty(self) -> bool:
        return self.run is None

    def __call__(self, x: np.ndarray) -> np.ndarray:
        """The head's input rows for a batch of input rows (flat or shaped): (rows, head width), float32. Runs
        under the caller's torch threads."""
        if self.run is None:  # (a reshape costs a small MLP's request more than the check)
            return x if x.ndim == 2 else x.reshape(len(x), -1)
        with torch.inference_mode():
            features = self.run(torch.from_numpy(x).reshape(len(x), *self.row_shape))
        return np.ascontiguousarray(features.reshape(len(x), -1).numpy(), dtype=np.float32)

    def digest(self) -> str:
        """sha256 of the operations and tensors ('' when empty): the head's tables were built on this prefix's
        outputs, so an activator is bound to it as well as to the head's weights."""
        if self.run is None:
            return ""
        return _sha256((t.detach().to(torch.float32).numpy() for t in self.tensors), self.ops)


NO_PREFIX = Prefix()


@dataclass(frozen=True)
class MLPHead:
    """A model as `layers.forward(prefix(x))`."""

    prefix: Prefix
    layers: MLPLayers


def extract_head(model: Callable[..., Any], row_shape: tuple[int, ...], name: str = "model") -> MLPHead:
    """The model's prefix and MLP head for input rows shaped `row_shape`; `NotAnMLPError` names what the model
    ends with when it has no MLP head."""
    graph = getattr(model, "graph", None)
    if isinstance(model, torch.fx.GraphModule) and isinstance(graph, torch.fx.Graph):
        head = _head_from_graph(model, row_shape, name)
    elif isinstance(model, torch.nn.Module):
        head = _head_from_modules(model, row_shape, name)
    else:
        raise NotAnMLPError(f"{name}: cannot read layers from a {type(model).__name__}")
    if head.prefix.empty and int(np.prod(row_shape)) != head.layers.sizes[0]:
        raise NotAnMLPError(
            f"{name}: input rows {list(row_shape)} do not flatten to the first layer's {head.layers.sizes[0]}"
        )
    _check_reproduces(model, head, row_shape, name)
    return head


def extract_layers(model: Callable[..., Any], row_shape: tuple[int, ...], name: str = "model") -> MLPLayers:
    """A pure MLP's layers (the kernel alone computes it); `NotAnMLPError` for anything else, an MLP head too."""
    head = extract_head(model, row_shape, name)
    if not head.prefix.empty:
        raise NotAnMLPError(f"{name}: is not a pure MLP: {len(head.prefix.ops)} operations run before its MLP head")
    return head.layers


class _Step(NamedTuple):
    kind: str  # L(inear), R(eLU), S(hape: a reshape), O(ther)
    name: str  # the operation or layer, for messages
    linear: tuple[torch.Tensor, torch.Tensor | None] | None = None  # a Linear's weight and bias


def _head_from_graph(module: torch.fx.GraphModule, row_shape: tuple[int, ...], name: str) -> MLPHead:
    """The head among the graph's call_function nodes; the prefix runs the graph up to the node the head reads."""
    nodes = [node for node in module.graph.nodes if node.op == "call_function"]
    steps = [_graph_step(module, node) for node in nodes]
    start = _head_start(steps, range(len(steps)), name)
    cut = nodes[start].args[0]
    if not isinstance(cut, torch.fx.Node):
        raise NotAnMLPError(f"{name}: its MLP head does not start from a tensor")
    prefix = NO_PREFIX if cut.op == "placeholder" else _graph_prefix(module, cut, row_shape)
    return MLPHead(prefix, _layers(steps[start:], name))


def _graph_prefix(module: torch.fx.GraphModule, cut: torch.fx.Node, row_shape: tuple[int, ...]) -> Prefix:
    """A copy of the graph up to `cut`, returning it; it shares the model's tensors (GraphModule sets the same
    objects as attributes, it does not copy them)."""
    graph = torch.fx.Graph()
    copies: dict[torch.fx.Node, torch.fx.Node] = {}
    for node in module.graph.nodes:
        copies[node] = graph.node_copy(node, copies.__getitem__)
        if node is cut:
            break
    graph.output(copies[cut])
    graph.eliminate_dead_code()
    kept = list(graph.nodes)
    return Prefix(
        run=torch.fx.GraphModule(module, graph),
        row_shape=row_shape,
        ops=tuple(str(node.target) for node in kept if node.op in ("call_function", "call_module")),
        tensors=tuple(_attribute(module, node) for node in kept if node.op == "get_attr"),
    )


def _graph_step(module: torch.fx.GraphModule, node: torch.fx.Node) -> _Step:
    op = getattr(node.target, "__name__", str(node.target)).split(".")[0]
    if op == "linear":
        weight = _attribute(module, node.args[1])
        bias = _attribute(module, node.args[2]) if len(node.args) > 2 and node.args[2] is not None else None
        return _Step("L", op, (weight, bias))
    if op in ("relu", "relu_"):
        return _Step("R", op)
    return _Step("S" if op in _RESHAPES else "O", op)


def _attribute(module: torch.nn.Module, node: Any) -> torch.Tensor:
    value: Any = module
    for part in str(node.target).split("."):
        value = getattr(value, part)
    return value


def _head_from_modules(model: torch.nn.Module, row_shape: tuple[int, ...], name: str) -> MLPHead:
    """The head as the longest run of trailing blocks whose leaf modules form the chain; the prefix, the blocks
    before it. A model that does not split into blocks must be an MLP as a whole (its leaves in registration
    order)."""
    try:
        chain = split_model(model)
    except BlocksError:
        chain = BlockChain(names=("",), blocks=(model,), weight_bytes=(0,))
    block_steps = [_module_steps(block) if isinstance(block, torch.nn.Module) else [] for block in chain.blocks]
    steps = list(itertools.chain.from_iterable(block_steps))
    offsets = list(itertools.accumulate((len(s) for s in block_steps), initial=0))
    start = _head_start(steps, offsets[:-1], name)
    cut = offsets.index(start)
    layers = _layers(steps[start:], name)
    if cut == 0:
        return MLPHead(NO_PREFIX, layers)
    prefix = Prefix(
        run=functools.partial(chain.run, start=0, stop=cut),
        row_shape=row_shape,
        ops=chain.names[:cut],
        tensors=tuple(
            tensor
            for block in chain.blocks[:cut]
            if isinstance(block, torch.nn.Module)
            for tensor in block.state_dict().values()
        ),
    )
    return MLPHead(prefix, layers)


def _module_steps(module: torch.nn.Module) -> list[_Step]:
    """Leaf modules in registration order (TorchScript keeps each submodule's `original_name`)."""
    steps: list[_Step] = []
    for _, child in module.named_modules():
        if any(True for _ in child.children()):
            continue
        kind = getattr(child, "original_name", type(child).__name__)
        if kind == "Linear":
            steps.append(_Step("L", kind, (child.weight, getattr(child, "bias", None))))
        elif kind == "ReLU":
            steps.append(_Step("R", kind))
        else:
            steps.append(_Step("S" if kind in _RESHAPES else "O", kind))
    return steps


def _head_start(steps: list[_Step], starts: Iterable[int], name: str) -> int:
    """The first of `starts` from which the steps to the end form an MLP head: the longest head."""
    kinds = "".join(step.kind for step in steps)
    for start in starts:
        if _HEAD.fullmatch(kinds, start):
            return start
    tail = ", ".join(step.name for step in steps[-4:]) or "nothing"
    raise NotAnMLPError(
        f"{name}: has no Linear + ReLU layer followed by another Linear at its end, so no MLP head to sparsify "
        f"(it ends with {tail})"
    )


def _layers(steps: list[_Step], name: str) -> MLPLayers:
    """The head's weights as float32 numpy arrays; its widths must chain."""
    weights: list[np.ndarray] = []
    biases: list[np.ndarray] = []
    for step in steps:
        if step.linear is None:
            continue
        weight, bias = step.linear
        w = weight.detach().to(torch.float32).numpy()
        b = bias.detach().to(torch.float32).numpy() if bias is not None else np.zeros(len(w), np.float32)
        weights.append(np.ascontiguousarray(w))
        biases.append(np.ascontiguousarray(b))
    for index, (w, nxt) in enumerate(itertools.pairwise(weights)):
        if nxt.shape[1] != w.shape[0]:
            raise NotAnMLPError(f"{name}: layer {index + 1} takes {nxt.shape[1]} inputs but gets {w.shape[0]}")
    return MLPLayers(tuple(weights), tuple(biases))


def _check_reproduces(model: Callable[..., Any], head: MLPHead, row_shape: tuple[int, ...], name: str) -> None:
    """Prefix and head must compute what the model computes (on two random rows), or the model hides other
    work."""
    layers = head.layers
    x = torch.rand(2, *row_shape, generator=torch.Generator().manual_seed(0))
    try:
        with torch.inference_mode():
            result = model(x)
        features = head.prefix(x.numpy())
    except Exception as exc:
        raise NotAnMLPError(f"{name}: does not run on rows {list(row_shape)}: {type(exc).__name__}: {exc}") from exc
    if isinstance(result, tuple | list):
        result = result[0]
    if not isinstance(result, torch.Tensor) or tuple(result.shape) != (2, layers.sizes[-1]):
        raise NotAnMLPError(f"{name}: output is not a (batch, {layers.sizes[-1]}) tensor")
    if features.shape[1] != layers.sizes[0]:
        raise NotAnMLPError(
            f"{name}: its MLP head takes {layers.sizes[0]} inputs but the operations before it give {features.shape[1]}"
        )
    if not np.allclose(layers.forward(features), result.numpy(), rtol=1e-3, atol=1e-4):
        raise NotAnMLPError(f"{name}: the prefix and the Linear + ReLU layers read from it do not reproduce its output")
