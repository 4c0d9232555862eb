"""Packrat's profiler (§3.2) and its stored result, `<model dir>/profile.json`, keyed by a hardware fingerprint.

One worker at a time, pinned to t cores with t intra-op threads, runs random batches of the config's input shapes
for every ⟨t, b⟩ in {1..T} × {1, 2, 4, .., ≤ max_batch_size} (the paper's (n + 1)·T grid) and records the mean
batch latency. A cell is timed in trials until the last three agree (`measure_cell`, perf_analyzer's stability
rule), or else stored as unstable with its spread: a profile taken beside other work once recorded t=2 b=2 at
24 ms against 0.135 ms on a rerun, and was planned from. Each t runs in a process of its own: an intra-op thread
pool, once started, does not shrink cleanly. Those processes are forked, as the server's workers are
(`adaserve.engine.host`), from one child that imported torch and loaded the model once and never computes, so no
thread pool exists when it forks: each t costs a fork, not a Python start and a load (about 14 s each for a
ResNet-50 on a 16-core machine), and is measured the way a served worker runs, forked from a loaded model and
placed with `place`.

The file holds one profile per machine fingerprint (CPU model, logical CPUs, physical cores, sockets, NUMA nodes),
so a repository shared by several machines keeps each one's profile. `load_profile` answers with the matching
profile, a `StaleProfile` (none for this machine, the model changed since, or a cell did not settle: the caller
falls back to a stated default), or raises `ProfileError` naming the file and what is wrong with it.

One unstable cell refuses the whole profile, even a cell no plan for today's B would use: which cells a plan uses
changes with B at run time, and the fat instance every plan is compared with is a cell too. Profiles written
before the stability rule (no `stability` in their cells) still plan, with a warning that their stability is
unknown (`profile_warnings`).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.metadata
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal, Self, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from adaserve.config import ModelConfig, WorkerSpec
from adaserve.cpu.optimizer import Optimizer, Plan, Profile, fat_instance_plan
from adaserve.cpu.topology import AllocationError, Topology, allocate, machine_topology
from adaserve.errors import ConfigError
from adaserve.repository import ModelSpec

__all__ = [
    "PROFILER_NAME",
    "PROFILE_FILE",
    "AutoPlanner",
    "Fingerprint",
    "ProfileError",
    "ProfileRecord",
    "ProfileSettings",
    "Stability",
    "StaleProfile",
    "Timing",
    "WorkerPlan",
    "batch_grid",
    "busy_warning",
    "check_grid",
    "cpu_model",
    "distinct_increasing",
    "fingerprint",
    "idle_runner",
    "load_profile",
    "lowest_priority",
    "measure_beside_serving",
    "measure_cell",
    "one_each",
    "packrat_threads",
    "profile_model",
    "profile_warnings",
    "random_inputs",
    "read_document",
    "save_profile",
    "settle",
    "started_writing",
    "unstable_reason",
    "write_document",
]

PROFILE_FILE = "profile.json"
#: A background profile's child's process name (/proc/PID/comm, at most 15 characters).
PROFILER_NAME = "adaserve-prof"
FORMAT: Literal[1] = 1


class ProfileError(ConfigError):
    """A profile.json that cannot be used (corrupt, wrong shape) or a profiling run that failed; names the path."""


# -- the stored file -------------------------------------------------------------------------------------------------


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Fingerprint(_Strict):
    """What makes a profile valid on a machine; two machines with equal fingerprints share profiles."""

    cpu_model: str
    logical_cpus: int = Field(ge=1, description="CPUs this process may use (a container's cpuset counts)")
    physical_cores: int = Field(ge=1)
    sockets: int = Field(ge=1)
    numa_nodes: int = Field(ge=1)

    def describe(self) -> str:
        return (
            f"{self.cpu_model}, {self.logical_cpus} CPUs ({self.physical_cores} cores), "
            f"{self.sockets} socket(s), {self.numa_nodes} NUMA node(s)"
        )


#: perf_analyzer's stability rule looks at the last this many trials.
STABLE_TRIALS = 3


class ProfileSettings(_Strict):
    """How thoroughly each ⟨t, b⟩ cell is measured: trials of timed runs, until the last three agree.

    The `_cell_` names predate trials and are kept so that older profile files still load; they bound one trial.
    """

    quick: bool = False
    warmup: int = Field(default=5, ge=0, description="untimed runs before a cell's first trial")
    repeats: int = Field(default=30, ge=1, description="timed runs per trial (at least)")
    min_cell_s: float = Field(default=0.5, ge=0, description="keep timing a fast trial until this much time passed")
    max_cell_s: float = Field(default=60.0, gt=0, description="stop a slow trial here (after at least 3 timed runs)")
    stability_percentage: float = Field(
        default=10.0, gt=0, description="stable: the last 3 trials' mean latencies each within this % of their mean"
    )
    max_trials: int = Field(default=10, ge=STABLE_TRIALS, description="trials before a cell is stored as unstable")

    @classmethod
    def for_run(
        cls,
        *,
        quick: bool,
        repeats: int | None = None,
        stability_percentage: float | None = None,
        max_trials: int | None = None,
    ) -> ProfileSettings:
        """The defaults, or `--quick`'s shorter trials (the stability rule still applies), with what was given."""
        base = cls(quick=True, warmup=1, repeats=5, min_cell_s=0.02, max_cell_s=2.0) if quick else cls()
        given = {"repeats": repeats, "stability_percentage": stability_percentage, "max_trials": max_trials}
        return base.model_copy(update={k: v for k, v in given.items() if v is not None})


class Stability(_Strict):
    """Whether a cell's trials agreed; absent from cells measured before the rule (their stability is unknown)."""

    trials: int = Field(ge=1, description="trials run")
    spread_pct: float = Field(
        ge=0, allow_inf_nan=False, description="largest deviation of the last 3 trials' means from their mean, in %"
    )
    stable: bool = Field(description="spread_pct ≤ the stability percentage within max_trials")


class Timing(_Strict):
    """A cell's batch size and the statistics of its timed batches (Packrat's cells and the GPU's stream cells)."""

    batch: int = Field(ge=1)
    mean_s: float = Field(gt=0, allow_inf_nan=False, description="mean batch latency (what plans are made from)")
    p50_s: float = Field(gt=0, allow_inf_nan=False)
    std_s: float = Field(ge=0, allow_inf_nan=False)
    runs: int = Field(ge=1, description="timed runs behind the statistics: the last 3 trials'")

    @classmethod
    def of(cls, times: list[float], **fields: Any) -> Self:
        """The cell of these batch latencies (`fields`: the others)."""
        mean, p50, std = statistics.fmean(times), statistics.median(times), statistics.pstdev(times)
        return cls(mean_s=mean, p50_s=p50, std_s=std, runs=len(times), **fields)


class Cell(Timing):
    threads: int = Field(ge=1)
    stability: Stability | None = None

    @property
    def name(self) -> str:
        return f"t={self.threads} b={self.batch}"


class ProfileRecord(_Strict):
    """One machine's profile of one model version."""

    fingerprint: Fingerprint
    model: str
    version: int = Field(ge=1)
    artifact_sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    torch: str
    created: str
    settings: ProfileSettings
    threads: tuple[int, ...] = Field(min_length=1)
    batches: tuple[int, ...] = Field(min_length=1)
    cells: tuple[Cell, ...]
    load_average: tuple[float, float] | None = Field(
        default=None, description="1-minute load average before and after measuring: other work inflates latencies"
    )

    @field_validator("threads", "batches")
    @classmethod
    def _sorted_positive(cls, values: tuple[int, ...]) -> tuple[int, ...]:
        return distinct_increasing(values)

    @model_validator(mode="after")
    def _complete_grid(self) -> ProfileRecord:
        check_grid([(c.threads, c.batch) for c in self.cells], self.threads, self.batches, "threads")
        return self

    @property
    def profile(self) -> Profile:
        return Profile({(c.threads, c.batch): c.mean_s for c in self.cells})


class ProfileFile(_Strict):
    """`profile.json`: `{"format": 1, "profiles": [ProfileRecord, ...]}`, at most one per fingerprint."""

    format: Literal[1]
    profiles: tuple[ProfileRecord, ...]

    @field_validator("profiles")
    @classmethod
    def _one_per_machine(cls, profiles: tuple[ProfileRecord, ...]) -> tuple[ProfileRecord, ...]:
        one_each([p.fingerprint for p in profiles], "fingerprint")
        return profiles


def distinct_increasing(values: tuple[int, ...]) -> tuple[int, ...]:
    """`values` if they are distinct positive integers in increasing order (a profile's axis), else ValueError."""
    if any(v < 1 for v in values) or list(values) != sorted(set(values)):
        raise ValueError(f"expected distinct positive integers in increasing order, got {list(values)}")
    return values


def check_grid(seen: list[tuple[int, int]], rows: tuple[int, ...], batches: tuple[int, ...], axis: str) -> None:
    """ValueError unless the cells `seen` cover `rows` × `batches` once each; `axis` names the rows."""
    grid = {(r, b) for r in rows for b in batches}
    repeated = sorted({cell for cell in seen if seen.count(cell) > 1})
    missing, extra = sorted(grid - set(seen)), sorted(set(seen) - grid)
    problems = [
        f"{kind} ({axis}, batch) cells {cells}"
        for kind, cells in (("repeated", repeated), ("missing", missing), ("unexpected", extra))
        if cells
    ]
    if problems:
        raise ValueError(f"the cells do not cover {axis} × batches once each: " + "; ".join(problems))


def one_each(keys: list[Any], what: str) -> None:
    """ValueError if two of a file's profiles share a key."""
    if len(set(keys)) != len(keys):
        raise ValueError(f"two profiles for the same {what}")


@dataclass(frozen=True)
class StaleProfile:
    """No usable profile for this machine and model: `reason` says why, for the fallback's message."""

    path: Path
    reason: str


def fingerprint(topology: Topology | None = None, cpuinfo: Path = Path("/proc/cpuinfo")) -> Fingerprint:
    """This machine's fingerprint: CPU model from /proc/cpuinfo and the shape of the CPUs this process may use."""
    topology = topology or machine_topology()
    return Fingerprint(
        cpu_model=cpu_model(cpuinfo),
        logical_cpus=len(topology.cpus),
        physical_cores=topology.physical_cores,
        sockets=topology.sockets,
        numa_nodes=topology.numa_nodes,
    )


def cpu_model(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """This machine's CPU model as /proc/cpuinfo names it (else what `platform` says)."""
    with contextlib.suppress(OSError):
        for line in cpuinfo.read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("model name", "Model Name", "cpu model", "Processor") and value.strip():
                return " ".join(value.split())
    import platform

    return platform.processor() or platform.machine() or "unknown"


def read_profile_file(path: Path) -> ProfileFile:
    """Parse and validate profile.json; ProfileError with the path and the reason when it cannot be used."""
    return read_document(path, ProfileFile, FORMAT)


Stored = TypeVar("Stored", bound=BaseModel)


def read_document(path: Path, schema: type[Stored], version: int) -> Stored:
    """Parse and validate a versioned JSON profile (`{"format": version, ...}`); ProfileError with the path and the
    reason when it cannot be used (also for the GPU's stream profile)."""
    try:
        raw = json.loads(path.read_text())
    except OSError as exc:
        raise ProfileError(f"{path}: cannot read: {exc.strerror}") from exc
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ProfileError(f"{path}: corrupt profile, not valid JSON: {exc}") from None
    if isinstance(raw, dict) and raw.get("format") not in (None, version):
        raise ProfileError(f"{path}: profile format {raw.get('format')!r} is not supported (expected {version})")
    try:
        return schema.model_validate(raw)
    except ValidationError as exc:
        problems = []
        for error in exc.errors()[:5]:
            where = ".".join(str(part) for part in error["loc"]) or "(top level)"
            message = "unknown field" if error["type"] == "extra_forbidden" else error["msg"]
            problems.append(f"field '{where}': {message.removeprefix('Value error, ')}")
        raise ProfileError(f"{path}: corrupt profile: " + "; ".join(problems)) from None


def load_profile(model_dir: Path, machine: Fingerprint, spec: ModelSpec | None = None) -> ProfileRecord | StaleProfile:
    """This machine's profile of the model in `model_dir`, or why there is none (missing, other machines, changed).

    With `spec`, a profile of another version or of different artifact bytes is stale too: the model changed.
    """
    path = model_dir / PROFILE_FILE
    if not path.exists():
        return StaleProfile(path, f"no {PROFILE_FILE} in {model_dir}")
    stored = read_profile_file(path)
    record = next((p for p in stored.profiles if p.fingerprint == machine), None)
    if record is None:
        others = "; ".join(p.fingerprint.describe() for p in stored.profiles) or "none"
        return StaleProfile(path, f"{path} has no profile for this machine ({machine.describe()}); it has: {others}")
    if spec is not None:
        if record.version != spec.version:
            return StaleProfile(path, f"{path} profiles version {record.version}, the model is now {spec.version}")
        if record.artifact_sha256 != artifact_digest(spec.artifact):
            return StaleProfile(path, f"{path}: {spec.artifact} changed since it was profiled")
    unstable = unstable_reason(record)
    return StaleProfile(path, f"{path}: {unstable}") if unstable else record


def unstable_reason(record: ProfileRecord) -> str | None:
    """Why `record` is not planned from: its unstable cells by name and spread; None when it has none."""
    spreads = [(c.name, c.stability.spread_pct) for c in record.cells if c.stability and not c.stability.stable]
    if not spreads:
        return None
    named = ", ".join(f"{name} (spread {spread:.1f}%)" for name, spread in spreads)
    return (
        f"unstable cells {named}: their last {STABLE_TRIALS} trials' latencies did not agree within "
        f"{record.settings.stability_percentage:g}% in {record.settings.max_trials} trials, so the profile is not "
        "planned from (other work on the machine while profiling, most likely)"
    )


def save_profile(model_dir: Path, record: ProfileRecord) -> Path:
    """Write `record` into profile.json, replacing this fingerprint's entry and keeping other machines' (atomic)."""
    path = model_dir / PROFILE_FILE
    others: tuple[ProfileRecord, ...] = ()
    if path.exists():
        with contextlib.suppress(ProfileError):  # a corrupt file is replaced by the new measurement
            others = tuple(p for p in read_profile_file(path).profiles if p.fingerprint != record.fingerprint)
    return write_document(path, ProfileFile(format=FORMAT, profiles=(*others, record)))


def write_document(path: Path, document: BaseModel) -> Path:
    """Write `document` as indented JSON at `path`, atomically (a reader sees the old file or the new one)."""
    with tempfile.NamedTemporaryFile("w", dir=path.parent, prefix=".profile-", suffix=".json", delete=False) as f:
        f.write(document.model_dump_json(indent=1) + "\n")
    os.replace(f.name, path)
    return path


def artifact_digest(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


# -- measuring -------------------------------------------------------------------------------------------------------


#: What measures a profile's cells for `profile_model`: given the job and where each cell goes.
Runner = Callable[[dict[str, Any], Callable[[Cell], None]], None]


def packrat_threads(threads: int | None, topology: Topology) -> int:
    """T: the threads asked for, or every CPU this process may use; AllocationError for more than those."""
    available = len(topology.cpus)
    if threads is not None and threads > available:
        raise AllocationError(
            f"T={threads} is more than the {available} CPUs this process may use ({topology.describe()})"
        )
    return threads or available


def batch_grid(max_batch_size: int) -> tuple[int, ...]:
    """b ∈ {2⁰, 2¹, .., 2ⁿ} with 2ⁿ ≤ max_batch_size: the paper's profiled batch sizes."""
    return tuple(1 << k for k in range(max_batch_size.bit_length()) if 1 << k <= max_batch_size)


def profile_model(
    spec: ModelSpec,
    threads: int,
    settings: ProfileSettings,
    *,
    topology: Topology | None = None,
    progress: bool = True,
    runner: Runner | None = None,
) -> ProfileRecord:
    """Measure the grid {1..threads} × batch_grid(max_batch_size) for `spec`: one child loads the model and forks
    a process per t (`runner` stands in for that child in tests; `idle_runner` runs it beside serving)."""
    topology = topology or machine_topology()
    threads = packrat_threads(threads, topology)
    from tqdm import tqdm

    batches = batch_grid(spec.config.max_batch_size)
    load_before = os.getloadavg()[0]
    cells: list[Cell] = []
    run = runner or _run_child
    with tqdm(
        total=threads * len(batches), desc=f"profile {spec.name}", unit="cell", disable=not progress, leave=True
    ) as bar:

        def record(cell: Cell) -> None:
            cells.append(cell)
            unstable = " unstable" if cell.stability and not cell.stability.stable else ""
            bar.set_postfix_str(f"{cell.name} {cell.mean_s * 1e3:.3f} ms{unstable}", refresh=False)
            bar.update(1)

        placements = []
        for t in range(1, threads + 1):
            (worker,) = allocate([(1, t, 1)], topology)
            placements.append({"threads": t, "cpus": list(worker.cpus or ())})
        job = {
            "artifact": str(spec.artifact),
            "config": spec.config.model_dump(mode="json"),
            "placements": placements,
            "batches": list(batches),
            "settings": settings.model_dump(mode="json"),
        }
        run(job, record)
    return ProfileRecord(
        fingerprint=fingerprint(topology),
        model=spec.name,
        version=spec.version,
        artifact_sha256=artifact_digest(spec.artifact),
        torch=importlib.metadata.version("torch"),
        created=datetime.now(UTC).isoformat(timespec="seconds"),
        settings=settings,
        threads=tuple(range(1, threads + 1)),
        batches=batches,
        cells=tuple(cells),
        load_average=(round(load_before, 2), round(os.getloadavg()[0], 2)),
    )


def busy_warning(record: ProfileRecord) -> str | None:
    """A warning when other work was running while the profile was measured (its latencies are then inflated)."""
    if record.load_average is None:
        return None
    limit = max(1.0, record.fingerprint.logical_cpus / 4)
    if record.load_average[0] <= limit:
        return None
    return (
        f"the machine was busy while profiling (load average {record.load_average[0]:.2f} before starting, "
        f"{record.fingerprint.logical_cpus} CPUs): latencies, the multi-thread ones most, may be inflated; "
        "profile again on an idle machine with --force"
    )


def profile_warnings(record: ProfileRecord) -> list[str]:
    """What to know before trusting plans from `record`: the machine was busy, its cells did not settle, or it
    predates the stability rule (planned from all the same, so that older profiles keep working)."""
    warnings = [w for w in (busy_warning(record), unstable_reason(record)) if w]
    if any(c.stability is None for c in record.cells):
        warnings.append(
            f"the profile of {record.created} predates the stability rule: whether its cells' latencies settled is "
            f"unknown; `adaserve profile {record.model} --force` measures them again"
        )
    return warnings


def idle_runner(started: Callable[[int], None]) -> Runner:
    """The profile's child forked from the server's zygote (`adaserve.engine.zygote`), for a profile measured beside
    serving: it shares the zygote's torch instead of importing its own, runs at the lowest CPU priority
    (`lowest_priority`) in a process group of its own, and `started` gets its PID, which is its group's, once it
    is both, so that the caller can end it and the process it forked for a t (`os.killpg`)."""
    return functools.partial(_run_forked, started=started)


def lowest_priority(pid: int) -> str:
    """Let `pid` (0: this process; and what it starts later) run only on CPU time nothing else wants: SCHED_IDLE,
    or nice 19 where that is refused; returns which."""
    try:
        os.sched_setscheduler(pid, os.SCHED_IDLE, os.sched_param(0))
        return "SCHED_IDLE"
    except OSError:
        os.setpriority(os.PRIO_PROCESS, pid, 19)
        return "nice 19"


_CHILD_MAIN = "from adaserve.cpu.profiler import main; main()"


def _run_child(job: dict[str, Any], record: Callable[[Cell], None]) -> None:
    """Run the profile in a child Python (`main` below), `adaserve profile`'s: cells arrive one JSON line each on
    a pipe, not on stdout."""
    # One thread until a forked process sets its own (`place`): the child's loading never starts a thread pool.
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TORCH_FORCE_WEIGHTS_ONLY_LOAD": "1"}
    with tempfile.TemporaryFile("w+") as log:
        read_fd, process = started_writing(
            lambda write_fd: subprocess.Popen(
                [sys.executable, "-c", _CHILD_MAIN, json.dumps(job), str(write_fd)],
                pass_fds=(write_fd,),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                env=env,
            )
        )
        try:
            errors = _read_results(read_fd, record)
            code = process.wait()
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
        if code != 0:
            log.seek(0)
            _failed(job, f"exit {code}", errors or [log.read()[-2000:].strip()])


def _run_forked(job: dict[str, Any], record: Callable[[Cell], None], *, started: Callable[[int], None]) -> None:
    """Run the profile in a child the server's zygote forks (`measure_beside_serving`); its first line says it is
    in its own group at the lowest priority, and `started` is told then."""
    from adaserve.engine.processes import ZYGOTE, how_it_exited

    read_fd, child = started_writing(lambda write_fd: ZYGOTE.fork_profiler(json.dumps(job), write_fd))
    try:
        errors = _read_results(read_fd, record, lambda: started(child.pid))
    except BaseException:
        child.kill()
        raise
    code = child.wait_blocking()
    if code != 0:
        how = "its exit was not reported" if code is None else f"it {how_it_exited(code)}"
        _failed(job, how, errors or ["no reason given"])


_Child = TypeVar("_Child")


def started_writing(start: Callable[[int], _Child]) -> tuple[int, _Child]:
    """Start a child that writes to a new pipe (`start` gets its write end): the read end, and the child."""
    read_fd, write_fd = os.pipe()
    try:
        return read_fd, start(write_fd)
    except BaseException:
        os.close(read_fd)
        raise
    finally:
        os.close(write_fd)  # the child holds its own copy


def _read_results(read_fd: int, record: Callable[[Cell], None], started: Callable[[], None] | None = None) -> list[str]:
    """Read the child's lines until it and its forks have closed the pipe: cells go to `record`, a `started`
    line calls `started`; the errors it reported."""
    errors = []
    with os.fdopen(read_fd, "r") as results:
        for line in results:
            message = json.loads(line)
            if "error" in message:
                errors.append(str(message["error"]))
            elif "started" in message:
                if started is not None:
                    started()
            else:
                record(Cell.model_validate(message))
    return errors


def _failed(job: dict[str, Any], how: str, errors: list[str]) -> None:
    raise ProfileError(f"profiling {job['artifact']} failed ({how}): {'; '.join(errors)}")


def measure_cell(threads: int, batch: int, trials: Iterator[list[float]], settings: ProfileSettings) -> Cell:
    """Take trials (each a list of batch latencies) until the last three agree, perf_analyzer's stability rule:
    each trial's mean latency within `stability_percentage` of the three's mean. After `max_trials` without that,
    the cell is marked unstable with its spread. Latency alone is checked: one worker's throughput is b over its
    batch latency, so it agrees when the latency does. The statistics are those of the last three trials' runs."""
    times, stability = settle(trials, settings)
    return Cell.of(times, threads=threads, batch=batch, stability=stability)


def settle(trials: Iterator[list[float]], settings: ProfileSettings) -> tuple[list[float], Stability]:
    """`measure_cell`'s rule for any cell (the GPU's stream profile's too): the last three trials' latencies, and
    whether their means agreed."""
    last: deque[list[float]] = deque(maxlen=STABLE_TRIALS)
    for count in range(1, settings.max_trials + 1):
        last.append(next(trials))
        means = [statistics.fmean(times) for times in last]
        center = statistics.fmean(means)
        spread_pct = 100 * max(abs(m - center) for m in means) / center
        if count >= STABLE_TRIALS and spread_pct <= settings.stability_percentage:
            break
    stable = spread_pct <= settings.stability_percentage
    return [t for trial in last for t in trial], Stability(trials=count, spread_pct=round(spread_pct, 2), stable=stable)


def _trials(model: Callable[..., Any], inputs: Sequence[Any], settings: ProfileSettings) -> Iterator[list[float]]:
    """Warm up once, then one trial per `next`: at least `repeats` timed runs, longer for a fast cell
    (min_cell_s), shorter for a slow one (max_cell_s)."""
    import torch

    with torch.inference_mode():
        for _ in range(settings.warmup):
            model(*inputs)
    while True:
        times: list[float] = []
        with torch.inference_mode():
            began = time.perf_counter()
            while True:
                start = time.perf_counter()
                model(*inputs)
                times.append(time.perf_counter() - start)
                elapsed = time.perf_counter() - began
                enough = len(times) >= settings.repeats and elapsed >= settings.min_cell_s
                if enough or (elapsed >= settings.max_cell_s and len(times) >= 3):
                    break
        yield times


def random_inputs(config: ModelConfig, batch: int, seed: int) -> list[Any]:
    """Random tensors of the config's input shapes: floats in [0, 1), integers and booleans in {0, 1}.

    Public so that a benchmark timing the planned workers feeds them what the profile was measured on.
    """
    import numpy as np
    import torch

    rng = np.random.default_rng(seed)
    tensors = []
    for spec in config.inputs:
        shape = (batch, *spec.row_shape)
        if spec.dtype.kind == "f":
            array = rng.random(shape).astype(spec.dtype)
        else:
            array = rng.integers(0, 2, shape).astype(spec.dtype)
        tensors.append(torch.from_numpy(array))
    return tensors


def measure_beside_serving(job: dict[str, Any], result_fd: int) -> int:
    """A background profile's child, forked by the server's zygote in a session of its own (`idle_runner`): at the
    lowest priority before it loads the model, so that the processes it forks per t inherit it, and named
    `PROFILER_NAME` (what `ps` and the footprint benchmark see), it says so on its first line and measures."""
    how = lowest_priority(0)
    with contextlib.suppress(OSError):
        Path("/proc/self/comm").write_text(PROFILER_NAME)
    os.write(result_fd, (json.dumps({"started": how}) + "\n").encode())
    return _child(job, result_fd)


def _child(job: dict[str, Any], result_fd: int) -> int:
    """The profile's child: load the model, then fork a process per t that pins itself, measures every b and
    reports each cell on `result_fd`; the next t starts when the last one has exited.

    A failure is reported on the result pipe as `{"error": ...}`, so the parent can say why in one line.
    """
    with os.fdopen(result_fd, "w", buffering=1) as out:
        try:
            _measure_all(job, result_fd, lambda cell: out.write(cell.model_dump_json() + "\n"))
        except Exception as exc:
            out.write(json.dumps({"error": _reason(exc)}) + "\n")
            return 1
    return 0


def _reason(exc: Exception) -> str:
    return str(exc) if isinstance(exc, ConfigError) else f"{type(exc).__name__}: {exc}"


def _measure_all(job: dict[str, Any], result_fd: int, report: Callable[[Cell], object]) -> None:
    from adaserve.engine.processes import how_it_exited
    from adaserve.repository import load_artifact

    config = ModelConfig.model_validate(job["config"])
    settings = ProfileSettings.model_validate(job["settings"])
    model = load_artifact(Path(job["artifact"]), config.max_batch_size)
    for placement in job["placements"]:
        threads = placement["threads"]
        pid = os.fork()
        if pid == 0:  # the process for this t; it never returns
            code = 1
            try:
                _measure_threads(model, config, settings, placement, job["batches"], report)
                code = 0
            except Exception as exc:
                os.write(result_fd, (json.dumps({"error": f"t={threads}: {_reason(exc)}"}) + "\n").encode())
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        if status != 0:
            exited = how_it_exited(os.waitstatus_to_exitcode(status))
            raise ProfileError(f"the process measuring t={threads} failed: it {exited}")


def _measure_threads(
    model: Callable[..., Any],
    config: ModelConfig,
    settings: ProfileSettings,
    placement: dict[str, Any],
    batches: Sequence[int],
    report: Callable[[Cell], object],
) -> None:
    """In the process forked for one t: take its threads and CPUs, then measure and report every b."""
    from adaserve.engine.worker import place

    threads = placement["threads"]
    place(threads, placement["cpus"] or None)
    for batch in batches:
        trials = _trials(model, random_inputs(config, batch, seed=batch), settings)
        report(measure_cell(threads, batch, trials, settings))


# -- planning from the stored profile --------------------------------------------------------------------------------


@dataclass(frozen=True)
class WorkerPlan:
    """Workers to start (with their CPUs), the plan behind them, and where it came from."""

    workers: list[WorkerSpec]
    plan: Plan
    from_profile: bool
    note: str  # which profile was used, or why the stated default was


class AutoPlanner:
    """`workers: auto` for one model: this machine's profile, an Optimizer (plans cached), and the core allocator.

    Without a usable profile (an unstable one is not) every plan is the stated default, the fat instance: one
    worker with all T threads and batch min(B, max_batch_size), TorchServe's default and the paper's baseline.
    A corrupt profile raises `ProfileError` instead: silently ignoring a file the user made would hide the problem.
    `warnings` are the used profile's (`profile_warnings`), for the caller to repeat.
    """

    def __init__(self, spec: ModelSpec, *, threads: int | None = None, topology: Topology | None = None) -> None:
        self.spec = spec
        self.topology = topology or machine_topology()
        self.threads = packrat_threads(threads, self.topology)
        found = load_profile(spec.directory, fingerprint(self.topology), spec)
        self.record = found if isinstance(found, ProfileRecord) else None
        self.stale = found if isinstance(found, StaleProfile) else None
        self.warnings = profile_warnings(found) if isinstance(found, ProfileRecord) else []
        self.optimizer = Optimizer(found.profile) if isinstance(found, ProfileRecord) else None
        if isinstance(found, StaleProfile):
            self.note = (
                f"{found.reason}; using the default: the fat instance (one worker, {self.threads} threads); "
                f"run `adaserve profile {spec.name}` to plan from a profile"
            )
        else:
            self.note = f"planned from {found.fingerprint.describe()} profile of {found.created}"

    def plan(self, batch: int) -> WorkerPlan:
        if self.optimizer is None:
            fat = min(batch, self.spec.config.max_batch_size)
            plan = fat_instance_plan(None, self.threads, fat, self.note)
            return WorkerPlan(allocate(plan.triples, self.topology), plan, False, self.note)
        plan = self.optimizer.plan(self.threads, batch)
        return WorkerPlan(allocate(plan.triples, self.topology), plan, True, self.note)


def main() -> None:
    """The child's entry point: `python -c "from adaserve.cpu.profiler import main; main()" JOB_JSON RESULT_FD`."""
    sys.exit(_child(json.loads(sys.argv[1]), int(sys.argv[2])))
