"""Worker-set planners without a server: the busy-thread limit a set gets when its config leaves
`batching.max_busy_threads` out, what `workers: auto` does with the profile it finds, and what a model with no
`workers` line does with the profile it finds, or without one."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import threading
import time
from pathlib import Path

import pytest

from adaserve import cpu
from adaserve.cpu.profiler import (
    PROFILER_NAME,
    ProfileRecord,
    StaleProfile,
    fingerprint,
    load_profile,
    save_profile,
)
from adaserve.engine import stream_profile
from adaserve.engine.engine import ModelEngine
from adaserve.engine.processes import ZYGOTE
from adaserve.engine.worker_sets import (
    FixedWorkerSet,
    PackratWorkerSet,
    ProfilingWorkerSet,
    StreamProfileWorkerSet,
    WorkerSetPlanner,
    create_worker_set_planner,
)
from adaserve.errors import ConfigError
from adaserve.repository import ModelRepository, ModelSpec
from tests.cpu.test_profiler import synthetic_record, unstable_record
from tests.engine.engines import run_engine
from tests.engine.stream_profiles import gpu_like, profile_of
from tests.server_utils import link_example, parent_pid


@pytest.mark.parametrize(("cpus", "limit"), [({0}, 1), ({0, 1}, 1), (set(range(16)), 15)])
def test_a_configured_set_leaves_one_cpu_to_the_frontend(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cpus: set[int], limit: int
) -> None:
    link_example(tmp_path, "mlp")
    planner = create_worker_set_planner(ModelRepository(tmp_path).read("mlp"))
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: cpus)
    assert planner.default_busy_threads() == limit


def test_a_packrat_set_may_keep_all_its_threads_busy(tmp_path: Path) -> None:
    link_example(tmp_path, "mlp", "mlp_auto", workers="auto", packrat={"threads": 2})
    planner = create_worker_set_planner(ModelRepository(tmp_path).read("mlp_auto"))
    assert planner.default_busy_threads() == 2


def test_a_packrat_set_is_not_planned_from_an_unstable_profile(tmp_path: Path) -> None:
    """`workers: auto` at server start: the stated default, its reason naming the cells that did not settle."""
    link_example(tmp_path, "mlp", "mlp_auto", workers="auto", packrat={"threads": 2})
    spec = ModelRepository(tmp_path).read("mlp_auto")
    save_profile(spec.directory, unstable_record(spec))
    choice = create_worker_set_planner(spec).initial()
    assert [(w.threads, w.batch) for w in choice.workers] == [(2, 16)]  # the fat instance
    assert "unstable cells t=2 b=2 (spread 43.2%)" in choice.reason and not choice.details["from_profile"]


def test_a_packrat_set_logs_its_profiles_warnings(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    link_example(tmp_path, "mlp", "mlp_auto", workers="auto", packrat={"threads": 2})
    spec = ModelRepository(tmp_path).read("mlp_auto")
    busy = synthetic_record(spec, fingerprint()).model_copy(update={"load_average": (9.0, 9.5)})
    save_profile(spec.directory, busy)
    with caplog.at_level(logging.WARNING, logger="adaserve.engine"):
        assert create_worker_set_planner(spec).initial().details["from_profile"]
    (record,) = caplog.records
    assert record.getMessage().startswith("Packrat profile: the machine was busy while profiling")


def no_workers_line(tmp_path: Path, **packrat: object) -> ModelSpec:
    """The example MLP with no `workers` line, T = 2 (the tests' harness leaves background profiling off unless
    `packrat` turns it on)."""
    link_example(tmp_path, "mlp", packrat={"threads": 2, **packrat})
    return ModelRepository(tmp_path).read("mlp")


def test_with_no_workers_line_a_usable_profile_is_planned_from(tmp_path: Path) -> None:
    spec = no_workers_line(tmp_path)
    save_profile(spec.directory, synthetic_record(spec, fingerprint()))
    planner = create_worker_set_planner(spec)
    choice = planner.initial()
    assert isinstance(planner, PackratWorkerSet) and choice.details["from_profile"]
    assert choice.reason.startswith("Packrat plan ⟨") and "profile of 2025-01-01" in choice.reason


def test_a_pinned_set_is_kept_whatever_the_profile(tmp_path: Path) -> None:
    link_example(tmp_path, "mlp", workers=[{"batch": 4}])
    spec = ModelRepository(tmp_path).read("mlp")
    save_profile(spec.directory, synthetic_record(spec, fingerprint()))
    assert isinstance(create_worker_set_planner(spec), FixedWorkerSet)


def test_without_a_profile_the_default_set_serves_while_one_is_measured(tmp_path: Path) -> None:
    spec = no_workers_line(tmp_path, background_profile=True)
    planner = create_worker_set_planner(spec)
    assert isinstance(planner, ProfilingWorkerSet) and planner.name == "default"
    choice = planner.initial()
    assert choice.workers == spec.config.worker_set
    assert choice.reason.endswith("; profiling in the background")
    assert planner.background == f"profiling in the background (no profile.json in {spec.directory})"
    assert planner.max_rows_in_flight() >= 2 * spec.config.max_batch_size  # room for a plan of T = 2
    planner.close()  # nothing was started: no sample was observed


def test_an_unstable_profile_is_measured_again_in_the_background(tmp_path: Path) -> None:
    spec = no_workers_line(tmp_path, background_profile=True)
    save_profile(spec.directory, unstable_record(spec))
    planner = create_worker_set_planner(spec)
    assert isinstance(planner, ProfilingWorkerSet)
    assert planner.background is not None and "unstable cells t=2 b=2 (spread 43.2%)" in planner.background


def test_a_corrupt_profile_is_measured_again_in_the_background(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    spec = no_workers_line(tmp_path, background_profile=True)
    (spec.directory / "profile.json").write_text("{")
    with caplog.at_level(logging.WARNING, logger="adaserve.engine"):
        assert isinstance(create_worker_set_planner(spec), ProfilingWorkerSet)
    (record,) = caplog.records
    assert "corrupt profile, not valid JSON" in record.getMessage()


def test_background_profile_false_never_profiles(tmp_path: Path) -> None:
    spec = no_workers_line(tmp_path, background_profile=False)
    planner = create_worker_set_planner(spec)
    assert isinstance(planner, FixedWorkerSet) and planner.sample_interval_s is None  # never observes, never profiles
    assert planner.initial().workers == spec.config.worker_set and planner.background is None


def test_the_background_profile_is_forked_by_the_zygote_at_the_lowest_priority_and_ends_with_close(
    tmp_path: Path,
) -> None:
    """A real profile's child: forked by the server's zygote, so it shares the zygote's torch rather than importing
    its own; SCHED_IDLE (nice 19 where refused) in a process group of its own; `close` (the engine stopping) ends
    it."""
    planner = ProfilingWorkerSet(no_workers_line(tmp_path, background_profile=True), "no profile")
    assert planner.observe(0, 0, time.monotonic()) is None  # the first sample starts the profile
    deadline = time.monotonic() + 120
    while (pid := planner.profiler_pid) is None:
        assert time.monotonic() < deadline, planner.background
        time.sleep(0.05)
    try:
        assert ZYGOTE._process is not None and parent_pid(pid) == ZYGOTE._process.pid
        assert Path(f"/proc/{pid}/comm").read_text().strip() == PROFILER_NAME
        assert os.getpgid(pid) == pid and os.getsid(pid) == pid
        idle = os.sched_getscheduler(pid) == os.SCHED_IDLE
        assert idle or os.getpriority(os.PRIO_PROCESS, pid) == 19
    finally:
        planner.close()
    while planner.profiler_pid is not None or any(t.name == "profile mlp" for t in threading.enumerate()):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # ended and reaped
    assert planner.observe(0, 0, time.monotonic()) is None  # the default set stays


def test_a_profile_stored_meanwhile_is_switched_to_with_its_busy_threads(tmp_path: Path) -> None:
    """`adaserve profile` ran while the default set served: the next attempt plans from it without measuring, and
    the set switched to keeps its T threads busy, where the default set left a CPU to the frontend."""
    spec = no_workers_line(tmp_path, background_profile=True)
    planner = create_worker_set_planner(spec)
    assert isinstance(planner, ProfilingWorkerSet)
    assert planner.default_busy_threads() == max(1, len(os.sched_getaffinity(0)) - 1)
    save_profile(spec.directory, synthetic_record(spec, fingerprint()))
    deadline = time.monotonic() + 60
    while (choice := planner.observe(0, 0, time.monotonic())) is None:
        assert time.monotonic() < deadline, planner.background
        time.sleep(0.05)
    assert choice.details["from_profile"] and choice.batch == spec.config.max_batch_size
    assert planner.name == "packrat" and planner.background is None and planner.profiler_pid is None
    assert planner.default_busy_threads() == 2
    assert planner.observe(0, 0, time.monotonic()) is None  # Packrat's estimator from now on: no new set yet


def test_unstable_background_profiles_are_retried_then_given_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Every measurement comes out unstable (a stand-in for the profiler): measured again after the back-off, at
    most `profile_attempts` times, each stored and none planned from; the default set stays."""
    spec = no_workers_line(tmp_path, background_profile=True, profile_retry_s=0.01, profile_attempts=2)
    calls: list[float] = []

    def unstable(*args: object, **kwargs: object) -> ProfileRecord:
        calls.append(time.monotonic())
        return unstable_record(spec)

    monkeypatch.setattr(cpu, "profile_model", unstable)
    planner = create_worker_set_planner(spec)
    assert isinstance(planner, ProfilingWorkerSet)
    deadline = time.monotonic() + 60
    with caplog.at_level(logging.INFO, logger="adaserve.engine"):
        while "gave up" not in (planner.background or ""):
            assert planner.observe(0, 0, time.monotonic()) is None
            assert time.monotonic() < deadline, planner.background
            time.sleep(0.01)
    assert len(calls) == 2 and planner.name == "default"
    retry, gave_up = [r.getMessage() for r in caplog.records if r.getMessage().startswith("profile unstable")]
    assert retry.startswith("profile unstable: unstable cells t=2 b=2 (spread 43.2%)")
    assert retry.endswith("; retrying in 0.01 s")
    assert "gave up after 2 background profile(s): the default set stays" in gave_up
    assert isinstance(load_profile(spec.directory, fingerprint(), spec), StaleProfile)  # stored, not planned from


def test_a_servers_models_are_profiled_one_at_a_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two models with no profile (a stand-in for the profiler that takes a while): their profiles are measured one
    after the other, and each model then switches to its plan."""
    specs = []
    for name in ("first", "second"):
        link_example(tmp_path, "mlp", name, packrat={"threads": 2, "background_profile": True})
        specs.append(ModelRepository(tmp_path).read(name))
    running: list[str] = []
    overlapped: list[list[str]] = []

    def slow(spec: ModelSpec, *args: object, **kwargs: object) -> ProfileRecord:
        running.append(spec.name)
        overlapped.append(list(running))
        time.sleep(0.2)
        running.remove(spec.name)
        return synthetic_record(spec, fingerprint())

    monkeypatch.setattr(cpu, "profile_model", slow)
    planners = [create_worker_set_planner(spec) for spec in specs]
    deadline = time.monotonic() + 60
    switched: set[str] = set()
    while len(switched) < 2:
        for spec, planner in zip(specs, planners, strict=True):
            if planner.observe(0, 0, time.monotonic()) is not None:
                switched.add(spec.name)
        assert time.monotonic() < deadline, [planner.background for planner in planners]
        time.sleep(0.01)
    assert sorted(overlapped) == [["first"], ["second"]]  # each measured once, never beside the other


def test_a_stopping_engine_ends_its_background_profile(tmp_path: Path) -> None:
    """The engine observes the load once it serves, which starts the profile; its stop ends the profiler."""
    link_example(tmp_path, "mlp", packrat={"threads": 1, "background_profile": True})
    pids: list[int] = []

    async def body(engine: ModelEngine) -> None:
        planner = engine.planner
        assert isinstance(planner, ProfilingWorkerSet)
        deadline = time.monotonic() + 120
        while planner.profiler_pid is None:
            assert time.monotonic() < deadline, planner.background
            await asyncio.sleep(0.02)
        pids.append(planner.profiler_pid)

    run_engine(tmp_path, body)
    deadline = time.monotonic() + 60
    while any(thread.name == "profile mlp" for thread in threading.enumerate()):
        assert time.monotonic() < deadline
        time.sleep(0.02)
    with pytest.raises(ProcessLookupError):
        os.kill(pids[0], 0)  # ended, and reaped by the profiling thread
    assert not (tmp_path / "mlp" / "profile.json").exists()  # a profile left to finish would have been stored


def cuda_planner(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **overrides: object) -> WorkerSetPlanner:
    """A CUDA MLP's planner, its stream profile `gpu_like` as the child process would have read it."""
    link_example(tmp_path, "mlp", device="cuda", max_batch_size=8, **overrides)
    stored = profile_of(gpu_like)
    monkeypatch.setattr(stream_profile, "_KNOWN", {})
    monkeypatch.setattr(
        stream_profile, "profile_in_child", lambda spec, _: (stored, f"stream profile of {stored.created} (H200)")
    )
    return create_worker_set_planner(ModelRepository(tmp_path).read("mlp"))


def test_a_cuda_model_with_no_workers_line_gets_its_set_and_max_inflight_from_the_stream_profile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    planner = cuda_planner(tmp_path, monkeypatch, batching={"latency_target_ms": 50})
    assert isinstance(planner, StreamProfileWorkerSet) and planner.max_rows_in_flight() == 5 * 8
    choice = planner.prepare()
    assert [w.batch for w in choice.workers] == [2, 2, 2] and choice.max_inflight == 6
    assert choice.reason.startswith("3 stream(s) of batch 2, MaxInf 6: the most rows a second (5000")
    assert choice.reason.endswith("the 50 ms target; from the stream profile of 2026-12-01T00:00:00+00:00 (H200)")
    assert choice.details["meets_target"] and choice.details["expected_latency_ms"] == pytest.approx(2.4)


def test_a_configured_max_inflight_still_pins_it_beside_the_chosen_streams(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    planner = cuda_planner(tmp_path, monkeypatch, max_inflight=4)
    choice = planner.prepare()
    assert choice.details["max_inflight"] == 4 and choice.reason.endswith("; max_inflight 4 configured")
    assert planner.max_rows_in_flight() == 4


def test_a_target_no_set_meets_is_warned_of(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    planner = cuda_planner(tmp_path, monkeypatch, batching={"latency_target_ms": 1})
    with caplog.at_level(logging.WARNING, logger="adaserve.engine"):
        choice = planner.prepare()
    assert [w.batch for w in choice.workers] == [1] and not choice.details["meets_target"]
    (record,) = caplog.records
    assert record.getMessage().startswith("stream profile: 1 stream(s) of batch 1, MaxInf 1: no set meets the 1 ms")


def test_models_of_one_artifact_in_a_server_share_one_stream_profile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = cuda_planner(tmp_path, monkeypatch)
    calls: list[str] = []
    measured = stream_profile.profile_in_child
    monkeypatch.setattr(
        stream_profile, "profile_in_child", lambda spec, _: calls.append(spec.name) or measured(spec, _)
    )
    link_example(tmp_path, "mlp", "mlp_again", device="cuda", max_batch_size=8)
    again = ModelRepository(tmp_path).read("mlp_again")
    first.prepare()
    choice = create_worker_set_planner(again).prepare()
    assert calls == ["mlp"] and "), also another model's" in choice.reason
    assert stream_profile.find_profile(again.directory, profile_of(gpu_like).key) == profile_of(gpu_like)


def test_a_load_given_up_while_its_stream_profile_measures_ends_the_profile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    link_example(tmp_path, "mlp", device="cuda", max_batch_size=8)
    monkeypatch.setattr(stream_profile, "_KNOWN", {})
    monkeypatch.setattr(stream_profile, "_CHILD", "import time; time.sleep(300)")  # a profile that takes its time
    planner = create_worker_set_planner(ModelRepository(tmp_path).read("mlp"))
    assert isinstance(planner, StreamProfileWorkerSet)
    errors: list[Exception] = []

    def prepare() -> None:
        try:
            planner.prepare()
        except ConfigError as exc:
            errors.append(exc)

    thread = threading.Thread(target=prepare)
    thread.start()
    deadline = time.monotonic() + 60
    while planner._child is None and time.monotonic() < deadline:
        time.sleep(0.01)
    planner.close()  # as the engine's stop does
    thread.join(timeout=60)
    assert not thread.is_alive() and planner._child.returncode == -signal.SIGKILL
    assert "stream profile: exit -9" in str(errors[0])


def test_a_cuda_models_workers_line_still_pins_its_set(tmp_path: Path) -> None:
    link_example(tmp_path, "mlp", device="cuda", workers=[{"batch": 4}, {"batch": 16}])
    planner = create_worker_set_planner(ModelRepository(tmp_path).read("mlp"))
    assert isinstance(planner, FixedWorkerSet) and planner.prepare() is None
