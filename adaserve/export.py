"""Write a PyTorch module into a model repository in Triton's layout: `<name>/config.yaml`, `<name>/<version>/`.

The artifact is `model.pt2` (`torch.export`, batch dimension dynamic up to `max_batch_size`) or `model.pt`
(TorchScript); the server infers the platform from which file it finds, so a version holds exactly one.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Literal

import numpy as np
import torch
import yaml
from torch import nn

from adaserve.config import ModelConfig, TensorSpec

ArtifactFormat = Literal["torch_export", "torchscript"]

#: The artifact file name of each format, as the server looks for it.
ARTIFACT_FILES: dict[ArtifactFormat, str] = {"torch_export": "model.pt2", "torchscript": "model.pt"}


def write_model(
    repository: Path,
    config: ModelConfig,
    module: nn.Module,
    example_inputs: tuple[torch.Tensor, ...],
    *,
    version: int = 1,
    fmt: ArtifactFormat = "torch_export",
) -> Path:
    """Write `config.yaml` and the version's artifact; returns the artifact's path. `module` is put in eval mode.

    `example_inputs` are batch-first tensors matching `config.inputs`; the outputs are checked against
    `config.outputs` so a wrong config fails here rather than in the server.
    """
    if config.platform not in (None, fmt):
        raise ValueError(f"config.platform is {config.platform!r} but fmt is {fmt!r}")
    if version < 1:
        raise ValueError(f"version must be a positive integer, got {version}")
    module.eval()
    _check_tensors("input", config.inputs, example_inputs, config.max_batch_size)
    with torch.no_grad():
        outputs = module(*example_inputs)
    _check_tensors("output", config.outputs, tuple(outputs) if isinstance(outputs, (tuple, list)) else (outputs,), None)

    model_dir = repository / config.name
    version_dir = model_dir / str(version)
    version_dir.mkdir(parents=True, exist_ok=True)
    for other, filename in ARTIFACT_FILES.items():
        if other != fmt:
            (version_dir / filename).unlink(missing_ok=True)

    path = version_dir / ARTIFACT_FILES[fmt]
    if fmt == "torch_export":
        _save_exported(path, module, example_inputs, config.max_batch_size)
    else:
        _save_torchscript(path, module, example_inputs)
    # The config goes last so a failed export leaves no config without a model; max_batch_size is
    # written even when it is the default because the artifact's batch bound was baked in from it.
    document = {
        "name": config.name,
        "max_batch_size": config.max_batch_size,
        **config.model_dump(mode="json", exclude_defaults=True),
    }
    (model_dir / "config.yaml").write_text(yaml.safe_dump(document, sort_keys=False, default_flow_style=None))
    return path


def _check_tensors(
    kind: str, specs: tuple[TensorSpec, ...], tensors: tuple[torch.Tensor, ...], max_batch: int | None
) -> None:
    if len(tensors) != len(specs):
        raise ValueError(f"the config declares {len(specs)} {kind}s but the module has {len(tensors)}")
    for spec, tensor in zip(specs, tensors, strict=True):
        expected = torch.from_numpy(np.empty(0, dtype=spec.dtype)).dtype
        if tensor.dtype != expected or tensor.dim() != len(spec.shape) or tensor.shape[1:] != spec.row_shape:
            raise ValueError(
                f"{kind} {spec.name!r}: expected {spec.datatype} {list(spec.shape)}, "
                f"got {tensor.dtype} {list(tensor.shape)}"
            )
    batches = sorted({tensor.shape[0] for tensor in tensors})
    if len(batches) > 1:
        raise ValueError(f"{kind}s disagree on the batch size: {batches}")
    if max_batch is not None and not 1 <= batches[0] <= max_batch:
        raise ValueError(f"example {kind}s have batch {batches[0]}; expected 1 to max_batch_size {max_batch}")


def _save_exported(
    path: Path, module: nn.Module, example_inputs: tuple[torch.Tensor, ...], max_batch_size: int
) -> None:
    """Export with the batch dimension dynamic in [1, max_batch_size], shared by all inputs."""
    if max_batch_size == 1:
        program = torch.export.export(module, example_inputs)
    else:
        # A batch-1 example would specialize the dimension to the constant 1; trace with two rows instead.
        if example_inputs[0].shape[0] == 1:
            example_inputs = tuple(x.expand(2, *x.shape[1:]).clone() for x in example_inputs)
        batch = torch.export.Dim("batch", min=1, max=max_batch_size)
        program = torch.export.export(module, example_inputs, dynamic_shapes=tuple({0: batch} for _ in example_inputs))
    torch.export.save(program, path)


def _save_torchscript(path: Path, module: nn.Module, example_inputs: tuple[torch.Tensor, ...]) -> None:
    # torch.jit warns that it is deprecated on every call; choosing this format is the caller's decision.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"`torch\.jit\.", category=DeprecationWarning)
        with torch.no_grad():
            traced = torch.jit.trace(module, example_inputs)
        torch.jit.save(traced, str(path))
