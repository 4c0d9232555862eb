"""Measure and record the GPU's stream profile (`adaserve.engine.stream_profile`) of the example models and
ResNet-50, and the worker set and MaxInf each latency target gets from it (`adaserve.engine.stream_choice`).

What a `device: cuda` model with no `workers` line measures at its first load, measured here afresh and stored in
each model's folder as the server would (`stream_profile.json`), with every profile and choice in one result file:

    python -m benchmarks.stream_profiles --output "$OUT/stream_profiles.json"     # on a GPU machine (~1-2 min)
    .venv/bin/python -m benchmarks.stream_profiles --device cpu --models mlp --quick   # a smoke run of the code

On a CPU the streams are threads running eagerly: a check that the code runs, whose figures say nothing of a GPU.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
from pathlib import Path
from typing import Any

import torch

from adaserve.config import BatchingSpec
from adaserve.cpu.profiler import ProfileSettings
from adaserve.engine.stream_choice import WAIT_AND_RUN, choose_streams
from adaserve.engine.stream_profile import LOAD_SETTINGS, measure_profile, save_profile, stream_key
from adaserve.repository import ModelRepository, ModelSpec
from benchmarks.common import RESULTS, SCRATCH, report_head, write_json
from benchmarks.packrat.models import REFERENCES, export_model

EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "models"
#: What serving a model writes into its folder, not copied with an example.
LEFT_BEHIND = ("profile.json", "stream_profile.json", "footprint.json")
#: The latency targets each profile is also chosen for, beside the default (milliseconds).
TARGETS_MS = (2.0, 5.0, 10.0, 20.0, 50.0)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="mlp,cnn,resnet50", help="example models and/or resnet50, comma-separated")
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--quick", action="store_true", help="trials of a few batches each (a smoke run)")
    parser.add_argument("--output", type=Path, default=RESULTS / "stream_profiles.json")
    args = parser.parse_args()
    settings = ProfileSettings.for_run(quick=True) if args.quick else LOAD_SETTINGS
    device = torch.device(args.device, 0) if args.device == "cuda" else torch.device("cpu")
    report = report_head("stream_profiles", {"models": args.models, "device": args.device, "quick": args.quick})
    report["driver"] = _driver()
    models = []
    for name in args.models.split(","):
        spec = _spec(name, args.device)
        profile = measure_profile(spec, device, settings, stream_key(spec, device))
        save_profile(spec.directory, profile)
        choices = {}
        for target in sorted({BatchingSpec().latency_target_ms, *TARGETS_MS}):
            chosen = choose_streams(profile, target)
            choices[f"{target:g}"] = {
                "granularities": list(chosen.granularities),
                "max_inflight": chosen.max_inflight,
                "expected_latency_ms": WAIT_AND_RUN * chosen.latency_s * 1e3,
                "expected_rows_per_s": chosen.rows_per_s,
                "meets_target": chosen.meets_target,
                "reason": chosen.reason,
            }
        print(f"{name}: {profile.key.describe()}; unstable cells: {profile.unstable() or 'none'}")
        for cell in profile.cells:
            print(
                f"  {cell.name:10s} {cell.mean_s * 1e3:8.3f} ms  {cell.streams * cell.batch / cell.mean_s:9.0f} rows/s"
            )
        print(f"  default target: {choices[f'{BatchingSpec().latency_target_ms:g}']['reason']}")
        models.append({"model": name, "profile": profile.model_dump(mode="json"), "choices": choices})
    write_json({**report, "models": models}, args.output)
    return 0


def _spec(name: str, device: str) -> ModelSpec:
    """An example model (a copy of its folder, so that the stored profile stays out of the examples) or a reference
    model exported with max_batch_size 16, on `device`."""
    repository = SCRATCH / "stream_profiles"
    if name in REFERENCES:
        spec, _ = export_model(repository, REFERENCES[name], max_batch_size=16)
    else:
        target = repository / name
        shutil.rmtree(target, ignore_errors=True)
        shutil.copytree(EXAMPLES / name, target, ignore=shutil.ignore_patterns(*LEFT_BEHIND))
        spec = ModelRepository(repository).read(name)
    config = spec.config.model_copy(update={"device": device})
    return ModelSpec(config, spec.version, spec.artifact, spec.versions)


def _driver() -> Any:
    """The NVIDIA driver's version, or None without nvidia-smi."""
    try:
        query = ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]
        return subprocess.run(query, capture_output=True, text=True, check=True).stdout.strip() or None
    except (OSError, subprocess.CalledProcessError):
        return None


if __name__ == "__main__":
    raise SystemExit(main())
