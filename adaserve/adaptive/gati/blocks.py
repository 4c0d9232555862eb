"""A model as a chain of blocks: block i's output is block i+1's input, and running them all is running the model.

GATI consults a learned cache after some blocks, so the worker must be able to stop after any of them. A block is a
module path (`stem`, `layer1.0`, `head`); a list of them is valid when it cuts the model's sequential structure:
every container that a name reaches inside must itself be a pure chain of its children (`nn.Sequential`, or a
`torch.export` / TorchScript graph that only calls its children one after another), and the names must cover the
whole model in order.

The three artifact forms are split the same way:
- a `torch.export` program is unflattened (`torch.export.unflatten`) so its submodules reappear; the unflattened
  modules are rebound to the program's own tensors, so blocks share the weights rather than copy them; each block
  is then inlined into one graph of operations (`_inlined`), as the program itself runs, rather than a module call
  per convolution and norm;
- a TorchScript module already keeps its submodules (traced `nn.Sequential` calls them in a chain);
- an `nn.Module` is split along its `nn.Sequential` containers.
"""

from __future__ import annotations

import warnings
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import nn

from adaserve.errors import ConfigError
from adaserve.repository import ModelSpec, read_artifact, weight_bytes

__all__ = ["BlockChain", "BlocksError", "load_chain", "split_model"]

Block = Callable[[torch.Tensor], torch.Tensor]
BlockNames = Sequence[str] | Literal["auto"]


class BlocksError(ConfigError):
    """Block names that do not cut the model into a chain; the message names the block and the reason."""


@dataclass(frozen=True)
class BlockChain:
    """The model as blocks run in order; `run(x)` is the whole model, `run(x, 0, i + 1)` stops after block i."""

    names: tuple[str, ...]
    blocks: tuple[Block, ...]
    #: Parameter and buffer bytes per block (0 for a ReLU or a Flatten).
    weight_bytes: tuple[int, ...]

    def run(self, x: torch.Tensor, start: int = 0, stop: int | None = None) -> torch.Tensor:
        for block in self.blocks[start:stop]:
            x = block(x)
        return x

    @property
    def exits(self) -> tuple[int, ...]:
        """Blocks after which a cache may be consulted: every block but the last, except one followed by a block
        without weights (an activation or a reshape costs nothing, so a cache reads its output instead)."""
        last = len(self.blocks) - 1
        return tuple(i for i in range(last) if self.weight_bytes[i + 1] > 0)


def split_model(model: Any, blocks: BlockNames = "auto") -> BlockChain:
    """Blocks of a loaded model: a `torch.export.ExportedProgram`, a TorchScript module or an `nn.Module`."""
    exported = isinstance(model, torch.export.ExportedProgram)
    root = _unflatten(model) if exported else model
    if not isinstance(root, nn.Module):
        raise BlocksError(f"cannot split a {type(root).__name__}: expected an exported program or a module")
    names = _auto(root) if blocks == "auto" else _resolve(root, list(blocks))
    modules = tuple(_submodule(root, name) for name in names)
    if exported:
        modules = tuple(_inlined(module) for module in modules)
    return BlockChain(names=tuple(names), blocks=modules, weight_bytes=tuple(weight_bytes(m) for m in modules))


def load_chain(spec: ModelSpec) -> BlockChain:
    """Load a repository model's artifact and split it along `caches.blocks` (default `auto`)."""
    blocks = spec.config.caches.blocks if spec.config.caches else "auto"
    artifact = read_artifact(spec.artifact, spec.config.max_batch_size)
    return _named(spec, lambda: split_model(artifact, blocks))


def _named(spec: ModelSpec, split: Callable[[], BlockChain]) -> BlockChain:
    try:
        return split()
    except BlocksError as exc:
        raise BlocksError(f"model '{spec.name}' ({spec.artifact}): {exc}") from None


def _unflatten(program: torch.export.ExportedProgram) -> nn.Module:
    """The program's module hierarchy, run as generated Python code (not unflatten's default, the slower debugging
    interpreter) and bound to the program's own parameters, buffers and constants (unflatten clones them;
    rebinding shares them again)."""
    from torch.export.unflatten import _disable_interpreter

    with warnings.catch_warnings(), _disable_interpreter():
        # torch 2.13's unflatten deep-copies a treespec and trips its own deprecation warning.
        warnings.filterwarnings("ignore", message=r"`isinstance\(treespec, LeafSpec\)`", category=FutureWarning)
        root = torch.export.unflatten(program)
    for module in root.modules():
        # The generated code of a module called twice (ResNet's `relu`) predates unflatten's renaming of the
        # second call; regenerate it from the final graph.
        graph_module = getattr(module, "graph_module", None)
        if graph_module is not None:
            graph_module.recompile()
    for name, tensor in [*program.state_dict.items(), *program.constants.items()]:
        owner_name, _, attr = name.rpartition(".")
        owner = _submodule(root, owner_name)
        if attr in owner._parameters:
            owner._parameters[attr] = tensor if isinstance(tensor, nn.Parameter) else nn.Parameter(tensor, False)
        elif attr in owner._buffers:
            owner._buffers[attr] = tensor
        elif hasattr(owner, attr):
            setattr(owner, attr, tensor)
    return root


def _inlined(block: nn.Module) -> torch.fx.GraphModule:
    """The unflattened block as one generated forward over its operations, its submodules' graphs copied in: the
    same operations on the same tensors (`GraphModule` binds the attributes, it does not copy them), without a
    module call for each convolution, norm and activation (about 70 calls and 5% of a small ResNet's time)."""
    own = _fx_graph(block)
    assert own is not None, f"{type(block).__name__}: unflatten made a block without a graph of operations"
    graph = torch.fx.Graph()
    inputs = [graph.placeholder(node.name) for node in own.nodes if node.op == "placeholder"]
    graph.output(_copy_graph(graph, block, own, "", inputs))
    return torch.fx.GraphModule(block, graph)


def _copy_graph(
    graph: torch.fx.Graph, module: nn.Module, own: torch.fx.Graph, prefix: str, inputs: Sequence[Any]
) -> Any:
    """Append `module`'s graph of operations (`own`) to `graph`, its placeholders bound to `inputs`, its submodules'
    graphs copied in recursively and attribute paths made relative to the block (`prefix`); returns what it
    outputs."""
    values: dict[torch.fx.Node, Any] = {}
    value, placeholders = values.__getitem__, iter(inputs)
    for node in own.nodes:
        child = _submodule(module, node.target) if node.op == "call_module" and not node.kwargs else None
        inner = None if child is None else _fx_graph(child)
        if node.op == "placeholder":
            values[node] = next(placeholders)
        elif child is not None and inner is not None:
            arguments = torch.fx.map_arg(node.args, value)
            values[node] = _copy_graph(graph, child, inner, f"{prefix}{node.target}.", arguments)
        elif node.op != "output":
            copy = graph.node_copy(node, value)
            if node.op in ("get_attr", "call_module"):
                copy.target = f"{prefix}{node.target}"
            values[node] = copy
    return torch.fx.map_arg(own.output_node().args[0], value)


def _fx_graph(module: nn.Module) -> torch.fx.Graph | None:
    """The module's graph of operations: an unflattened or traced module has one; None for any other."""
    graph = getattr(module, "graph", None)
    return graph if isinstance(graph, torch.fx.Graph) else None


def _chain(module: nn.Module) -> list[str] | None:
    """The children `module.forward` calls one after another, each on the previous one's output; None when its
    forward does anything else (a residual add, a concatenation, a reshape of its own)."""
    if isinstance(module, torch.jit.ScriptModule):
        return _script_chain(module)
    graph = _fx_graph(module)
    if graph is not None:
        return _fx_chain(graph)
    if type(module).forward is nn.Sequential.forward:
        return list(module._modules)
    return None


def _fx_chain(graph: torch.fx.Graph) -> list[str] | None:
    nodes = list(graph.nodes)
    if len(nodes) < 3 or nodes[0].op != "placeholder" or nodes[-1].op != "output":
        return None
    previous, children = nodes[0], []
    for node in nodes[1:-1]:
        if node.op != "call_module" or node.args != (previous,) or node.kwargs:
            return None
        children.append(str(node.target))
        previous = node
    result = nodes[-1].args[0]
    if result is not previous and result != (previous,):
        return None
    return children if len(set(children)) == len(children) else None


def _script_chain(module: torch.jit.ScriptModule) -> list[str] | None:
    graph = module.graph
    inputs = list(graph.inputs())
    if len(inputs) != 2:
        return None
    self_value, previous = inputs
    attributes: dict[Any, str] = {}
    children: list[str] = []
    for node in graph.nodes():
        operands = list(node.inputs())
        if node.kind() == "prim::GetAttr" and operands == [self_value]:
            attributes[node.output()] = node.s("name")
        elif node.kind() == "prim::CallMethod" and node.s("name") == "forward" and len(operands) == 2:
            child, argument = operands
            if child not in attributes or argument != previous:
                return None
            children.append(attributes[child])
            previous = node.output()
        else:
            return None
    returned = list(graph.return_node().inputs())
    if returned != [previous] or len(set(children)) != len(children):
        return None
    return children


def _submodule(root: nn.Module, path: str) -> nn.Module:
    """`root.get_submodule(path)`, which TorchScript modules do not support; KeyError when it does not exist."""
    module = root
    for part in path.split(".") if path else ():
        module = dict(module.named_children())[part]
    return module


def _has_children(module: nn.Module) -> bool:
    return next(module.children(), None) is not None


def _auto(root: nn.Module) -> list[str]:
    """The top-level chain, descending into a child that is itself a chain of composite modules (ResNet's
    `layer1` → `layer1.0`, `layer1.1`) but not into one of plain layers (a conv-ReLU-pool stage stays one block)."""
    children = _chain(root)
    if children is None:
        raise BlocksError(
            "no sequential chain at the top level (its forward does more than call its children in turn); "
            "name the blocks in config `caches.blocks`"
        )
    names: list[str] = []
    for child in children:
        module = _submodule(root, child)
        inner = _chain(module)
        if inner and any(_has_children(_submodule(module, c)) for c in inner):
            names += [f"{child}.{name}" for name in _auto(module)]
        else:
            names.append(child)
    return names


def _resolve(root: nn.Module, names: list[str]) -> list[str]:
    """Check that `names` cut the model into a chain, descending into the containers the names reach inside."""
    for name in names:
        try:
            _submodule(root, name)
        except KeyError:
            top = ", ".join(name for name, _ in root.named_children())
            raise BlocksError(f"block '{name}' does not exist; the model's top-level modules are: {top}") from None
    top_chain = _chain(root)
    if top_chain is None:
        raise BlocksError("the model's forward is not a sequential chain of its modules, so it cannot be split")
    pending = deque(top_chain)
    for name in names:
        while True:
            if not pending:
                raise BlocksError(f"block '{name}' is out of order: the model has already ended before it")
            head = pending.popleft()
            if head == name:
                break
            if not name.startswith(head + "."):
                raise BlocksError(f"block '{name}' is out of order: '{head}' runs next")
            inner = _chain(_submodule(root, head))
            if inner is None:
                raise BlocksError(
                    f"block '{name}' is inside '{head}', whose forward is not a sequential chain of its children"
                )
            pending.extendleft(reversed([f"{head}.{child}" for child in inner]))
    if pending:
        raise BlocksError(f"the blocks end before the model does: {', '.join(pending)} would never run")
    return names
