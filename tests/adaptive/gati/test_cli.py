"""`caches build`'s config block: the default target it chooses, the block it writes or prints, and what `caches list`
and `models list` say a request that sets no parameter gets."""

from __future__ import annotations

from pathlib import Path

import pytest

from adaserve.adaptive.gati.cacheset import (
    ChainRecord,
    CompositionRecord,
    ExitRecord,
    Manifest,
    load_cache_set,
    rewrite_manifest,
)
from adaserve.adaptive.gati.cli import _say_config, caches_block, choose_default
from adaserve.adaptive.gati.explore import build_cache_set
from adaserve.repository import ModelRepository
from tests.adaptive.gati.conftest import TINY, write_tiny_mlp
from tests.adaptive.gati.test_build import adaserve


def composition(target: float, exits: bool, *, default: bool = True, block: str = "0") -> CompositionRecord:
    """A certified composition at `target` with one exit after `block` (hit rate .4) or none."""
    chain = ChainRecord(agreement=target + 0.005, mean_latency_s=1e-3, exit_rates=(0.4,) if exits else ())
    exit = ExitRecord(key=f"{block}-FC32", block=block, block_index=0, threshold=0.9)
    return CompositionRecord(
        method="overall",
        target=target,
        alpha=0.2,
        memory_budget_bytes=None,
        exits=(exit,) if exits else (),
        memory_bytes=1000,
        calibrate=chain,
        evaluate=chain,
        default=default,
    )


def with_compositions(manifest: Manifest, *compositions: CompositionRecord) -> Manifest:
    return manifest.model_copy(update={"compositions": compositions})


@pytest.fixture
def built(tmp_path: Path, tiny_data: Path) -> Manifest:
    """A tiny MLP without a caches block, and its cache set."""
    return build_cache_set(write_tiny_mlp(tmp_path), str(tiny_data), TINY, targets=[0.9], progress=False).manifest


def test_the_default_is_the_strictest_target_that_deploys_an_exit(built: Manifest) -> None:
    manifest = with_compositions(
        built,
        composition(0.99, exits=False),
        composition(0.99, exits=True, default=False),  # not certified: never served
        composition(0.98, exits=True),
        composition(0.95, exits=True),
    )
    chosen = choose_default(manifest)
    assert chosen is not None and chosen.target == 0.98
    assert choose_default(with_compositions(built, composition(0.99, exits=False))) is None
    assert caches_block(0.98, [0.99, 0.98, 0.95]) == "{targets: [0.98, 0.99, 0.95]}"


def test_the_build_prints_writes_or_keeps_the_block(
    tmp_path: Path, built: Manifest, capsys: pytest.CaptureFixture[str]
) -> None:
    repository = ModelRepository(tmp_path)
    spec = repository.read("tiny")
    config = spec.directory / "config.yaml"
    before = config.read_text()
    manifest = with_compositions(built, composition(0.99, exits=False), composition(0.95, exits=True))
    rewrite_manifest(load_cache_set(spec).directory, manifest)

    _say_config(spec, manifest, [0.99, 0.95], print_only=True)
    printed = capsys.readouterr().out
    assert "default target 0.95, the strictest that deploys an exit: exits after 0, hit rate 0.400 at agreement " in (
        printed
    )
    assert f"to serve it, add to {config}:\n  caches: {{targets: [0.95, 0.99]}}\n" in printed
    assert config.read_text() == before

    _say_config(spec, manifest, [0.99, 0.95], print_only=False)
    assert "added `caches: {targets: [0.95, 0.99]}`" in capsys.readouterr().out
    spec = repository.read("tiny")
    assert spec.config.caches is not None and spec.config.caches.targets == (0.95, 0.99)

    written = config.read_text()
    _say_config(spec, manifest, [0.99, 0.95], print_only=False)
    kept = "config.yaml keeps its `caches:` block: a request that sets no parameter gets target 0.95: exits after 0"
    assert kept in capsys.readouterr().out and config.read_text() == written

    assert adaserve("caches", "list", "--model-repository", str(tmp_path)) == 0  # every model with caches
    assert "a request that sets no parameter gets target 0.95: exits after 0, hit rate 0.400" in (
        capsys.readouterr().out
    )
    assert adaserve("models", "list", "--model-repository", str(tmp_path)) == 0
    assert "\tdefault=early exit target 0.95: exits after 0, hit rate 0.400" in capsys.readouterr().out


def test_no_block_when_no_target_deploys_an_exit(
    tmp_path: Path, built: Manifest, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = ModelRepository(tmp_path).read("tiny")
    before = (spec.directory / "config.yaml").read_text()
    _say_config(spec, with_compositions(built, composition(0.99, exits=False)), [0.99], print_only=False)
    assert "no target deploys an exit on tiny, so no caches block was added" in capsys.readouterr().out
    assert (spec.directory / "config.yaml").read_text() == before
