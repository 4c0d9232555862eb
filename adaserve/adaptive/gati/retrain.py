"""`python -m adaserve.adaptive.gati.retrain ROOT MODEL WINDOW.npy`: one cache adaptation, in a process of its own.

The server's adaptation service (`service.py`) starts it when its trigger fires, so seconds of retraining never run
on the serving event loop; it runs on one intra-op thread, beside the workers rather than in their place. It
retrains the default composition (the config's first target) of the newest cache set on the window's rows mixed
with the data the set was built from (`adapt`), deploys the result as the next version when it is accepted (then
removes the adapted versions beyond `keep_versions`), and prints one JSON line: accepted, reason, the deployed
version, the versions removed, the timings.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import torch

from adaserve.adaptive.gati.adapt import AdaptSettings, adapt, deploy
from adaserve.adaptive.gati.blocks import load_chain
from adaserve.adaptive.gati.cacheset import load_cache_set, prune_adapted
from adaserve.adaptive.gati.explore import load_build_data
from adaserve.adaptive.gati.predictors import TrainSettings
from adaserve.config import AdaptationSpec
from adaserve.repository import ModelRepository


def retrain(root: Path, name: str, window: Path) -> dict[str, object]:
    spec = ModelRepository(root).read(name)
    assert spec.config.caches is not None
    cache_set = load_cache_set(spec, "latest")
    composition = cache_set.composition(spec.config.caches.targets[0])
    data = cache_set.manifest.data
    validation_x, _, _ = load_build_data(data.source, data.fit_source, spec.config)
    adaptation = spec.config.caches.adaptation or AdaptationSpec()  # run by hand on a model without the section
    settings = AdaptSettings(train=TrainSettings(epochs=adaptation.epochs), selector_steps=adaptation.selector_steps)
    rows = np.load(window, allow_pickle=False)
    result = adapt(load_chain(spec), cache_set, composition, rows, validation_x, settings)
    deployed = deploy(spec, result).version if result.accepted else None
    removed = prune_adapted(spec.directory, adaptation.keep_versions) if result.accepted else []
    return {
        "accepted": result.accepted,
        "reason": result.reason,
        "source_version": result.source_version,
        "version": deployed,
        "removed_versions": removed,
        "retrain_s": round(result.retrain_s, 3),
        "forward_s": round(result.forward_s, 3),
    }


def main() -> None:
    torch.set_num_threads(1)
    root, name, window = sys.argv[1:4]
    print(json.dumps(retrain(Path(root), name, Path(window))), flush=True)


if __name__ == "__main__":
    main()
