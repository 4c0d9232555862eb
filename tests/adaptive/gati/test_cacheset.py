"""Cache sets on disk: versions, round trip, lookups, and the errors for stale, corrupt and missing sets."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from adaserve.adaptive.gati.blocks import load_chain
from adaserve.adaptive.gati.cacheset import (
    CacheSet,
    CacheSetError,
    ExitRecord,
    load_cache_set,
    prune_adapted,
    versions,
    write_cache_set,
)
from adaserve.adaptive.gati.explore import build_cache_set
from adaserve.repository import ModelRepository, ModelSpec
from tests.adaptive.gati.conftest import TINY, write_tiny_mlp


@pytest.fixture
def built(tmp_path: Path, tiny_data: Path) -> tuple[ModelSpec, CacheSet]:
    spec = write_tiny_mlp(tmp_path / "models")
    return spec, build_cache_set(spec, str(tiny_data), TINY, targets=[0.95, 0.9], progress=False)


def test_a_build_writes_a_version_that_loads_back(built: tuple[ModelSpec, CacheSet]) -> None:
    spec, cache_set = built
    assert cache_set.directory == spec.directory / "caches" / "v1"
    keys = [v.key for v in cache_set.manifest.variants]
    assert keys == ["1-FC32", "1-Pool4", "3-FC32", "3-Pool4"]
    assert sorted(p.name for p in cache_set.directory.iterdir()) == sorted(
        ["manifest.json", "scores.npz", *(f"{k}.pt" for k in keys)]
    )
    loaded = load_cache_set(spec)
    assert (loaded.version, loaded.manifest) == (1, cache_set.manifest)
    manifest = loaded.manifest
    assert (manifest.model, manifest.model_version, manifest.num_classes) == ("tiny", 1, 3)
    assert manifest.data.rows == 400 and manifest.data.splits["evaluate"] == 80
    assert all(set(v.targets) == {"0.95", "0.9"} for v in manifest.variants)
    assert [(c.target, c.method, c.default) for c in manifest.compositions] == [
        (0.95, "milp", False),
        (0.95, "overall", True),
        (0.9, "milp", False),
        (0.9, "overall", True),
    ]
    arrays = loaded.scores()
    assert arrays["evaluate_scores"].shape == (4, 80)
    splits = ("fit_predictor", "fit_selector", "calibrate", "evaluate")
    assert sorted(np.concatenate([arrays[f"{split}_rows"] for split in splits])) == list(range(400))


def test_requests_pick_a_composition_by_accuracy(built: tuple[ModelSpec, CacheSet]) -> None:
    _, cache_set = built
    assert [cache_set.composition(a).target for a in (0.5, 0.9, 0.92, 0.95, 0.999)] == [0.9, 0.9, 0.95, 0.95, 0.95]
    assert all(cache_set.composition(a).method == "overall" for a in (0.9, 0.95))


def test_a_lookup_answers_for_every_row(built: tuple[ModelSpec, CacheSet]) -> None:
    spec, cache_set = built
    variant = cache_set.manifest.variants[2]  # after block 3
    composition = cache_set.composition(0.9)
    exit = ExitRecord(key=variant.key, block=variant.block, block_index=variant.block_index, threshold=0.5)
    (cache,) = cache_set.caches(composition.model_copy(update={"exits": (exit,)}))
    chain = load_chain(spec)
    with torch.no_grad():
        hit, logits, score = cache(chain.run(torch.rand(6, 8), 0, 4))
    assert logits.shape == (6, 3) and score.shape == (6,)
    assert torch.equal(hit, score >= 0.5)
    assert len(cache_set.caches(composition)) == len(composition.exits)


def test_versions_count_up(built: tuple[ModelSpec, CacheSet], tiny_data: Path) -> None:
    spec, first = built
    second = build_cache_set(spec, str(tiny_data), TINY, targets=[0.9], progress=False)
    assert second.version == 2 and load_cache_set(spec).version == 2
    assert load_cache_set(spec, 1).manifest == first.manifest
    with pytest.raises(CacheSetError, match=r"caches/v7: no such cache set \(versions: v1, v2\)"):
        load_cache_set(spec, 7)


def test_pruning_keeps_the_newest_adapted_versions_and_every_built_one(built: tuple[ModelSpec, CacheSet]) -> None:
    spec, cache_set = built
    adapted = cache_set.manifest.model_copy(update={"settings": {"adapted_from": "v1"}})
    for _ in range(4):  # v2..v5, as adaptation writes them
        write_cache_set(spec, adapted, {}, cache_set.scores())
    write_cache_set(spec, cache_set.manifest, {}, cache_set.scores())  # v6: a rebuild
    write_cache_set(spec, adapted, {}, cache_set.scores())  # v7
    (spec.directory / "caches" / "v8").mkdir()  # unreadable: what wrote it is unknown
    assert prune_adapted(spec.directory, keep=3) == [2, 3]
    assert versions(spec.directory) == [1, 4, 5, 6, 7, 8]
    assert sorted(p.name for p in (spec.directory / "caches").iterdir()) == [f"v{n}" for n in (1, 4, 5, 6, 7, 8)]
    assert prune_adapted(spec.directory, keep=3) == []
    assert load_cache_set(spec, 1).manifest == cache_set.manifest


def test_a_set_built_for_another_artifact_is_stale(built: tuple[ModelSpec, CacheSet]) -> None:
    spec, _ = built
    retrained = write_tiny_mlp(spec.directory.parent, seed=1)  # same name and version, other weights
    with pytest.raises(
        CacheSetError,
        match=r"stale cache set: built for tiny version 1 \(artifact sha256 \w{12}…\), "
        r"but tiny now serves version 1 \(sha256 \w{12}…\); rebuild it with `adaserve caches build",
    ):
        load_cache_set(retrained)
    (spec.directory / "2").mkdir()
    (spec.directory / "2" / "model.pt2").write_bytes(spec.artifact.read_bytes())
    with pytest.raises(CacheSetError, match="but tiny now serves version 2"):
        load_cache_set(ModelRepository(spec.directory.parent).read("tiny"))


def test_corrupt_and_missing_sets_are_named(built: tuple[ModelSpec, CacheSet], tmp_path: Path) -> None:
    spec, cache_set = built
    (cache_set.directory / "1-FC32.pt").write_bytes(b"not a torch file")
    variant = cache_set.manifest.variants[0]
    exit = ExitRecord(key=variant.key, block=variant.block, block_index=variant.block_index, threshold=0.5)
    composition = cache_set.composition(0.9).model_copy(update={"exits": (exit,)})
    with pytest.raises(CacheSetError, match=r"1-FC32\.pt: cannot load the cache's weights"):
        cache_set.caches(composition)
    (cache_set.directory / "manifest.json").write_text('{"format": 1, "model": "tiny"}')
    with pytest.raises(CacheSetError, match=r"manifest\.json: not a valid cache manifest: Field required at"):
        load_cache_set(spec)
    other = write_tiny_mlp(tmp_path / "elsewhere")
    with pytest.raises(CacheSetError, match="model 'tiny' has no cache set; build one with `adaserve caches build"):
        load_cache_set(other)
