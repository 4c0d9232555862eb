"""Ebird's GPU premise measured on this GPU: a batch's latency while other streams run theirs (`stream_profile.json`).

For a `device: cuda` model, cell ⟨s, b⟩ is the mean latency of a batch of b rows while s streams each run such
batches at once (b in powers of two up to `max_batch_size`, s from 1 up to the streams of the default set), timed
the way a stream worker runs one (`adaserve.engine.streams`): on its own stream, through the CUDA graphs it captured
(with `cuda_graphs`), until its stream is synchronised. A cell is timed in trials until the last three agree,
Packrat's rule (`adaserve.cpu.profiler.settle`). `adaserve.engine.stream_choice` picks the worker set and MaxInf
from it.

The file sits beside the model, like Packrat's `profile.json`, and holds one profile per GPU model, torch version
and whether it replayed CUDA graphs (`cuda_graphs`, on a GPU), for the artifact it measured (`StreamKey`): a
profile is reused while its key matches and measured again when it does not, or when some of its cells did not
settle (it is still planned from, with a warning). The same code runs on the CPU
(threads with no streams, eager forward passes), so that tests run it end to end on a small model; such a profile's
device is the CPU's model name.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from adaserve.config import EBIRD_GRANULARITIES, ModelConfig
from adaserve.cpu.profiler import (
    ProfileError,
    ProfileSettings,
    Stability,
    Timing,
    artifact_digest,
    batch_grid,
    check_grid,
    cpu_model,
    distinct_increasing,
    one_each,
    random_inputs,
    read_document,
    settle,
    started_writing,
    write_document,
)
from adaserve.errors import ConfigError
from adaserve.repository import ModelSpec

STREAM_PROFILE_FILE = "stream_profile.json"
FORMAT: Literal[1] = 1

#: How a profile measured at load times its cells: short trials (a load waits for them), Packrat's stability rule.
LOAD_SETTINGS = ProfileSettings(warmup=3, repeats=20, min_cell_s=0.1, max_cell_s=2.0, max_trials=6)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class StreamKey(_Strict):
    """What makes a stream profile valid: the device that ran it, the torch, the artifact's bytes, and whether the
    workers replay CUDA graphs."""

    device: str = Field(min_length=1, description="the GPU's model name, or 'cpu: <model>' for the CPU form")
    torch: str
    artifact_sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    cuda_graphs: bool

    def describe(self) -> str:
        graphs = "CUDA graphs" if self.cuda_graphs else "eager"
        return f"{self.device}, torch {self.torch}, {graphs}, artifact {self.artifact_sha256[:12]}"


class StreamCell(Timing):
    """One stream's batches of `batch` rows beside `streams` − 1 others (`runs`: every stream's)."""

    streams: int = Field(ge=1)
    stability: Stability

    @property
    def name(self) -> str:
        return f"s={self.streams} b={self.batch}"


class StreamProfile(_Strict):
    """One device's stream profile of one model version."""

    key: StreamKey
    model: str
    version: int = Field(ge=1)
    created: str
    settings: ProfileSettings
    streams: tuple[int, ...] = Field(min_length=1)
    batches: tuple[int, ...] = Field(min_length=1)
    cells: tuple[StreamCell, ...]

    @field_validator("streams", "batches")
    @classmethod
    def _sorted_positive(cls, values: tuple[int, ...]) -> tuple[int, ...]:
        return distinct_increasing(values)

    @model_validator(mode="after")
    def _complete_grid(self) -> StreamProfile:
        check_grid([(c.streams, c.batch) for c in self.cells], self.streams, self.batches, "streams")
        return self

    def latency_s(self, streams: int, batch: int) -> float:
        """Cell ⟨streams, batch⟩'s mean latency."""
        return next(c.mean_s for c in self.cells if (c.streams, c.batch) == (streams, batch))

    def unstable(self) -> list[str]:
        """The cells whose trials did not agree, by name and spread."""
        return [f"{c.name} ({c.stability.spread_pct:.1f}%)" for c in self.cells if not c.stability.stable]


class StreamProfileFile(_Strict):
    """`stream_profile.json`: `{"format": 1, "profiles": [StreamProfile, ...]}`, at most one per key."""

    format: Literal[1]
    profiles: tuple[StreamProfile, ...]

    @field_validator("profiles")
    @classmethod
    def _one_per_key(cls, profiles: tuple[StreamProfile, ...]) -> tuple[StreamProfile, ...]:
        one_each([p.key for p in profiles], "key")
        return profiles


def stream_count(config: ModelConfig) -> int:
    """The streams of the default set on a GPU: Ebird's granularities capped at `max_batch_size`."""
    return sum(1 for g in EBIRD_GRANULARITIES if g <= config.max_batch_size)


def grid(config: ModelConfig) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The streams and batches a profile for `config` measures (a stored one of another grid is measured again)."""
    return tuple(range(1, stream_count(config) + 1)), batch_grid(config.max_batch_size)


def stream_key(spec: ModelSpec, device: Any) -> StreamKey:
    """The key of a profile of `spec` measured now on `device` (a `torch.device`)."""
    import torch

    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"cpu: {cpu_model()}"
    return StreamKey(
        device=name,
        torch=importlib.metadata.version("torch"),
        artifact_sha256=artifact_digest(spec.artifact),
        cuda_graphs=spec.config.cuda_graphs and device.type == "cuda",
    )


def find_profile(model_dir: Path, key: StreamKey) -> StreamProfile | None:
    """The stored profile of `key`, or None; ProfileError for a file that cannot be read."""
    path = model_dir / STREAM_PROFILE_FILE
    if not path.exists():
        return None
    return next((p for p in read_document(path, StreamProfileFile, FORMAT).profiles if p.key == key), None)


def save_profile(model_dir: Path, profile: StreamProfile) -> Path:
    """Store `profile`, replacing the profile of an older artifact on the same device, torch and `cuda_graphs`, and
    keeping other devices' (a corrupt file is replaced)."""
    path = model_dir / STREAM_PROFILE_FILE
    others: tuple[StreamProfile, ...] = ()
    if path.exists():
        same = profile.key.model_dump(exclude={"artifact_sha256"})
        with contextlib.suppress(ProfileError):
            stored = read_document(path, StreamProfileFile, FORMAT).profiles
            others = tuple(p for p in stored if p.key.model_dump(exclude={"artifact_sha256"}) != same)
    return write_document(path, StreamProfileFile(format=FORMAT, profiles=(*others, profile)))


def obtain_profile(
    spec: ModelSpec, device: Any, settings: ProfileSettings = LOAD_SETTINGS
) -> tuple[StreamProfile, str]:
    """This device's profile of `spec`, measured and stored first if there is none (nor one of this grid whose
    cells all settled: other work on the GPU may have disturbed it); and where it came from."""
    key = stream_key(spec, device)
    stored = find_profile(spec.directory, key)
    if stored is not None and (stored.streams, stored.batches) == grid(spec.config) and not stored.unstable():
        return stored, f"stream profile of {stored.created} ({key.describe()})"
    profile = measure_profile(spec, device, settings, key)
    save_profile(spec.directory, profile)
    return profile, f"stream profile measured at load ({key.describe()})"


def measure_profile(spec: ModelSpec, device: Any, settings: ProfileSettings, key: StreamKey) -> StreamProfile:
    """Load `spec` onto `device` as the host does and measure every ⟨s, b⟩ cell."""
    from adaserve.engine.streams import on_device
    from adaserve.repository import executable, read_artifact

    config = spec.config
    model = executable(on_device(read_artifact(spec.artifact, config.max_batch_size), device))
    streams, batches = grid(config)
    lanes = _lanes(config, getattr(model, "forward", model), device, streams[-1])
    cells = [_measure_cell(config, lanes[:s], b, device, settings) for s in streams for b in batches]
    return StreamProfile(
        key=key,
        model=spec.name,
        version=spec.version,
        created=datetime.now(UTC).isoformat(timespec="seconds"),
        settings=settings,
        streams=streams,
        batches=batches,
        cells=tuple(cells),
    )


#: A stream worker as the profile runs it: its stream (None on the CPU) and its forward pass.
Lane = tuple[Any, Callable[..., Any]]


def _lanes(config: ModelConfig, forward: Callable[..., Any], device: Any, count: int) -> list[Lane]:
    """`count` lanes made as `streams.stream_worker` makes them: a stream each and, with `cuda_graphs`, graphs of
    every size up to `max_batch_size` captured on it (so a batch of b replays the graph a worker would)."""
    import torch

    from adaserve.engine.streams import GraphedForward

    lanes: list[Lane] = []
    for _ in range(count):
        stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        own = forward
        if stream is not None and config.cuda_graphs:
            own = GraphedForward(forward, config.max_batch_size, stream)
        lanes.append((stream, own))
    return lanes


def _measure_cell(
    config: ModelConfig, lanes: Sequence[Lane], batch: int, device: Any, settings: ProfileSettings
) -> StreamCell:
    inputs = [tensor.to(device) for tensor in random_inputs(config, batch, seed=batch)]
    times, stability = settle(_trials(lanes, inputs, settings), settings)
    return StreamCell.of(times, streams=len(lanes), batch=batch, stability=stability)


def _trials(lanes: Sequence[Lane], inputs: Sequence[Any], settings: ProfileSettings) -> Iterator[list[float]]:
    """Warm each lane up (the first call captures its graphs), then one trial per `next` (`_Trial`)."""
    import torch

    with torch.inference_mode():
        for stream, forward in lanes:
            for _ in range(settings.warmup):
                _run(stream, forward, inputs)
    while True:
        yield _Trial(lanes, inputs, settings).run()


class _Trial:
    """Every lane runs batches on a thread of its own at once, until the first lane has run `repeats` and
    `min_cell_s` passed (or `max_cell_s`); the others stop after the batch they are running. Its latencies are all
    lanes' batches'."""

    def __init__(self, lanes: Sequence[Lane], inputs: Sequence[Any], settings: ProfileSettings) -> None:
        self._lanes, self._inputs, self._settings = lanes, inputs, settings
        self._done = threading.Event()
        self._start = threading.Barrier(len(lanes))
        self._times: list[list[float]] = [[] for _ in lanes]
        self._errors: list[BaseException] = []

    def run(self) -> list[float]:
        threads = [threading.Thread(target=self._lane, args=(index,)) for index in range(len(self._lanes))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if self._errors:
            raise self._errors[0]
        return [t for times in self._times for t in times]

    def _lane(self, index: int) -> None:
        import torch

        stream, forward = self._lanes[index]
        times, settings = self._times[index], self._settings
        try:
            with torch.inference_mode():
                self._start.wait()
                began = time.perf_counter()
                while not self._done.is_set():
                    at = time.perf_counter()
                    _run(stream, forward, self._inputs)
                    times.append(time.perf_counter() - at)
                    elapsed = time.perf_counter() - began
                    enough = len(times) >= settings.repeats and elapsed >= settings.min_cell_s
                    if index == 0 and (enough or (elapsed >= settings.max_cell_s and len(times) >= 3)):
                        self._done.set()
        except threading.BrokenBarrierError:
            pass  # another lane failed before the start
        except Exception as exc:
            self._errors.append(exc)
            self._done.set()
            self._start.abort()


def _run(stream: Any, forward: Callable[..., Any], inputs: Sequence[Any]) -> None:
    """One batch as a stream worker runs it: on its stream, done when the stream is."""
    from adaserve.engine.streams import on_stream

    with on_stream(stream):
        forward(*inputs)
    if stream is not None:
        stream.synchronize()


# -- at load: in a child process -------------------------------------------------------------------------------------


_CHILD = "from adaserve.engine.stream_profile import main; main()"

#: One profile at a time in a server (its models load side by side, and two profiles on one GPU would time each
#: other), and those it has read or measured, by artifact, `cuda_graphs` and grid: models of one artifact (a
#: benchmark's entries) share a measurement. A server drives one GPU.
_ONE_AT_A_TIME = threading.Lock()
_KNOWN: dict[tuple[str, bool, tuple[tuple[int, ...], tuple[int, ...]]], StreamProfile] = {}


def server_profile(spec: ModelSpec, started: Callable[[subprocess.Popen[bytes]], None]) -> tuple[StreamProfile, str]:
    """The profile a model loading in this server is planned from: one this server already has of the same
    artifact (stored beside this model too), or `profile_in_child`'s (`started` is given the child)."""
    known = (artifact_digest(spec.artifact), spec.config.cuda_graphs, grid(spec.config))
    with _ONE_AT_A_TIME:
        profile = _KNOWN.get(known)
        if profile is not None:
            save_profile(spec.directory, profile)
            return profile, f"stream profile of {profile.created} ({profile.key.describe()}), also another model's"
        profile, source = profile_in_child(spec, started)
        _KNOWN[known] = profile
        return profile, source


def profile_in_child(spec: ModelSpec, started: Callable[[subprocess.Popen[bytes]], None]) -> tuple[StreamProfile, str]:
    """`obtain_profile` on the GPU in a child Python, so that the server process never holds a CUDA context and
    the profile's memory is freed before the host loads the model; `started` is given the child (to end it if
    the load is given up); ConfigError with the child's reason."""
    job = {"config": spec.config.model_dump(mode="json"), "artifact": str(spec.artifact), "version": spec.version}
    with tempfile.TemporaryFile("w+") as log:
        read_fd, process = started_writing(
            lambda write_fd: subprocess.Popen(
                [sys.executable, "-c", _CHILD, json.dumps(job), str(write_fd)],
                pass_fds=(write_fd,),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
            )
        )
        started(process)
        with os.fdopen(read_fd) as results:
            answer = results.read()
        code = process.wait()
        if code != 0 or not answer:
            log.seek(0)
            answer = answer or json.dumps({"error": f"exit {code}: {log.read()[-2000:].strip()}"})
    result = json.loads(answer)
    if "error" in result:
        raise ConfigError(f"model '{spec.name}': stream profile: {result['error']}")
    return StreamProfile.model_validate(result["profile"]), str(result["source"])


def main() -> None:
    """The child's entry point: `python -c "from adaserve.engine.stream_profile import main; main()" JOB FD`."""
    from adaserve.engine.streams import cuda_device

    job, result_fd = json.loads(sys.argv[1]), int(sys.argv[2])
    with os.fdopen(result_fd, "w") as out:
        try:
            config = ModelConfig.model_validate(job["config"])
            artifact = Path(job["artifact"])
            spec = ModelSpec(config, job["version"], artifact, (job["version"],))
            profile, source = obtain_profile(spec, cuda_device())
        except Exception as exc:
            reason = str(exc) if isinstance(exc, ConfigError) else f"{type(exc).__name__}: {exc}"
            out.write(json.dumps({"error": reason}))
            sys.exit(1)
        out.write(json.dumps({"profile": profile.model_dump(mode="json"), "source": source}))
