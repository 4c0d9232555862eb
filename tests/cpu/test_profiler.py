"""The profiler end to end (`adaserve profile mlp --quick` on a copy of the example), and profile.json's rules:
reused when it matches, stale (a stated default) when it does not, rejected with path and reason when corrupt."""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from adaserve.cpu.cli import plan_command, profile_command
from adaserve.cpu.optimizer import Optimizer
from adaserve.cpu.profiler import (
    PROFILE_FILE,
    AutoPlanner,
    Cell,
    Fingerprint,
    ProfileError,
    ProfileRecord,
    ProfileSettings,
    Stability,
    StaleProfile,
    artifact_digest,
    batch_grid,
    fingerprint,
    load_profile,
    measure_cell,
    profile_model,
    profile_warnings,
    save_profile,
)
from adaserve.cpu.topology import AllocationError, Cpu, Topology, machine_topology
from adaserve.repository import ModelRepository, ModelSpec
from tests.server_utils import EXAMPLES, link_example


@pytest.fixture(scope="module")
def measured(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, float]:
    """`adaserve profile mlp --quick` once, for real, on a repository whose artifact links to the example."""
    root = tmp_path_factory.mktemp("profiled")
    link_example(root, "mlp")
    began = time.perf_counter()
    assert profile_command(profile_args(root, progress=True)) == 0
    return root, time.perf_counter() - began


def profile_args(root: Path, *, progress: bool) -> argparse.Namespace:
    """`adaserve profile mlp --quick`, with a stability percentage wide enough that other work on a shared test
    machine does not leave a cell unstable (the rule itself is tested on fake trials below)."""
    return argparse.Namespace(
        model="mlp",
        model_repository=root,
        threads=None,
        quick=True,
        repeats=None,
        stability_percentage=100.0,
        max_trials=None,
        force=False,
        progress=progress,
    )


def spec_in(root: Path, name: str = "mlp") -> ModelSpec:
    return ModelRepository(root).read(name)


def synthetic_record(spec: ModelSpec, machine: Fingerprint, threads: int = 2) -> ProfileRecord:
    batches = batch_grid(spec.config.max_batch_size)
    settled = Stability(trials=3, spread_pct=1.0, stable=True)
    cells = [
        Cell(threads=t, batch=b, mean_s=1e-3 * b / t**0.5, p50_s=1e-3 * b / t**0.5, std_s=0, runs=5, stability=settled)
        for t in range(1, threads + 1)
        for b in batches
    ]
    return ProfileRecord(
        fingerprint=machine,
        model=spec.name,
        version=spec.version,
        artifact_sha256=artifact_digest(spec.artifact),
        torch="2.13.0",
        created="2025-01-01T00:00:00+00:00",
        settings=ProfileSettings.for_run(quick=True),
        threads=tuple(range(1, threads + 1)),
        batches=batches,
        cells=tuple(cells),
    )


def other_machine(machine: Fingerprint) -> Fingerprint:
    return machine.model_copy(update={"cpu_model": "Some Other CPU", "sockets": 2})


def test_quick_profile_of_the_example_mlp(measured: tuple[Path, float]) -> None:
    root, seconds = measured
    assert seconds < 60  # ~12 s on the 2-core VM: two child processes, each importing torch and loading the model
    spec = spec_in(root)
    machine = fingerprint()
    record = load_profile(spec.directory, machine, spec)
    assert isinstance(record, ProfileRecord)
    cpus = len(machine_topology().cpus)
    assert record.threads == tuple(range(1, cpus + 1))
    assert record.batches == (1, 2, 4, 8, 16)
    assert len(record.cells) == cpus * 5
    assert all(c.mean_s > 0 and c.runs >= 3 * 5 for c in record.cells)  # the last 3 trials' runs
    assert all(c.stability is not None and c.stability.trials >= 3 for c in record.cells)
    assert record.settings.stability_percentage == 100.0 and record.settings.max_trials == 10
    assert record.settings.quick and record.model == "mlp" and record.version == 1
    assert record.torch.startswith("2.")
    assert record.load_average is not None  # latencies are not compared: other work may share these 2 cores
    raw = json.loads((spec.directory / PROFILE_FILE).read_text())
    assert raw["format"] == 1 and raw["profiles"][0]["fingerprint"] == machine.model_dump()
    example = EXAMPLES / "mlp" / PROFILE_FILE  # serving the examples may have written one: this run's is not in it
    assert not example.exists() or record.created not in example.read_text()


def test_a_matching_profile_is_reused(measured: tuple[Path, float], capsys: pytest.CaptureFixture[str]) -> None:
    root, _ = measured
    before = (root / "mlp" / PROFILE_FILE).read_text()
    began = time.perf_counter()
    assert profile_command(profile_args(root, progress=False)) == 0
    assert time.perf_counter() - began < 5
    out = capsys.readouterr().out
    assert "reusing the profile" in out and "mean batch latency (ms)" in out
    assert (root / "mlp" / PROFILE_FILE).read_text() == before


def test_plan_from_the_measured_profile(measured: tuple[Path, float], capsys: pytest.CaptureFixture[str]) -> None:
    root, _ = measured
    spec = spec_in(root)
    result = AutoPlanner(spec).plan(16)
    assert result.from_profile
    plan = result.plan
    assert sum(i.count * i.batch for i in plan.instances) == 16
    assert plan.threads_used <= len(machine_topology().cpus)
    assert plan.fat_source == "profiled" and plan.speedup is not None and plan.speedup >= 1
    assert [w.batch for w in result.workers] == [i.batch for i in plan.instances for _ in range(i.count)]
    args = argparse.Namespace(model="mlp", model_repository=root, threads=None, batch=16, json=True)
    assert plan_command(args) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["from_profile"] and shown["latency_s"] == plan.latency_s


def test_profile_with_an_injected_runner_assembles_the_grid(tmp_path: Path) -> None:
    """The grid and the pinning each forked process is given, without starting processes."""
    link_example(tmp_path, "mlp")
    spec = spec_in(tmp_path)
    jobs: list[dict[str, Any]] = []

    def runner(job: dict[str, Any], record: Callable[[Cell], None]) -> None:
        jobs.append(job)
        for placement in job["placements"]:
            threads = placement["threads"]
            for b in job["batches"]:
                record(Cell(threads=threads, batch=b, mean_s=b / threads, p50_s=1, std_s=0, runs=1))

    topology = machine_topology()
    record = profile_model(spec, 1, ProfileSettings.for_run(quick=True, repeats=3), progress=False, runner=runner)
    assert len(jobs) == 1  # one child loads the model for every t
    assert jobs[0]["placements"] == [{"threads": 1, "cpus": [topology.ids[0]]}]
    assert jobs[0]["settings"]["repeats"] == 3
    assert record.profile.latency_s[1, 8] == 8


def test_more_threads_than_cpus_is_refused(tmp_path: Path) -> None:
    link_example(tmp_path, "mlp")
    cpus = len(machine_topology().cpus)
    with pytest.raises(AllocationError, match=f"T={cpus + 1} is more than the {cpus} CPUs"):
        profile_model(spec_in(tmp_path), cpus + 1, ProfileSettings.for_run(quick=True), progress=False)
    with pytest.raises(AllocationError, match="more than"):
        AutoPlanner(spec_in(tmp_path), threads=cpus + 1)


def test_a_failing_child_reports_its_reason(tmp_path: Path) -> None:
    root = tmp_path / "models"
    link_example(root, "mlp", "mlp_broken")
    artifact = root / "mlp_broken" / "1" / "model.pt2"
    artifact.unlink()
    artifact.write_bytes(b"not a torch.export archive")
    expected = r"mlp_broken/1/model.pt2 failed \(exit 1\): .*model.pt2: cannot load model: BadZipFile"
    with pytest.raises(ProfileError, match=expected):
        profile_model(spec_in(root, "mlp_broken"), 1, ProfileSettings.for_run(quick=True), progress=False)


def test_a_failing_thread_count_is_named_in_the_error(tmp_path: Path) -> None:
    """The process forked for t = 1 is given a CPU that does not exist: its reason and its t reach the error."""
    link_example(tmp_path, "mlp")
    absent = Topology(tuple(Cpu(id=10**6 + i, socket=0, core=i, node=0) for i in range(2)))
    with pytest.raises(ProfileError, match=r"failed \(exit 1\): t=1: OSError: .*; the process measuring t=1 failed"):
        profile_model(spec_in(tmp_path), 2, ProfileSettings.for_run(quick=True), topology=absent, progress=False)


# -- stale and keyed ---------------------------------------------------------------------------------------------


def test_missing_profile_is_stale(tmp_path: Path) -> None:
    link_example(tmp_path, "mlp")
    found = load_profile(tmp_path / "mlp", fingerprint())
    assert isinstance(found, StaleProfile)
    assert found.reason == f"no profile.json in {tmp_path / 'mlp'}"
    result = AutoPlanner(spec_in(tmp_path)).plan(64)
    assert not result.from_profile
    cpus = len(machine_topology().cpus)
    assert result.plan.triples == [(1, cpus, 16)]  # the fat instance, its batch capped at max_batch_size
    assert "using the default: the fat instance" in result.note and "adaserve profile mlp" in result.note


def test_profiles_are_keyed_by_fingerprint(tmp_path: Path) -> None:
    link_example(tmp_path, "mlp")
    spec = spec_in(tmp_path)
    machine = fingerprint()
    save_profile(spec.directory, synthetic_record(spec, other_machine(machine)))
    found = load_profile(spec.directory, machine, spec)
    assert isinstance(found, StaleProfile)
    assert "has no profile for this machine" in found.reason and "Some Other CPU" in found.reason
    save_profile(spec.directory, synthetic_record(spec, machine, threads=1))
    save_profile(spec.directory, synthetic_record(spec, machine, threads=2))  # replaces this machine's entry only
    stored = json.loads((spec.directory / PROFILE_FILE).read_text())["profiles"]
    assert [p["fingerprint"]["cpu_model"] for p in stored] == ["Some Other CPU", machine.cpu_model]
    mine = load_profile(spec.directory, machine, spec)
    assert isinstance(mine, ProfileRecord) and mine.threads == (1, 2)
    assert Optimizer(mine.profile).plan(2, 16).latency_s > 0


def test_a_changed_model_makes_the_profile_stale(tmp_path: Path) -> None:
    link_example(tmp_path, "mlp")
    spec = spec_in(tmp_path)
    machine = fingerprint()
    save_profile(spec.directory, synthetic_record(spec, machine).model_copy(update={"artifact_sha256": "0" * 64}))
    found = load_profile(spec.directory, machine, spec)
    assert isinstance(found, StaleProfile) and "changed since it was profiled" in found.reason
    save_profile(spec.directory, synthetic_record(spec, machine).model_copy(update={"version": 7}))
    found = load_profile(spec.directory, machine, spec)
    assert isinstance(found, StaleProfile) and "profiles version 7, the model is now 1" in found.reason


# -- corrupt files -----------------------------------------------------------------------------------------------


def corrupt_cases(good: dict[str, object]) -> list[tuple[object, str]]:
    profile = json.loads(json.dumps(good["profiles"]))[0]

    def with_profile(**changes: object) -> dict[str, object]:
        return {"format": 1, "profiles": [{**profile, **changes}]}

    cells = profile["cells"]
    return [
        ("{not json", "not valid JSON"),
        ([1, 2], "corrupt profile"),
        ({"format": 9, "profiles": []}, "format 9 is not supported"),
        ({"format": 1}, "field 'profiles': Field required"),
        (with_profile(cells=cells[:-1]), r"missing \(threads, batch\) cells \[\(2, 16\)\]"),
        (with_profile(cells=[*cells, cells[0]]), r"repeated \(threads, batch\) cells \[\(1, 1\)\]"),
        (with_profile(cells=[{**cells[0], "mean_s": -1.0}, *cells[1:]]), "profiles.0.cells.0.mean_s"),
        (with_profile(threads=[2, 1]), "increasing order"),
        (with_profile(surprise=1), "unknown field"),
        ({"format": 1, "profiles": [profile, profile]}, "two profiles for the same fingerprint"),
    ]


def test_corrupt_profiles_are_rejected_with_path_and_reason(tmp_path: Path) -> None:
    link_example(tmp_path, "mlp")
    spec = spec_in(tmp_path)
    machine = fingerprint()
    path = save_profile(spec.directory, synthetic_record(spec, machine))
    good = json.loads(path.read_text())
    for content, reason in corrupt_cases(good):
        path.write_text(content if isinstance(content, str) else json.dumps(content))
        with pytest.raises(ProfileError, match=reason) as caught:
            load_profile(spec.directory, machine, spec)
        assert str(caught.value).startswith(f"{path}: ")
        with pytest.raises(ProfileError, match=reason):
            AutoPlanner(spec)


def test_a_corrupt_profile_is_replaced_when_measuring_again(tmp_path: Path) -> None:
    link_example(tmp_path, "mlp")
    spec = spec_in(tmp_path)
    (spec.directory / PROFILE_FILE).write_text("{")
    machine = fingerprint()
    save_profile(spec.directory, synthetic_record(spec, machine))
    assert isinstance(load_profile(spec.directory, machine, spec), ProfileRecord)


def test_batch_grid() -> None:
    assert batch_grid(16) == (1, 2, 4, 8, 16)
    assert batch_grid(12) == (1, 2, 4, 8)
    assert batch_grid(1) == (1,)


# -- the stability rule ------------------------------------------------------------------------------------------


def fake_trials(means_ms: list[float]) -> tuple[Iterator[list[float]], list[int]]:
    """Trials of two runs each at the given mean latencies, and a list that counts the trials taken."""
    taken: list[int] = []

    def trials() -> Iterator[list[float]]:
        for mean in means_ms:
            taken.append(1)
            yield [mean * 0.9e-3, mean * 1.1e-3]

    return trials(), taken


def test_agreeing_trials_stop_after_three() -> None:
    trials, taken = fake_trials([1.0, 1.05, 0.97, 5.0, 5.0])
    cell = measure_cell(2, 4, trials, ProfileSettings(stability_percentage=10, max_trials=10))
    assert len(taken) == 3 and cell.stability == Stability(trials=3, spread_pct=4.3, stable=True)
    assert (cell.threads, cell.batch, cell.runs) == (2, 4, 6)
    assert cell.mean_s == pytest.approx(1.00667e-3, rel=1e-4)


def test_a_cell_that_settles_late_is_measured_on_its_last_three_trials() -> None:
    trials, taken = fake_trials([24.0, 1.0, 1.02, 0.99])
    cell = measure_cell(1, 1, trials, ProfileSettings(max_trials=10))
    assert len(taken) == 4 and cell.stability is not None and cell.stability.stable
    assert cell.mean_s == pytest.approx(1.00333e-3, rel=1e-4)  # the 24 ms first trial is not in it


def test_disagreeing_trials_stop_at_max_trials_marked_unstable() -> None:
    trials, taken = fake_trials([1.0, 2.0] * 10)
    cell = measure_cell(2, 2, trials, ProfileSettings(stability_percentage=10, max_trials=5))
    assert len(taken) == 5
    assert cell.stability == Stability(trials=5, spread_pct=50.0, stable=False)  # 1, 2, 1 around 4/3
    assert cell.runs == 6


def test_quick_runs_shorter_trials_under_the_same_rule() -> None:
    quick, full = ProfileSettings.for_run(quick=True), ProfileSettings.for_run(quick=False)
    assert quick.repeats < full.repeats and quick.min_cell_s < full.min_cell_s
    assert (quick.stability_percentage, quick.max_trials) == (full.stability_percentage, full.max_trials) == (10, 10)
    given = ProfileSettings.for_run(quick=True, repeats=3, stability_percentage=5, max_trials=4)
    assert (given.quick, given.repeats, given.stability_percentage, given.max_trials) == (True, 3, 5, 4)


def unstable_record(spec: ModelSpec) -> ProfileRecord:
    """A synthetic profile whose t=2 b=2 cell did not settle, as a busy machine's quick profile did in issue 53."""
    record = synthetic_record(spec, fingerprint())
    noisy = Stability(trials=10, spread_pct=43.2, stable=False)
    cells = tuple(
        c.model_copy(update={"mean_s": 23.99e-3, "stability": noisy}) if (c.threads, c.batch) == (2, 2) else c
        for c in record.cells
    )
    return record.model_copy(update={"cells": cells})


def test_an_unstable_profile_is_stored_but_not_planned_from(tmp_path: Path) -> None:
    link_example(tmp_path, "mlp")
    spec = spec_in(tmp_path)
    path = save_profile(spec.directory, unstable_record(spec))
    assert json.loads(path.read_text())["profiles"][0]["cells"][6]["stability"]["stable"] is False  # t=2 b=2
    found = load_profile(spec.directory, fingerprint(), spec)
    assert isinstance(found, StaleProfile)
    assert found.reason.startswith(f"{path}: unstable cells t=2 b=2 (spread 43.2%): ")
    assert "did not agree within 10% in 10 trials" in found.reason
    result = AutoPlanner(spec, threads=1).plan(8)
    assert not result.from_profile and result.plan.triples == [(1, 1, 8)]  # the fat instance
    assert "unstable cells t=2 b=2" in result.note and "using the default: the fat instance" in result.note


def write_as_before_the_stability_rule(path: Path) -> None:
    """Rewrite profile.json as adaserve wrote it before the stability rule: no stability settings or fields."""
    raw = json.loads(path.read_text())
    for profile in raw["profiles"]:
        for key in ("stability_percentage", "max_trials"):
            del profile["settings"][key]
        for cell in profile["cells"]:
            del cell["stability"]
    path.write_text(json.dumps(raw))


def test_a_profile_from_before_the_stability_rule_loads_and_plans_with_a_warning(tmp_path: Path) -> None:
    link_example(tmp_path, "mlp")
    spec = spec_in(tmp_path)
    write_as_before_the_stability_rule(save_profile(spec.directory, synthetic_record(spec, fingerprint())))
    found = load_profile(spec.directory, fingerprint(), spec)
    assert isinstance(found, ProfileRecord) and all(c.stability is None for c in found.cells)
    (warning,) = profile_warnings(found)
    assert "predates the stability rule" in warning and "adaserve profile mlp --force" in warning
    planner = AutoPlanner(spec, threads=1)
    assert planner.plan(8).from_profile and planner.warnings == [warning]
