"""Real models for the mCache benchmarks, and what each costs a cache: size, load penalty, batch-1 execution time.

Every model is built by `adaserve.zoo` (seeded random weights), written to a scratch repository with
`adaserve.export.write_model` (a `torch.export` program with a dynamic batch), and measured in a fresh process
(spawned, one thread), so the memory and time of one model never leak into the next:

* size = parameters + buffers + workspace, the workspace being the growth of the process's peak RSS (VmHWM, reset
  through /proc/self/clear_refs) over one batch-1 forward after the load;
* load penalty = `adaserve.repository.load_artifact` on the artifact, the median of `loads` loads (each model is
  measured after a wait, bounded, for a quiet second on the machine; the wait and the load averages are kept);
* execution time = the median of `runs` batch-1 forwards after one warm-up.

`measure_models()` is what the simulator benchmark uses and what the real-server benchmark can reuse.
"""

from __future__ import annotations

import gc
import multiprocessing
import statistics
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from adaserve import zoo
from adaserve.config import ModelConfig
from adaserve.export import write_model
from adaserve.repository import load_artifact
from benchmarks.common import DEFAULT_SET_ONLY, load_average, wait_for_quiet

MAX_BATCH_SIZE = 8
SEQ_LEN = 32
#: VGG-11 ("A" in Simonyan & Zisserman).
VGG11_CFG: tuple[int | str, ...] = (64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M")


@dataclass(frozen=True)
class Candidate:
    """A model to measure: how to build it, and the shape and datatype of one input row."""

    name: str
    family: str
    build: Callable[[], nn.Module]
    row_shape: tuple[int, ...]
    datatype: str = "FP32"

    def example(self, batch: int) -> torch.Tensor:
        return _example(self.row_shape, self.datatype, batch)


def _example(row_shape: tuple[int, ...], datatype: str, batch: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(0)
    if datatype == "INT64":
        return torch.randint(0, 1000, (batch, *row_shape), generator=generator)
    return torch.rand((batch, *row_shape), generator=generator)


def _bert(layers: int, hidden: int) -> Callable[[], nn.Module]:
    return lambda: zoo.bert_base_style(layers=layers, hidden=hidden)


def _gpt2(layers: int, hidden: int) -> Callable[[], nn.Module]:
    return lambda: zoo.gpt2_style(layers=layers, hidden=hidden)


#: From a fraction of a MB to ~150 MB, CNNs, MLPs and transformers; chosen so that the largest stays near a fifth
#: of the total, as the 20% cache size needs (a model larger than the budget can never be served).
CATALOGUE: tuple[Candidate, ...] = (
    Candidate("fashion_cnn", "cnn", zoo.FashionCNN, (1, 28, 28)),
    Candidate("mlp_small", "mlp", lambda: zoo.mlp([784, 256, 256, 10]), (784,)),
    Candidate("mlp_large", "mlp", lambda: zoo.mlp([784, 2048, 2048, 2048, 10]), (784,)),
    Candidate("inception", "cnn", zoo.inception_style, (3, 224, 224)),
    Candidate("resnet18", "cnn", zoo.resnet, (3, 224, 224)),
    Candidate("resnet34", "cnn", lambda: zoo.resnet((3, 4, 6, 3)), (3, 224, 224)),
    Candidate("resnet50", "cnn", zoo.resnet50_style, (3, 224, 224)),
    Candidate("vgg11_h1024", "cnn", lambda: zoo.vgg(VGG11_CFG, hidden=1024), (3, 224, 224)),
    Candidate("bert_l4_h512", "transformer", _bert(4, 512), (SEQ_LEN,), "INT64"),
    Candidate("bert_l6_h512", "transformer", _bert(6, 512), (SEQ_LEN,), "INT64"),
    Candidate("gpt2_l4_h512", "transformer", _gpt2(4, 512), (SEQ_LEN,), "INT64"),
)  # fmt: skip


def tensor_bytes(module: nn.Module) -> int:
    """Parameters and buffers, each shared tensor counted once."""
    tensors = {id(t): t for t in (*module.parameters(), *module.buffers())}
    return sum(t.numel() * t.element_size() for t in tensors.values())


def export(candidate: Candidate, repository: Path) -> tuple[Path, int]:
    """Write the candidate into `repository`; returns the artifact's path and its parameter + buffer bytes."""
    torch.manual_seed(0)
    module = candidate.build().eval()
    example = candidate.example(2)
    with torch.no_grad():
        width = module(example).shape[1:]
    config = ModelConfig.model_validate(
        {
            "name": candidate.name,
            "max_batch_size": MAX_BATCH_SIZE,
            "inputs": [{"name": "input", "datatype": candidate.datatype, "shape": [-1, *candidate.row_shape]}],
            "outputs": [{"name": "output", "datatype": "FP32", "shape": [-1, *width]}],
            "packrat": DEFAULT_SET_ONLY,
        }
    )
    return write_model(repository, config, module, (example,)), tensor_bytes(module)


def _memory_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def _measure_in_child(
    artifact: Path, row_shape: tuple[int, ...], datatype: str, loads: int, runs: int
) -> dict[str, Any]:
    """Runs in a fresh spawned process: load timings, workspace, execution time."""
    torch.set_num_threads(1)
    torch.zeros(1).add_(1)  # first-op setup is not the model's cost
    load_s = []
    module: Any = None
    for _ in range(loads):
        module = None
        gc.collect()
        began = time.perf_counter()
        module = load_artifact(artifact, MAX_BATCH_SIZE)
        load_s.append(time.perf_counter() - began)
    row = _example(row_shape, datatype, 1)
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
    before_kib = _memory_kib("VmRSS")
    with torch.no_grad():
        module(row)
        workspace = max(0, _memory_kib("VmHWM") - before_kib) * 1024
        exec_s = []
        for _ in range(runs):
            began = time.perf_counter()
            module(row)
            exec_s.append(time.perf_counter() - began)
    return {"load_s_all": load_s, "workspace_bytes": workspace, "exec_s_all": exec_s}


def measure_models(
    scratch: Path, names: list[str] | None = None, *, loads: int = 5, runs: int = 5, log: Callable[[str], None] = print
) -> dict[str, dict[str, Any]]:
    """Measure the catalogue (or the named candidates); returns {name: {size_bytes, load_s, exec_s, ...}}."""
    chosen = [c for c in CATALOGUE if names is None or c.name in names]
    repository = scratch / "models"
    figures = {}
    context = multiprocessing.get_context("spawn")
    for candidate in chosen:
        began = time.monotonic()
        artifact, weights = export(candidate, repository)
        quiet = wait_for_quiet(max_wait_s=20.0)  # the machine is shared: time loads in a quiet moment if one comes
        load_before = load_average()
        with ProcessPoolExecutor(max_workers=1, mp_context=context) as pool:
            child = pool.submit(
                _measure_in_child, artifact, candidate.row_shape, candidate.datatype, loads, runs
            ).result()
        figures[candidate.name] = {
            "size_bytes": weights + child["workspace_bytes"],
            "load_s": statistics.median(child["load_s_all"]),
            "exec_s": statistics.median(child["exec_s_all"]),
            "family": candidate.family,
            "parameter_bytes": weights,
            "workspace_bytes": child["workspace_bytes"],
            "artifact_bytes": artifact.stat().st_size,
            "load_s_all": child["load_s_all"],
            "exec_s_all": child["exec_s_all"],
            "quiet_wait": quiet,
            "load_average": [load_before, load_average()],
        }
        entry = figures[candidate.name]
        log(
            f"{candidate.name}: {entry['size_bytes'] / 2**20:.1f} MiB ({weights / 2**20:.1f} weights), "
            f"load {entry['load_s'] * 1e3:.0f} ms, exec {entry['exec_s'] * 1e3:.1f} ms "
            f"({time.monotonic() - began:.0f} s)"
        )
    return figures
