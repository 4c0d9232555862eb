"""Write a PyTorch module into a model repository in Triton's layout: `<name>/config.yaml`, `<name>/<version>/`.

The artifact is `model.pt2` (`torch.export`, batch dimension dynamic up to `max_batch_size`) or `model.pt`
(TorchScript); the server infers the platform from which file it finds, so a version holds exactly one.

    write_model("models", {"inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 4]}],
                           "outputs": [{"name": "y", "datatype": "FP32", "shape": [-1, 2]}]},
                nn.Linear(4, 2), torch.rand(2, 4), name="linear")

`write_sequence_classifier` does the same for a `transformers` sequence classifier, its tokenizer left to clients.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
import yaml
from pydantic import ValidationError
from torch import nn

from adaserve.config import ModelConfig, TensorSpec, describe_validation
from adaserve.errors import ConfigError

ArtifactFormat = Literal["torch_export", "torchscript"]

#: The artifact file name of each format, as the server looks for it.
ARTIFACT_FILES: dict[ArtifactFormat, str] = {"torch_export": "model.pt2", "torchscript": "model.pt"}


def write_model(
    repository: str | os.PathLike[str],
    config: ModelConfig | Mapping[str, Any] | None,
    module: nn.Module,
    example_inputs: torch.Tensor | Sequence[torch.Tensor],
    *,
    name: str | None = None,
    version: int = 1,
    fmt: ArtifactFormat = "torch_export",
    **fields: Any,
) -> Path:
    """Write `config.yaml` and the version's artifact under `repository/<name>/`; returns the artifact's path.
    `module` is put in eval mode.

    The config is a `ModelConfig`, or its fields as a mapping (what `config.yaml` holds), as keyword arguments
    (`inputs=[...], outputs=[...], max_batch_size=8`), or both (the keywords win). `name` is optional where the
    config has one, and must agree with it. `example_inputs` (a tensor, or one per input) are batch-first
    tensors matching the config's inputs; the outputs are checked against its outputs, so a wrong config fails
    here (ConfigError or ValueError, naming the field) rather than in the server.
    """
    config = _model_config(config, name, fields)
    example_inputs = (example_inputs,) if isinstance(example_inputs, torch.Tensor) else tuple(example_inputs)
    if config.platform not in (None, fmt):
        raise ValueError(f"config.platform is {config.platform!r} but fmt is {fmt!r}")
    if version < 1:
        raise ValueError(f"version must be a positive integer, got {version}")
    module.eval()
    _check_tensors("input", config.inputs, example_inputs, config.max_batch_size)
    with torch.no_grad():
        outputs = module(*example_inputs)
    _check_tensors("output", config.outputs, tuple(outputs) if isinstance(outputs, (tuple, list)) else (outputs,), None)

    model_dir = Path(repository) / config.name
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


def _model_config(
    config: ModelConfig | Mapping[str, Any] | None, name: str | None, fields: dict[str, Any]
) -> ModelConfig:
    """The config `write_model` was given, from any of its forms."""
    if isinstance(config, ModelConfig) and name in (None, config.name) and not fields:
        return config
    data = config.model_dump(exclude_unset=True) if isinstance(config, ModelConfig) else dict(config or {})
    data |= fields
    if name is not None:
        if data.setdefault("name", name) != name:
            raise ConfigError(f"write_model: name={name!r} but the config's name is {data['name']!r}")
    elif "name" not in data:
        raise ConfigError("write_model: the model needs a name (its folder in the repository): pass name='...'")
    try:
        return ModelConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(describe_validation("write_model", exc)) from None


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


# -- transformers models ------------------------------------------------------------------------------------------


class LogitsOf(nn.Module):
    """`input_ids` (INT64 [B, seq]), and `attention_mask` where given, → the logits of a `transformers` model: plain
    tensors in and one out, as the server's config and `torch.export` want; `last_position` keeps a causal LM's
    next-token logits only."""

    def __init__(self, model: nn.Module, *, last_position: bool = False) -> None:
        super().__init__()
        self.model = model
        self.last_position = last_position

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        if self.last_position:
            logits: torch.Tensor = self.model(
                input_ids=input_ids, attention_mask=attention_mask, use_cache=False, logits_to_keep=1
            ).logits
            return logits[:, -1]
        return self.model(input_ids=input_ids, attention_mask=attention_mask).logits


def write_sequence_classifier(
    repository: str | os.PathLike[str],
    model: nn.Module,
    *,
    name: str,
    sequence_length: int,
    max_batch_size: int = 16,
    version: int = 1,
    **fields: Any,
) -> Path:
    """Write a `transformers` sequence classifier (`AutoModelForSequenceClassification.from_pretrained(...)`, or
    any module called as `model(input_ids=..., attention_mask=...)` that returns `.logits` and has a
    `config.id2label`) as a model: inputs `input_ids` and `attention_mask` (INT64 [-1, sequence_length]), output
    `logits` (FP32 [-1, number of labels]) with the labels in `labels.txt`, so `--classes`/`class_count` answers
    name them. The tokenizer stays with the client, which pads or truncates to `sequence_length`:

        batch = tokenizer(texts, padding="max_length", truncation=True, max_length=sequence_length,
                          return_tensors="np")   # then send batch["input_ids"], batch["attention_mask"]

    `fields` are further config fields (`parameters`, `batching`, ...). Returns the artifact's path.
    """
    hf_config: Any = model.config  # a transformers PretrainedConfig
    labels = [str(label) for _, label in sorted(hf_config.id2label.items())]
    model_dir = Path(repository) / name
    model_dir.mkdir(parents=True, exist_ok=True)
    (model_dir / "labels.txt").write_text("".join(f"{label}\n" for label in labels))
    tokens = {"datatype": "INT64", "shape": [-1, sequence_length]}
    config = {
        "max_batch_size": max_batch_size,
        "inputs": [{"name": "input_ids", **tokens}, {"name": "attention_mask", **tokens}],
        "outputs": [{"name": "logits", "datatype": "FP32", "shape": [-1, len(labels)], "label_filename": "labels.txt"}],
    }
    example = torch.zeros(min(2, max_batch_size), sequence_length, dtype=torch.int64)
    return write_model(
        repository, config, LogitsOf(model), (example, torch.ones_like(example)), name=name, version=version, **fields
    )
