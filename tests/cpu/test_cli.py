"""`adaserve profile` and `adaserve plan`, called through their parsed arguments (no server, no real profiling)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from adaserve.cpu import cli
from adaserve.cpu.optimizer import InfeasiblePlanError
from adaserve.cpu.profiler import (
    PROFILE_FILE,
    ProfileError,
    ProfileRecord,
    ProfileSettings,
    fingerprint,
    load_profile,
    save_profile,
)
from adaserve.cpu.topology import AllocationError, machine_topology
from adaserve.repository import ModelRepository, ModelSpec
from tests.cpu.test_profiler import (
    other_machine,
    synthetic_record,
    unstable_record,
    write_as_before_the_stability_rule,
)
from tests.server_utils import link_example


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="adaserve")
    cli.register(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args(list(argv))


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    args = parse(*argv)
    code = args.func(args)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def repository(tmp_path: Path) -> Path:
    link_example(tmp_path, "mlp")
    return tmp_path


def spec_in(root: Path) -> ModelSpec:
    return ModelRepository(root).read("mlp")


CPUS = len(machine_topology().cpus)


def test_arguments() -> None:
    args = parse("profile", "mlp", "--quick", "--repeats", "3", "--threads", "1", "--model-repository", "/r")
    assert (args.model, args.quick, args.repeats, args.threads, args.model_repository) == (
        "mlp",
        True,
        3,
        1,
        Path("/r"),
    )
    assert args.func is cli.profile_command and args.progress and not args.force
    assert (args.stability_percentage, args.max_trials) == (None, None)  # ProfileSettings' defaults
    args = parse("profile", "mlp", "--stability-percentage", "5", "--max-trials", "4")
    assert (args.stability_percentage, args.max_trials) == (5.0, 4)
    args = parse("plan", "mlp", "--batch", "12")
    assert (args.batch, args.threads, args.json, args.func) == (12, None, False, cli.plan_command)
    assert args.model_repository.name == "models"  # the example repository by default


@pytest.mark.parametrize(
    "argv",
    [
        ["plan", "mlp"],
        ["plan", "mlp", "--batch", "0"],
        ["profile", "mlp", "--threads", "x"],
        ["profile", "mlp", "--max-trials", "2"],
        ["profile", "mlp", "--stability-percentage", "0"],
    ],
)
def test_bad_arguments_exit(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as caught:
        parse(*argv)
    assert caught.value.code == 2
    assert "error" in capsys.readouterr().err


def test_plan_prints_workers_cores_latency_and_fat_instance(
    repository: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = spec_in(repository)
    save_profile(spec.directory, synthetic_record(spec, fingerprint(), threads=CPUS))
    code, out, err = run(capsys, "plan", "mlp", "--batch", "16", "--model-repository", str(repository))
    assert code == 0 and err == ""
    assert f"mlp: T={CPUS} threads, B=16 rows (planned from" in out
    assert "configuration [(i, t, b)]: [(" in out
    assert "per batch (profiled)  CPUs [" in out
    assert "expected batch latency: " in out
    assert f"fat instance ⟨1, {CPUS}, 16⟩: " in out and "(profiled)" in out
    assert "expected speedup over the fat instance: " in out


def test_plan_as_json(repository: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = spec_in(repository)
    save_profile(spec.directory, synthetic_record(spec, fingerprint(), threads=CPUS))
    code, out, _ = run(capsys, "plan", "mlp", "--batch", "12", "--json", "--model-repository", str(repository))
    shown = json.loads(out)
    assert code == 0 and shown["from_profile"] and shown["batch"] == 12
    assert sum(i["count"] * i["batch"] for i in shown["instances"]) == 12
    assert sorted(c for i in shown["instances"] for cpus in i["cpus"] for c in cpus) == sorted(
        {c for i in shown["instances"] for cpus in i["cpus"] for c in cpus}
    )  # disjoint
    assert shown["fat_instance"]["source"].startswith("interpolated between b=8 and b=16")


def test_plan_without_a_profile_states_the_default(repository: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "plan", "mlp", "--batch", "8", "--model-repository", str(repository))
    assert code == 0
    assert "no profile.json in" in err and "using the default: the fat instance" in err
    assert f"configuration [(i, t, b)]: [(1, {CPUS}, 8)]" in out
    assert "expected batch latency: unknown" in out


def test_plan_with_another_machines_profile_states_the_default(
    repository: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = spec_in(repository)
    save_profile(spec.directory, synthetic_record(spec, other_machine(fingerprint())))
    code, _, err = run(capsys, "plan", "mlp", "--batch", "8", "--model-repository", str(repository))
    assert code == 0 and "has no profile for this machine" in err and "Some Other CPU" in err


def test_plan_rejects_a_corrupt_profile(repository: Path) -> None:
    (repository / "mlp" / PROFILE_FILE).write_text('{"format": 1, "profiles": [{}]}')
    with pytest.raises(ProfileError, match=f"{repository / 'mlp' / PROFILE_FILE}: corrupt profile: field"):
        run_plain("plan", "mlp", "--batch", "8", "--model-repository", str(repository))


def run_plain(*argv: str) -> int:
    args = parse(*argv)
    return int(args.func(args))


def test_plan_refuses_more_threads_than_cpus(repository: Path) -> None:
    with pytest.raises(AllocationError, match=f"T={CPUS + 1} is more than the {CPUS} CPUs"):
        run_plain("plan", "mlp", "--batch", "8", "--threads", str(CPUS + 1), "--model-repository", str(repository))


def test_plan_refuses_a_batch_the_threads_cannot_hold(repository: Path) -> None:
    spec = spec_in(repository)
    save_profile(spec.directory, synthetic_record(spec, fingerprint(), threads=CPUS))
    with pytest.raises(InfeasiblePlanError, match=f"at most {CPUS * 16} rows"):
        run_plain("plan", "mlp", "--batch", str(CPUS * 16 + 1), "--model-repository", str(repository))


def test_profile_refuses_more_threads_than_cpus(repository: Path) -> None:
    with pytest.raises(AllocationError, match="more than the"):
        run_plain("profile", "mlp", "--threads", str(CPUS + 1), "--model-repository", str(repository))


class FakeProfiler:
    """Stands in for `profile_model`: returns a synthetic record and counts the calls."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, bool, int]] = []

    def __call__(self, spec: ModelSpec, threads: int, settings: ProfileSettings, **_: object) -> ProfileRecord:
        self.calls.append((threads, settings.quick, settings.repeats))
        self.settings = settings
        record = synthetic_record(spec, fingerprint(), threads=threads)
        return record.model_copy(update={"settings": settings, "load_average": (0.1, 0.2)})


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> FakeProfiler:
    profiler = FakeProfiler()
    monkeypatch.setattr(cli, "profile_model", profiler)
    return profiler


def test_profile_measures_saves_and_reuses(
    repository: Path, fake: FakeProfiler, capsys: pytest.CaptureFixture[str]
) -> None:
    where = ("--model-repository", str(repository))
    code, out, _ = run(capsys, "profile", "mlp", "--quick", "--no-progress", *where)
    assert code == 0 and fake.calls == [(CPUS, True, 5)]
    assert f"wrote {repository / 'mlp' / PROFILE_FILE}" in out and "quick run of" in out
    assert isinstance(load_profile(repository / "mlp", fingerprint(), spec_in(repository)), ProfileRecord)

    run(capsys, "profile", "mlp", "--quick", *where)
    assert len(fake.calls) == 1  # reused
    run(capsys, "profile", "mlp", "--quick", "--force", "--repeats", "2", *where)
    assert fake.calls[-1] == (CPUS, True, 2)
    run(capsys, "profile", "mlp", *where)  # a full run is not served by a quick profile
    assert fake.calls[-1] == (CPUS, False, 30)
    _, out, _ = run(capsys, "profile", "mlp", "--quick", *where)  # a quick request is served by a full profile
    assert len(fake.calls) == 3 and "reusing" in out


def test_profile_replaces_a_corrupt_file(
    repository: Path, fake: FakeProfiler, capsys: pytest.CaptureFixture[str]
) -> None:
    path = repository / "mlp" / PROFILE_FILE
    path.write_text("[")
    code, _, err = run(capsys, "profile", "mlp", "--quick", "--model-repository", str(repository))
    assert code == 0 and len(fake.calls) == 1
    assert f"{path}: corrupt profile, not valid JSON" in err and "measuring again replaces it" in err
    assert isinstance(load_profile(repository / "mlp", fingerprint(), spec_in(repository)), ProfileRecord)


def test_profile_warns_when_the_machine_was_busy(
    repository: Path, fake: FakeProfiler, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def busy(spec: ModelSpec, threads: int, settings: object, **kwargs: object) -> ProfileRecord:
        return FakeProfiler()(spec, threads, settings).model_copy(update={"load_average": (9.0, 9.5)})

    monkeypatch.setattr(cli, "profile_model", busy)
    _, _, err = run(capsys, "profile", "mlp", "--quick", "--model-repository", str(repository))
    assert "warning: the machine was busy while profiling (load average 9.00" in err


def test_profile_passes_the_stability_rule_on_and_measures_an_unstable_profile_again(
    repository: Path, fake: FakeProfiler, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = spec_in(repository)
    save_profile(spec.directory, unstable_record(spec))
    where = ("--model-repository", str(repository))
    code, out, _ = run(capsys, "profile", "mlp", "--quick", "--stability-percentage", "5", "--max-trials", "4", *where)
    assert code == 0 and len(fake.calls) == 1 and "wrote" in out  # not reused: it cannot be planned from
    assert (fake.settings.quick, fake.settings.stability_percentage, fake.settings.max_trials) == (True, 5, 4)


def test_profile_warns_of_the_unstable_cells_it_measured(
    repository: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(cli, "profile_model", lambda spec, threads, settings, **_: unstable_record(spec))
    code, out, err = run(capsys, "profile", "mlp", "--quick", "--model-repository", str(repository))
    assert code == 0 and "wrote" in out
    assert "adaserve profile: warning: unstable cells t=2 b=2 (spread 43.2%)" in err


def test_plan_refuses_an_unstable_profile_naming_its_cells(
    repository: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = spec_in(repository)
    save_profile(spec.directory, unstable_record(spec))
    code, out, err = run(capsys, "plan", "mlp", "--batch", "8", "--model-repository", str(repository))
    assert code == 0
    assert "adaserve plan: " in err and "unstable cells t=2 b=2 (spread 43.2%)" in err
    assert "is not planned from" in err and "using the default: the fat instance" in err
    assert f"configuration [(i, t, b)]: [(1, {CPUS}, 8)]" in out and "speedup" not in out


def test_plan_repeats_the_profiles_busy_warning(repository: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = spec_in(repository)
    busy = synthetic_record(spec, fingerprint(), threads=CPUS).model_copy(update={"load_average": (9.0, 9.5)})
    save_profile(spec.directory, busy)
    where = ("--model-repository", str(repository))
    code, out, err = run(capsys, "plan", "mlp", "--batch", "16", *where)
    assert code == 0 and "expected speedup over the fat instance" in out
    assert "adaserve plan: warning: the machine was busy while profiling (load average 9.00" in err
    _, out, err = run(capsys, "plan", "mlp", "--batch", "16", "--json", *where)
    (warning,) = json.loads(out)["warnings"]
    assert warning.startswith("the machine was busy while profiling") and warning in err


def test_plan_says_an_old_profiles_stability_is_unknown_and_plans_from_it(
    repository: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = spec_in(repository)
    write_as_before_the_stability_rule(
        save_profile(spec.directory, synthetic_record(spec, fingerprint(), threads=CPUS))
    )
    code, out, err = run(capsys, "plan", "mlp", "--batch", "16", "--model-repository", str(repository))
    assert code == 0 and "(planned from" in out
    assert "adaserve plan: warning: the profile of 2025-01-01T00:00:00+00:00 predates the stability rule" in err
