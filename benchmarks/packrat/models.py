"""The Packrat benchmarks' models: built from `adaserve.zoo`, exported once, profiled with adaserve's own profiler.

A model is exported into a scratch repository (`benchmarks/results/tmp/packrat/repo`) the first time and kept: its
profile is keyed by the artifact's digest, so re-exporting would make the stored profile stale. The profile is
measured by `adaserve.cpu.profiler.profile_model` and reused while it matches this machine, the artifact and the
asked grid (T threads, batches up to `max_batch`, at least as thorough as asked); on this shared machine a
measurement during which other work was busy is made again (bounded) and the quietest kept.
"""

from __future__ import annotations

import dataclasses
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import nn

from adaserve import zoo
from adaserve.config import ModelConfig
from adaserve.cpu.profiler import (
    ProfileError,
    ProfileRecord,
    ProfileSettings,
    StaleProfile,
    batch_grid,
    fingerprint,
    load_profile,
    profile_model,
    random_inputs,
    save_profile,
)
from adaserve.cpu.topology import Topology
from adaserve.export import write_model
from adaserve.repository import ModelRepository, ModelSpec
from benchmarks.common import machine_busy_s, wait_for_quiet

_IMAGE = {"name": "image", "datatype": "FP32", "shape": [-1, 3, 224, 224]}
_IMAGENET = {"name": "logits", "datatype": "FP32", "shape": [-1, 1000]}


@dataclass(frozen=True)
class Reference:
    """One benchmark model: how to build it, its tensors, and what it is, for the report."""

    name: str
    build: Callable[[], nn.Module]
    inputs: tuple[dict[str, Any], ...]
    outputs: tuple[dict[str, Any], ...]
    description: str
    bar: bool  # the speedup bar applies (its CNNs)


REFERENCES: dict[str, Reference] = {
    ref.name: ref
    for ref in (
        Reference(
            "resnet50", zoo.resnet50_style, (_IMAGE,), (_IMAGENET,), "ResNet-50 (zoo.resnet50_style), 3×224×224", True
        ),
        Reference(
            "inception",
            zoo.inception_style,
            (_IMAGE,),
            (_IMAGENET,),
            "GoogLeNet / Inception v1 (zoo.inception_style), 3×224×224",
            True,
        ),
        Reference("vgg16", zoo.vgg16_style, (_IMAGE,), (_IMAGENET,), "VGG-16 (zoo.vgg16_style), 3×224×224", True),
        Reference(
            "bert",
            zoo.bert_base_style,
            ({"name": "input_ids", "datatype": "INT64", "shape": [-1, 128]},),
            ({"name": "logits", "datatype": "FP32", "shape": [-1, 2]},),
            "BERT-base (zoo.bert_base_style: transformers BertConfig, random weights), 128 tokens, 2 classes",
            False,
        ),
        Reference(
            "resnet18",
            zoo.resnet,
            ({"name": "image", "datatype": "FP32", "shape": [-1, 3, 64, 64]},),
            (_IMAGENET,),
            "ResNet-18 (zoo.resnet) at 3×64×64, the reconfiguration timeline's model: batching halves its cost per row",
            False,
        ),
        Reference(
            "mlp",
            lambda: zoo.mlp([256, 512, 512, 10]),
            ({"name": "x", "datatype": "FP32", "shape": [-1, 256]},),
            ({"name": "y", "datatype": "FP32", "shape": [-1, 10]},),
            "a 256-512-512-10 MLP (zoo.mlp): the smoke tests' model, the least that runs every step",
            False,
        ),
    )
}


def export_model(repository: Path, reference: Reference, max_batch_size: int) -> tuple[ModelSpec, bool]:
    """The model in `repository`, exported (seeded random weights, dynamic batch up to `max_batch_size`) unless an
    artifact for that `max_batch_size` is already there; returns the spec and whether it was exported now."""
    models = ModelRepository(repository) if repository.is_dir() else None
    if models is not None and reference.name in models.names():
        spec = models.read(reference.name)
        if spec.config.max_batch_size == max_batch_size:
            return spec, False
    import torch

    torch.manual_seed(0)
    config = ModelConfig.model_validate(
        {
            "name": reference.name,
            "max_batch_size": max_batch_size,
            "inputs": reference.inputs,
            "outputs": reference.outputs,
        }
    )
    repository.mkdir(parents=True, exist_ok=True)
    write_model(repository, config, reference.build(), tuple(random_inputs(config, 2, seed=0)))
    return ModelRepository(repository).read(reference.name), True


@dataclass(frozen=True)
class Measurement:
    """How a profile was obtained: reused, or measured (with the cores other work took during each attempt)."""

    how: str
    other_cores: tuple[float, ...] = ()  # per attempt, the kept one is the lowest


def ensure_profile(
    spec: ModelSpec,
    threads: int,
    max_batch: int,
    settings: ProfileSettings,
    topology: Topology,
    *,
    force: bool = False,
    attempts: int = 1,
    noise_cores: float = math.inf,
    quiet_s: float = 0.0,
) -> tuple[ProfileRecord, Measurement]:
    """This machine's profile of `spec` for t = 1..`threads`, b = 1, 2, 4, .. ≤ `max_batch`: the stored one when it
    covers that grid and is at least as thorough as `settings` (unless `force`), else measured now and stored.

    The machine is shared, and a profile measured while other work runs is wrong for good (the 2-thread cells most):
    after a quiet second (waiting at most `quiet_s`), a measurement during which others took more than
    `noise_cores` is made again, `attempts` in all, and the quietest stored.
    """
    try:
        found: ProfileRecord | StaleProfile | None = load_profile(spec.directory, fingerprint(topology), spec)
        why = found.reason if isinstance(found, StaleProfile) else "asked to measure again"
    except ProfileError as exc:  # corrupt: measuring again replaces it
        found, why = None, str(exc)
    if isinstance(found, ProfileRecord) and not force:
        grid = set(range(1, threads + 1)) <= set(found.threads) and set(batch_grid(max_batch)) <= set(found.batches)
        if grid and (settings.quick or not found.settings.quick):
            return found, Measurement(f"reused the profile of {found.created}")
        why = "the stored profile does not cover the asked grid or is a quick one"
    # The grid follows max_batch_size; profiling a copy of the config with a smaller one measures fewer batches.
    profiled = dataclasses.replace(spec, config=spec.config.model_copy(update={"max_batch_size": max_batch}))
    tries: list[tuple[float, ProfileRecord]] = []
    while len(tries) < attempts and (not tries or tries[-1][0] > noise_cores):
        wait_for_quiet(quiet_s)
        began, busy, ours = time.monotonic(), machine_busy_s(), _own_cpu_s()
        record = profile_model(profiled, threads, settings, topology=topology)
        wall = max(time.monotonic() - began, 1e-3)
        tries.append((max(0.0, (machine_busy_s() - busy - (_own_cpu_s() - ours)) / wall), record))
    record = min(tries, key=lambda t: t[0])[1]
    save_profile(spec.directory, record)
    return record, Measurement(f"measured now ({why})", tuple(round(t[0], 3) for t in tries))


def _own_cpu_s() -> float:
    """CPU seconds of this process and of its children that have exited (the profiler's, one per t)."""
    times = os.times()
    return times.user + times.system + times.children_user + times.children_system
