"""Shared fixtures of the GATI tests: one thread (the machine is shared), small models and tiny cache sets."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from adaserve.adaptive.gati.cacheset import CacheSet, load_cache_set, rewrite_manifest
from adaserve.adaptive.gati.compose import compose
from adaserve.adaptive.gati.explore import ExploreSettings, build_cache_set
from adaserve.adaptive.gati.predictors import TrainSettings, VariantSpec
from adaserve.config import ModelConfig, TensorSpec
from adaserve.export import ArtifactFormat, write_model
from adaserve.repository import ModelRepository, ModelSpec
from adaserve.zoo import mlp

torch.set_num_threads(1)

#: Exploration small enough for a test: two variants, one epoch, few timing runs.
TINY = ExploreSettings(
    variants=(VariantSpec.parse("FC(32)"), VariantSpec.parse("Pool(4)")),
    train=TrainSettings(epochs=1),
    selector_steps=50,
    latency_repeats=5,
)


def write_tiny_mlp(repository: Path, name: str = "tiny", *, seed: int = 0, **config: object) -> ModelSpec:
    """An 8-16-16-3 MLP exported into `repository`; `config` adds config fields (e.g. `caches`)."""
    torch.manual_seed(seed)
    spec = ModelConfig(
        name=name,
        max_batch_size=16,
        inputs=(TensorSpec(name="x", datatype="FP32", shape=(-1, 8)),),
        outputs=(TensorSpec(name="y", datatype="FP32", shape=(-1, 3)),),
        **config,  # type: ignore[arg-type]
    )
    write_model(repository, spec, mlp([8, 16, 16, 3]), (torch.rand(2, 8),))
    return ModelRepository(repository).read(name)


def write_zoo_model(
    repository: Path, name: str, module: torch.nn.Module, row_shape: tuple[int, ...], fmt: ArtifactFormat
) -> ModelSpec:
    config = ModelConfig(
        name=name,
        max_batch_size=4,
        inputs=(TensorSpec(name="x", datatype="FP32", shape=(-1, *row_shape)),),
        outputs=(TensorSpec(name="y", datatype="FP32", shape=(-1, 10)),),
    )
    write_model(repository, config, module.eval(), (torch.rand(2, *row_shape),), fmt=fmt)
    return ModelRepository(repository).read(name)


@pytest.fixture
def tiny_data(tmp_path: Path) -> Path:
    """400 rows of 8 features with 3 classes that an MLP separates, as an .npz."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(400, 8)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int64) + (x[:, 1] > 1).astype(np.int64)
    path = tmp_path / "tiny.npz"
    np.savez(path, x=x, y=y)
    return path


def build_timed_alike(
    spec: ModelSpec, settings: ExploreSettings, targets: list[float], fit_source: str | None = None, **options: float
) -> CacheSet:
    """`build_cache_set`, then composed again (with `options` for `compose`) as if every block took 1 ms and every
    lookup 0.1 ms: composition weighs latencies measured while building, so on a busy machine the same seeded build
    could choose other exits (or none); tests that need known exits fix the latencies."""
    cache_set = build_cache_set(spec, "fashion-mnist", settings, targets=targets, fit_source=fit_source, progress=False)
    manifest = cache_set.manifest
    timed_alike = manifest.model_copy(
        update={
            "block_latency_s": tuple(1e-3 for _ in manifest.block_latency_s),
            "base_latency_s": 1e-3 * len(manifest.block_latency_s),
            "variants": tuple(v.model_copy(update={"lookup_latency_s": 1e-4}) for v in manifest.variants),
        }
    )
    rewrite_manifest(cache_set.directory, compose(timed_alike, cache_set.scores(), targets, **options))
    return load_cache_set(spec, cache_set.version)
