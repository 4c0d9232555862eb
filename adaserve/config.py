"""Model configuration: the typed, validated contents of `models/<name>/config.yaml`.

Every field is documented where it is declared; unknown fields are refused so a typo never passes silently.
A config error names the file, the field and what is wrong (`ConfigError`).
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any, Literal, TypeVar

import numpy as np
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator

from adaserve.errors import ConfigError

#: Open Inference Protocol datatypes the engine can carry, and their numpy equivalents.
DATATYPES: dict[str, np.dtype] = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype(np.uint8),
    "UINT16": np.dtype(np.uint16),
    "UINT32": np.dtype(np.uint32),
    "UINT64": np.dtype(np.uint64),
    "INT8": np.dtype(np.int8),
    "INT16": np.dtype(np.int16),
    "INT32": np.dtype(np.int32),
    "INT64": np.dtype(np.int64),
    "FP16": np.dtype(np.float16),
    "FP32": np.dtype(np.float32),
    "FP64": np.dtype(np.float64),
}

#: Ebird's worker granularities (§VI-C), capped at `max_batch_size` when none are configured.
EBIRD_GRANULARITIES = (1, 1, 2, 4, 8, 16)


def cpu_busy_threads() -> int:
    """`batching.max_busy_threads` on a CPU when the config leaves it out: the CPUs this server may use, less one
    for its frontend (HTTP and gRPC, the copies into the pool, the answers), which runs on the same cores; at least
    one. On two cores, workers busy on both made the frontend time-share with them: the example CNN's closed-loop
    capacity was 5,052-5,529 req/s against 7,549-8,111 with one core left to the frontend."""
    return max(1, len(os.sched_getaffinity(0)) - 1)


BatchingPolicyName = Literal["elastic", "fixed-timeout", "none"]


class Strict(BaseModel):
    """A config section: unknown fields are refused, and a validated section never changes."""

    model_config = ConfigDict(extra="forbid", frozen=True)


Document = TypeVar("Document", bound=BaseModel)


class TensorSpec(Strict):
    """One input or output: `{name: image, datatype: FP32, shape: [-1, 784]}`; -1 marks the batch dimension."""

    name: str = Field(min_length=1, description="the tensor's name, as requests and responses carry it")
    datatype: str = Field(
        description="an Open Inference Protocol datatype the engine carries: BOOL, UINT8 to UINT64, INT8 to INT64, "
        "FP16, FP32 or FP64"
    )
    shape: tuple[int, ...] = Field(
        description="-1 first for the batch dimension, then fixed sizes (the input pool holds fixed-size slots)"
    )
    label_filename: str | None = Field(
        default=None,
        description="outputs only (Triton's): a file in the model's folder, one class name a line, which the "
        "classification extension adds to each class it answers",
    )

    @field_validator("label_filename")
    @classmethod
    def _a_file_of_the_model(cls, value: str | None) -> str | None:
        if value is not None and (not value or "/" in value or value in (".", "..")):
            raise ValueError(f"label_filename must name a file in the model's folder, got {value!r}")
        return value

    @field_validator("datatype")
    @classmethod
    def _known_datatype(cls, value: str) -> str:
        if value not in DATATYPES:
            raise ValueError(f"unknown datatype {value!r}; expected one of {', '.join(DATATYPES)}")
        return value

    @field_validator("shape")
    @classmethod
    def _batch_first(cls, value: tuple[int, ...]) -> tuple[int, ...]:
        if not value or value[0] != -1:
            raise ValueError("the first dimension must be -1 (the batch dimension)")
        if any(d <= 0 for d in value[1:]):
            raise ValueError(
                "dimensions after the batch dimension must be fixed positive sizes (the input pool "
                f"holds fixed-size slots); got {list(value)}"
            )
        return value

    @property
    def dtype(self) -> np.dtype:
        return DATATYPES[self.datatype]

    @property
    def row_shape(self) -> tuple[int, ...]:
        """The shape of one batch row (the shape without the batch dimension)."""
        return self.shape[1:]

    @property
    def row_bytes(self) -> int:
        return int(math.prod(self.row_shape)) * self.dtype.itemsize


class WorkerSpec(Strict):
    """One worker process: it runs batches of up to `batch` rows with `threads` intra-op threads."""

    batch: int = Field(ge=1, description="batch granularity: the rows this worker takes per batch")
    threads: int = Field(default=1, ge=1, description="torch intra-op threads inside the worker")
    cpus: tuple[int, ...] | None = Field(default=None, description="CPU ids to pin the worker to (optional)")

    @field_validator("cpus")
    @classmethod
    def _some(cls, cpus: tuple[int, ...] | None) -> tuple[int, ...] | None:
        """Whether they exist on this machine is checked where a model is read to be served (`repository`): the
        type also describes plans for other machines."""
        if cpus is not None and not cpus:
            raise ValueError("name at least one CPU, or leave cpus out")
        return cpus


class QueuePolicySpec(Strict):
    """Triton's ModelQueuePolicy: how long a request of one priority level may wait, what happens when it has
    waited too long, and how many of the level's rows may wait at once."""

    timeout_action: Literal["reject", "delay"] = Field(
        default="reject",
        description="a request whose timeout passes before any of its rows started: reject (503), or delay (it "
        "waits on, behind every request of its level still within its timeout, ahead of the lower levels)",
    )
    default_timeout_us: int = Field(
        default=0, ge=0, description="the timeout of a request that sets none (microseconds); 0: none"
    )
    allow_timeout_override: bool = Field(
        default=True,
        description="whether a request's `timeout` parameter counts: it may shorten default_timeout_us, never "
        "lengthen it (Triton's rule; Triton's default is false, which ignores tritonclient's timeout unasked)",
    )
    max_queue_size: int = Field(
        default=0,
        ge=0,
        description="rows of this level waiting at once, beyond which its requests get 503; 0: "
        "bounded only by the model's max_queue_size",
    )


class BatchingSpec(Strict):
    """How ready requests become batches; the paper's baselines are values of `policy`."""

    policy: BatchingPolicyName = Field(default="elastic", description="elastic (Ebird) | fixed-timeout | none")
    max_queue_delay_us: int = Field(
        default=1000, ge=0, description="fixed-timeout: longest wait to fill max_batch_size (Triton's name)"
    )
    max_busy_threads: int | None = Field(
        default=None,
        ge=0,
        description="busy workers' threads stay within this. On CPU the default is the CPUs the server may use less "
        "one for the frontend, at least one (with workers: auto, Packrat's T); on CUDA a stream worker counts one and "
        "the default is no limit, Ebird's GPU form; 0: no limit",
    )
    max_busy_threads_saturated: int | None = Field(
        default=None,
        ge=1,
        description="busy workers' threads stay within this instead, while some worker was busy at least 80% of "
        "the last second: then rows wait for a busy worker and run as one larger batch rather than start beside it "
        "(for CUDA streams, whose batches side by side ran slower than alone); default: off",
    )
    latency_target_ms: float = Field(
        default=100.0,
        gt=0,
        allow_inf_nan=False,
        description="device cuda with no workers line: the stream set and MaxInf are the highest throughput of the "
        "GPU's stream profile whose latency at high load (twice the batch latency: a wait for a busy stream, then "
        "its own batch) stays within this (milliseconds)",
    )
    idle_spin_us: int = Field(
        default=5000,
        ge=0,
        le=1_000_000,
        description="CPU workers: a worker that ran a batch while no other was busy (and within max_busy_threads) "
        "polls for its next one this long before it sleeps, until another worker starts, so a request at low load "
        "finds it awake; it costs up to a core while requests come faster than this. Only while workers were busy "
        "under half of the last second and the frontend process leaves a core free. 0: sleep at once. Not on CUDA, "
        "nor with one CPU",
    )
    share_cores: bool = Field(
        default=True,
        description="CPU workers: max_busy_threads and polling count the busy workers of every other CPU model of "
        "the server that shares cores, and freed threads go to the model whose oldest row waited longest; false "
        "for a model whose workers are pinned (cpus) to cores no other model uses: it then counts only its own",
    )
    priority_levels: int = Field(
        default=0,
        ge=0,
        description="Triton's priority levels: a request's `priority` parameter (1 the highest, up to this) is its "
        "level, and the next batch holds the oldest request of the highest level waiting; 0: off, every request "
        "waits in arrival order",
    )
    default_priority_level: int | None = Field(
        default=None,
        ge=1,
        description="the level of a request with no priority, priority 0, or one above priority_levels; default "
        "the lowest (priority_levels)",
    )
    default_queue_policy: QueuePolicySpec = Field(
        default=QueuePolicySpec(), description="the queue policy of every level without one of its own"
    )
    priority_queue_policy: dict[int, QueuePolicySpec] = Field(
        default_factory=dict, description="level → its own queue policy (Triton's map), replacing the default"
    )

    @field_validator("default_priority_level")
    @classmethod
    def _within_levels(cls, value: int | None, info: ValidationInfo) -> int | None:
        levels = info.data.get("priority_levels", 0)
        if value is not None and value > levels:
            raise ValueError(f"default_priority_level {value} is not one of the {levels} priority_levels")
        return value

    @field_validator("priority_queue_policy")
    @classmethod
    def _known_levels(cls, value: dict[int, QueuePolicySpec], info: ValidationInfo) -> dict[int, QueuePolicySpec]:
        levels = info.data.get("priority_levels", 0)
        unknown = sorted(level for level in value if not 1 <= level <= levels)
        if unknown:
            raise ValueError(f"level {unknown[0]} is not one of the {levels} priority_levels")
        return value


class ResponseCacheSpec(Strict):
    """Triton's `response_cache`: this model's answers are kept in the server's response cache (`--cache-config`),
    and a repeated request is answered from it without running the model."""

    enable: bool = Field(default=False, description="keep this model's answers in the server's response cache")


class VersionPolicySpec(Strict):
    """Triton's version_policy: which of the model's version folders are served at once. At most one of the three;
    none: the newest version alone (Triton's default, `latest: 1`)."""

    latest: int | None = Field(default=None, ge=1, description="the newest N versions")
    all: bool = Field(default=False, description="every version folder")
    specific: tuple[int, ...] | None = Field(default=None, min_length=1, description="these versions")

    @model_validator(mode="after")
    def _one_policy(self) -> VersionPolicySpec:
        named = [name for name in ("latest", "all", "specific") if getattr(self, name)]
        if len(named) > 1:
            raise ValueError(f"name one of latest, all and specific, not {' and '.join(named)}")
        return self

    @property
    def several(self) -> bool:
        """Whether it may serve more than one version."""
        return self.all or (self.latest or 1) > 1 or len(self.specific or ()) > 1

    def pick(self, versions: tuple[int, ...]) -> tuple[int, ...]:
        """The served versions, ascending, of the version folders `versions` (ascending). ValueError naming the
        versions a `specific` policy asks for that have no folder."""
        if self.all:
            return versions
        if self.specific is not None:
            missing = sorted(set(self.specific) - set(versions))
            if missing:
                raise ValueError(
                    f"version_policy names versions {missing} that have no folder (found {list(versions)})"
                )
            return tuple(sorted(set(self.specific)))
        return versions[-(self.latest or 1) :]


class PackratSpec(Strict):
    """Packrat: the worker set comes from the model's profile and follows the load, with `workers: auto`, or on a
    CPU model that leaves `workers` out once this machine has a usable profile of it (measured in the background
    if it has none)."""

    threads: int | None = Field(default=None, ge=1, description="T: threads to spread over workers; default all CPUs")
    initial_batch: int | None = Field(default=None, ge=1, description="B planned at start; default max_batch_size")
    ewma_alpha: float = Field(default=0.3, gt=0, le=1, description="weight of the newest queue depth in the EWMA")
    window: int = Field(default=16, ge=1, description="n: B is the mode of the last n estimates")
    reconfigure_timeout_s: float = Field(default=10.0, ge=0, description="how often B is compared with the set's")
    sample_interval_s: float = Field(default=0.1, gt=0, description="how often the queue depth is observed")
    capacity_headroom: float = Field(
        default=1.5,
        ge=0,
        description="a set is switched to only if it plans this × the arrival rate in rows per second, or (for a "
        "larger B) more than the current set (0: no floor, as the paper)",
    )
    overload_factor: float = Field(
        default=4.0,
        ge=0,
        description="a smoothed B this × the set's is acted on after overload_after_s rather than the timeout: the "
        "set falls behind (0: only at the timeout, as the paper)",
    )
    overload_after_s: float = Field(default=2.0, ge=0, description="the least time between checks when overloaded")
    background_profile: bool = Field(
        default=True,
        description="a CPU model with no workers line and no usable profile of this machine serves the default set "
        "and measures its profile in the background, at the lowest CPU priority, then switches to Packrat's plan; "
        "false: it keeps the default set until `adaserve profile` is run",
    )
    profile_stability_percentage: float | None = Field(
        default=None,
        gt=0,
        description="the background profile's stability rule: a cell is stable when its last 3 trials' mean "
        "latencies are each within this % of their mean (default: `adaserve profile`'s 10)",
    )
    profile_retry_s: float = Field(
        default=600.0,
        gt=0,
        description="after a background profile with unstable cells, wait this long before measuring again; the "
        "wait doubles each time",
    )
    profile_attempts: int = Field(
        default=4, ge=1, description="background profiles measured at most, before the default set stays"
    )

    @field_validator("overload_factor")
    @classmethod
    def _off_or_above_one(cls, value: float) -> float:
        if 0 < value <= 1:
            raise ValueError(f"must be 0 (off) or more than 1, got {value}: at 1 or less every check is early")
        return value


#: Retraining's predictor epochs and selector steps (`adaserve.adaptive.gati.adapt.AdaptSettings`): the paper's 5
#: epochs moved a warm-started predictor 5 steps on a window of a hundred rows, and 500 selector steps fitted 32 rows
#: (`benchmarks/README.md`, GATI adaptation).
ADAPT_EPOCHS, ADAPT_SELECTOR_STEPS = 20, 100


#: What GATI's retraining trigger expects of the caches serving (`HitRateMonitor`): their hit rates on the traffic
#: their last retraining saw, or (the paper's) their composition's on held-out rows.
Expectation = Literal["traffic", "composition"]


class AdaptationSpec(Strict):
    """`caches.adaptation:` — retrain the learned caches online (GATI's cache adaptation service)."""

    sample_fraction: float = Field(default=0.2, gt=0, le=1, description="share of requests' rows kept in the window")
    window_rows: int = Field(default=2000, ge=20, description="the window keeps the newest this many sampled rows")
    window_mb: float = Field(
        default=256.0,
        gt=0,
        description="... and no more rows than fit in this many MiB (but at least 20, what a retraining needs): 2,000 "
        "rows of a 3×224×224 float32 image would take 1.2 GB",
    )
    check_interval_s: float = Field(default=5.0, gt=0, description="how often the trigger is checked")
    period_s: float = Field(default=900.0, gt=0, description="retrain at least this often")
    margin: float = Field(
        default=0.05, ge=0, le=1, description="retrain when an exit's hit rate (or verified agreement) falls this far"
    )
    min_rows: int = Field(default=500, ge=1, description="rows judged at once by the hit-rate trigger")
    expect: Expectation = Field(
        default="traffic",
        description="what the hit-rate trigger expects: 'traffic', an adapted version's hit rates on the held-out "
        "rows of the window it was retrained on (a build's: its composition's), and after a refused retraining no "
        "more than the live rates last judged; or 'composition', the paper's, the composition's on its held-out "
        "rows, which an adapted version on a lasting drift never reaches",
    )
    min_window_rows: int = Field(default=200, ge=20, description="no retraining before the window holds this many")
    train_rows: int = Field(
        default=500,
        ge=20,
        description="a retraining trains on a recency-weighted draw of at most this many of the window's rows, "
        "which bounds its time (one core, benchmarks.gati.window_draw: 8.9 s on 250 rows, 21.3 s on 1,000)",
    )
    keep_versions: int = Field(
        default=10,
        ge=2,
        description="the newest this many adapted cache set versions stay on disk, older adapted ones are removed "
        "when a new one is deployed (a built version never is); at least 2: the new one and the one still serving",
    )
    epochs: int = Field(
        default=ADAPT_EPOCHS,
        ge=1,
        description="predictor training epochs per retraining, over the window's rows mixed with validation rows",
    )
    selector_steps: int = Field(
        default=ADAPT_SELECTOR_STEPS, ge=1, description="selector training steps per retraining"
    )


#: Where GATI's lookups run (`caches.lookup` with `auto` resolved).
Lookup = Literal["process", "stream", "inline"]


class LearnedCachesSpec(Strict):
    """`caches:` — GATI's learned caches: where the model may exit early and which built cache set serves it.

    `adaserve caches build` trains a cache set into `<model dir>/caches/v<N>/`; the worker runs the model block by
    block and consults the chosen caches after their blocks.
    """

    blocks: tuple[str, ...] | Literal["auto"] = Field(
        default="auto",
        description="the model's blocks, module paths in execution order that together run the whole model "
        "(e.g. [stem, layer1.0, layer1.1, head]); 'auto' detects the sequential chain of top-level modules, "
        "descending into chains of composite modules",
    )
    version: int | Literal["latest"] = Field(
        default="latest", description="cache set to serve: caches/v<version>/, or the newest one"
    )
    targets: tuple[float, ...] = Field(
        default=(0.99,),
        min_length=1,
        description="agreement targets with the base model the set is composed for; the first is the default, a "
        "request's `accuracy` parameter picks the least target at or above it",
    )
    memory_budget_mb: float | None = Field(
        default=None, gt=0, description="memory all chosen caches of one target may hold (MB); default: no limit"
    )
    lookup: Literal["auto", "process", "stream", "inline"] = Field(
        default="auto",
        description="where a cache lookup runs: 'process' (CPU), beside the model (the rest of the chain runs ahead "
        "in a model process on another core, so a miss costs no lookup; it spins on that core while batches run), "
        "'stream' (cuda), on a side stream while the next block runs, 'inline' before the next block, or 'auto' "
        "(inline: it takes no second core)",
    )
    adaptation: AdaptationSpec | None = Field(
        default=None,
        description="retrain the caches online and deploy a better version with no downtime; off by default",
    )
    verify_fraction: float = Field(
        default=0.02,
        ge=0,
        le=1,
        description="fraction of hits that also run to the end (still answered at once from the cache), so the "
        "agreement with the base model is measured live",
    )

    @property
    def lookup_at(self) -> Lookup:
        """Where lookups run, `auto` resolved (inline on either device)."""
        return "inline" if self.lookup == "auto" else self.lookup

    @field_validator("blocks", mode="before")
    @classmethod
    def _blocks(cls, value: Any) -> Any:
        if isinstance(value, str) and value != "auto":
            raise ValueError(f"expected 'auto' or a list of module paths, got {value!r}")
        if isinstance(value, list | tuple):
            if not value:
                raise ValueError("the block list is empty; name the blocks or use 'auto'")
            bad = [v for v in value if not isinstance(v, str) or not v or v != v.strip()]
            if bad:
                raise ValueError(f"block names are module paths like 'layer1.0', got {bad[0]!r}")
            repeated = sorted({v for v in value if value.count(v) > 1})
            if repeated:
                raise ValueError(f"blocks are named once each; repeated: {', '.join(repeated)}")
        return value

    @field_validator("version", mode="before")
    @classmethod
    def _version(cls, value: Any) -> Any:
        if value != "latest" and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            raise ValueError(f"expected 'latest' or a version number (1, 2, ...), got {value!r}")
        return value

    @field_validator("adaptation")
    @classmethod
    def _latest(cls, value: AdaptationSpec | None, info: ValidationInfo) -> AdaptationSpec | None:
        if value is not None and info.data.get("version", "latest") != "latest":
            raise ValueError("adaptation deploys new cache set versions: it needs `version: latest`")
        return value

    @field_validator("targets")
    @classmethod
    def _targets(cls, value: tuple[float, ...]) -> tuple[float, ...]:
        for target in value:
            if not 0 < target < 1:
                raise ValueError(f"a target is an agreement fraction strictly between 0 and 1, got {target}")
        return value


class ActivatorSpec(Strict):
    """SLO-NNs node activator (built by `adaserve activator build`): requests carrying `accuracy` or `latency_ms`
    compute only the top-k% nodes of each hidden layer; requests without either run the model unchanged."""

    version: int | None = Field(
        default=None, ge=1, description="activator version under <model>/activator/; default: the newest"
    )
    on_mismatch: Literal["dense", "error"] = Field(
        default="dense",
        description="an activator built for another model version or weights: 'dense' serves targeted requests "
        "densely (response mode 'dense'), 'error' fails the model's load",
    )


class Interface(Strict):
    """What a client sees of anything it can send a request to: a model (`ModelConfig`) or a DAG query
    (`adaserve.planner.spec.DagConfig`). The data plane checks requests against these fields alone."""

    name: str = Field(min_length=1, description="optional in the file: its folder's name, which it must equal")
    max_batch_size: int = Field(default=16, ge=1, description="rows one request, and one batch, may carry")
    inputs: tuple[TensorSpec, ...] = Field(min_length=1, description="the tensors a request sends")
    outputs: tuple[TensorSpec, ...] = Field(min_length=1, description="the tensors a response carries")
    parameters: dict[str, Any] = Field(default_factory=dict, description="defaults for per-request parameters")

    @field_validator("inputs")
    @classmethod
    def _no_labels(cls, inputs: tuple[TensorSpec, ...]) -> tuple[TensorSpec, ...]:
        for tensor in inputs:
            if tensor.label_filename is not None:
                raise ValueError(f"input '{tensor.name}': label_filename belongs on an output")
        return inputs

    @field_validator("outputs")
    @classmethod
    def _unique_names(cls, outputs: tuple[TensorSpec, ...], info: ValidationInfo) -> tuple[TensorSpec, ...]:
        names = [t.name for t in info.data.get("inputs", ())] + [t.name for t in outputs]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"tensor names must be unique; repeated: {', '.join(duplicates)}")
        return outputs


class ModelConfig(Interface):
    """The whole `config.yaml` of one model."""

    platform: Literal["torch_export", "torchscript"] | None = Field(
        default=None, description="artifact kind; inferred from model.pt2 / model.pt when omitted"
    )
    max_inflight: int | None = Field(
        default=None,
        ge=1,
        description="Ebird's MaxInf: rows computing at once; default: on cuda with no workers line, the one chosen "
        "from the GPU's stream profile, else the sum of worker batches",
    )
    max_queue_size: int = Field(
        default=1024, ge=1, description="rows waiting in the input pool before new requests get 503"
    )
    batching: BatchingSpec = Field(default=BatchingSpec(), description="how ready requests become batches")
    workers: tuple[WorkerSpec, ...] | Literal["auto"] | None = Field(
        default=None,
        description="the worker set; 'auto' lets Packrat choose it; left out on a CPU: Packrat's plan when this "
        "machine has a usable profile, else the default set, profiled in the background (packrat.background_profile); "
        "left out on cuda: chosen from the GPU's stream profile (measured at load if missing; "
        "batching.latency_target_ms); the default set: Ebird's granularities capped at max_batch_size and, on a "
        "CPU, the largest of them as many as max_busy_threads lets compute at once",
    )
    packrat: PackratSpec = Field(
        default=PackratSpec(), description="Packrat's settings, read with workers: auto or with no workers line"
    )
    activator: ActivatorSpec | None = Field(default=None, description="SLO-NNs node activator; none by default")
    caches: LearnedCachesSpec | None = Field(
        default=None, description="GATI learned caches (early exit); absent: the model always runs whole"
    )
    response_cache: ResponseCacheSpec = Field(
        default=ResponseCacheSpec(),
        description="Triton's: {enable: true} answers repeated requests (the same inputs and parameters) from the "
        "server's response cache, which --cache-config local,size=BYTES sizes",
    )
    version_policy: VersionPolicySpec = Field(
        default=VersionPolicySpec(),
        description="which versions are served at once (Triton's): {latest: N}, {all: true} or {specific: [..]}; "
        "default the newest alone",
    )
    cuda_graphs: bool = Field(
        default=True,
        description="device cuda: each worker replays its model as CUDA graphs captured at start, one per power of "
        "two up to its batch (rows padded up to the next), so a batch costs one launch; false runs it eagerly",
    )
    # Last, so its validator sees every field it depends on.
    device: Literal["cpu", "cuda"] = Field(
        default="cpu",
        validate_default=True,  # its validator checks the fields that depend on it, on every config
        description="cpu: workers are processes pinned to cores; cuda: workers are CUDA streams in one process "
        "sharing one copy of the weights (Ebird's GPU form)",
    )

    @field_validator("caches")
    @classmethod
    def _one_adaptation(cls, caches: LearnedCachesSpec | None, info: ValidationInfo) -> LearnedCachesSpec | None:
        if caches is not None and info.data.get("activator") is not None:
            raise ValueError(
                "a model serves either a node activator (SLO-NNs) or learned caches (GATI), not both: both read "
                "the request's `accuracy` parameter"
            )
        return caches

    @field_validator("version_policy")
    @classmethod
    def _one_version_for_adaptation(cls, policy: VersionPolicySpec, info: ValidationInfo) -> VersionPolicySpec:
        if policy.several and (info.data.get("caches") is not None or info.data.get("activator") is not None):
            raise ValueError(
                "learned caches and node activators are built for one version of a model: serve one version "
                "(the default) with them"
            )
        return policy

    @field_validator("max_queue_size")
    @classmethod
    def _holds_a_batch(cls, size: int, info: ValidationInfo) -> int:
        batch = info.data.get("max_batch_size", 1)
        if size < batch:
            raise ValueError(
                f"{size} is below max_batch_size {batch}: a request of a whole batch could never be queued"
            )
        return size

    @field_validator("workers")
    @classmethod
    def _within_max_batch(
        cls, workers: tuple[WorkerSpec, ...] | Literal["auto"] | None, info: ValidationInfo
    ) -> tuple[WorkerSpec, ...] | Literal["auto"] | None:
        if workers == "auto":
            return workers
        limit = info.data.get("max_batch_size", 0)
        for worker in workers or ():
            if worker.batch > limit:
                raise ValueError(f"worker batch {worker.batch} exceeds max_batch_size {limit}")
        return workers

    @field_validator("device")
    @classmethod
    def _cpu_only_features(cls, device: str, info: ValidationInfo) -> str:
        """What runs only on the CPU path so far: a CUDA model asking for it is refused, not served without it."""
        if device == "cuda":
            asked = [
                name
                for name, wanted in (
                    ("workers: auto (Packrat plans CPU cores)", info.data.get("workers") == "auto"),
                    ("an activator (SLO-NNs)", info.data.get("activator") is not None),
                )
                if wanted
            ]
            if asked:
                raise ValueError(f"cuda does not serve {' or '.join(asked)} yet; use device: cpu for them")
        caches = info.data.get("caches")
        if caches is not None:
            _check_lookup(caches.lookup, device)
        return device

    @property
    def auto_workers(self) -> bool:
        """Packrat chooses the worker set (and changes it with the load)."""
        return self.workers == "auto"

    @property
    def worker_set(self) -> tuple[WorkerSpec, ...]:
        """The configured workers, or the default (not for `workers: auto`): Ebird's granularities capped at
        `max_batch_size` and, on a CPU, at the largest `default_worker_count` of them.

        On a CPU a worker's granularity only caps its batch (the program takes any batch up to it, and the elastic
        scheduler hands a partial batch to the warm worker), and no more single-thread workers compute at once than
        the busy-thread limit lets. A worker beyond that can never run beside the others: on the 2-core VM (limit
        one) five of the six were memory for nothing, about 5 MiB of private pages each, and a process to start."""
        if self.workers == "auto":
            raise ValueError("with workers: auto the engine plans the worker set from the profile")
        if self.workers:
            return self.workers
        granularities = [g for g in EBIRD_GRANULARITIES if g <= self.max_batch_size]
        return tuple(WorkerSpec(batch=g) for g in granularities[-self.default_worker_count() :])

    def default_worker_count(self) -> int:
        """How many workers the default set may hold: on a CPU the threads `batching.max_busy_threads` lets busy
        at once (its default: `cpu_busy_threads`); with no limit, or on CUDA (a worker is a stream), all six."""
        limit = self.batching.max_busy_threads
        if self.device != "cpu" or limit == 0:
            return len(EBIRD_GRANULARITIES)
        return limit if limit is not None else cpu_busy_threads()

    @property
    def inflight_limit(self) -> int:
        """MaxInf of the configured (or default) worker set."""
        return self.inflight_limit_for(self.worker_set)

    def inflight_limit_for(self, workers: tuple[WorkerSpec, ...], chosen: int | None = None) -> int:
        """Ebird's MaxInf for a worker set: the configured value, else the one chosen with the set (a GPU's, from
        its stream profile), else the rows the set can hold at once."""
        return self.max_inflight or chosen or sum(w.batch for w in workers)


def _check_lookup(lookup: str, device: str) -> None:
    """GATI on each device: a model process beside the worker is the CPU's overlap, a side stream the GPU's."""
    if device == "cpu" and lookup == "stream":
        raise ValueError("caches.lookup: stream runs lookups on a CUDA side stream; it needs device: cuda")
    if device == "cuda" and lookup == "process":
        raise ValueError("caches.lookup: process is the CPU's overlap; on cuda use stream (a side stream) or inline")


def load_config(path: Path, *, name: str | None = None) -> ModelConfig:
    """Read and validate a model's config file; `name` (the directory name) is the default model name."""
    return load_document(path, ModelConfig, name=name)


def load_document(path: Path, schema: type[Document], *, name: str | None = None) -> Document:
    """Read a YAML file and validate it as `schema`; ConfigError names the file, each field and its problem."""
    try:
        raw = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from exc
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level, got {type(raw).__name__}")
    if name is not None:
        raw.setdefault("name", name)
        if raw["name"] != name:
            raise ConfigError(f"{path}: field 'name': {raw['name']!r} does not match its directory {name!r}")
    try:
        return schema.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(describe_validation(str(path), exc)) from None


def describe_validation(source: str, exc: ValidationError) -> str:
    """One line naming each field and its problem. For a union (`workers: [...] | auto`) pydantic reports every
    alternative under a type-named path part; those parts are dropped, and the `auto` alternative's complaint too
    when the list form explains the problem."""
    errors = exc.errors()
    problems = []
    for error in errors:
        parts = [str(part) for part in error["loc"]]
        if any(part.startswith("literal[") for part in parts) and len(errors) > 1:
            continue
        field = ".".join(part for part in parts if "[" not in part) or "(top level)"
        message = error["msg"].removeprefix("Value error, ")
        if error["type"] == "extra_forbidden":
            message = "unknown field"
        problems.append(f"field '{field}': {message}")
    return f"{source}: " + "; ".join(problems)
