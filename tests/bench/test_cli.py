"""`adaserve bench` argument handling and failures that need no server."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from adaserve.bench.cli import ExitCode, build_config
from adaserve.bench.report import write_report
from adaserve.bench.schedules import BurstSpec, ClosedSpec, DiurnalSpec, SequenceSpec, StepSpec, TraceSpec
from tests.bench.factories import parse_cli, record, result
from tests.server_utils import free_port


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    args = parse_cli(*argv)
    code = args.func(args)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--url", "h:1", "--model", "m", "--input", "x.npy", "--rate", "1", "--duration", "1"], "NAME=FILE.npy"),
        (["--url", "h:1", "--rate", "1", "--duration", "1"], "--model (or --workload) is required"),
        (["--url", "h:1", "--model", "m", "--duration", "1"], "say how to send"),
        (["--url", "h:1", "--model", "m", "--rate", "1"], "needs a bound"),
        (
            ["--url", "h:1", "--model", "m", "--rate", "1", "--concurrency", "2", "--duration", "1"],
            "choose one load: --concurrency and --rate",
        ),
        (
            ["--url", "h:1", "--model", "m", "--trace", "t.csv", "--duration", "1", "--concurrency", "1"],
            "--constant and --trace need --rate",
        ),
        (
            ["--url", "h:1", "--model", "m", "--rate", "1", "--duration", "1", "--param", "oops"],
            "--param 'oops': expected KEY=VALUE",
        ),
        (["--url", "h:1", "--model", "m", "--steps", "0:1,x:2", "--duration", "1"], "expected numbers"),
        (["--url", "h:1", "--model", "m", "--rate", "-5", "--duration", "1"], "load.poisson.rate"),
        (["--url", "ftp://h:1", "--model", "m", "--rate", "5", "--duration", "1"], "expected host:port"),
        (["--url", "https://h:1", "--protocol", "grpc", "--model", "m", "--rate", "5", "--duration", "1"], "HTTP's"),
        (["--url", "h", "--model", "m", "--rate", "5", "--duration", "1"], "expected host:port"),
        (
            ["--url", "h:1", "--model", "m", "--concurrency", "1", "--requests", "1", "--rows", "2"],
            "--rows applies to --input",
        ),
    ],
)
def test_argument_errors_exit_2_with_a_message(
    capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    code, _, err = _run(capsys, "bench", *argv)
    assert code == ExitCode.BAD_INPUT
    assert err.startswith("adaserve bench: error: ") and message in err


def test_the_url_defaults_to_where_serve_listens_by_default() -> None:
    """As `adaserve infer`'s does: the HTTP port, or the gRPC one with --protocol grpc."""
    base = ["bench", "--model", "m", "--rate", "1", "--duration", "1"]
    assert build_config(parse_cli(*base)).url == "127.0.0.1:8000"
    assert build_config(parse_cli(*base, "--protocol", "grpc")).url == "127.0.0.1:8001"


def test_flags_build_each_load() -> None:
    base = ["bench", "--url", "h:1", "--model", "m", "--duration", "5"]
    assert build_config(parse_cli(*base, "--concurrency", "3")).workload.load == ClosedSpec(concurrency=3)
    steps = build_config(parse_cli(*base, "--steps", "0:10,2.5:40", "--seed", "7")).workload.load
    assert steps == StepSpec(steps=((0, 10), (2.5, 40)), seed=7)
    burst = build_config(parse_cli(*base, "--burst", "base_rate=5,burst_rate=50,burst_s=1,every_s=4")).workload.load
    assert burst == BurstSpec(base_rate=5, burst_rate=50, burst_s=1, every_s=4)
    diurnal = build_config(parse_cli(*base, "--diurnal", "mean_rate=20,period_s=60")).workload.load
    assert diurnal == DiurnalSpec(mean_rate=20, period_s=60)
    trace = build_config(parse_cli(*base, "--rate", "9", "--trace", "t.csv", "--skip-bad-lines")).workload.load
    assert isinstance(trace, TraceSpec) and trace.rate == 9 and trace.skip_bad_lines


def test_parameters_and_inputs_from_flags() -> None:
    config = build_config(
        parse_cli(
            "bench",
            "--url",
            "h:1",
            "--model",
            "a",
            "--model",
            "b",
            "--rate",
            "5",
            "--requests",
            "10",
            "--param",
            "latency_ms=20",
            "--param",
            "accuracy=0.9",
            "--param",
            "early=true",
            "--param",
            "tag=x",
            "--shape",
            "image=2,784",
        )
    )
    first, second = config.workload.requests
    assert (first.model, second.model) == ("a", "b")
    assert first.parameters == {"latency_ms": 20, "accuracy": 0.9, "early": True, "tag": "x"}
    assert first.inputs[0].shape == (2, 784)


def test_workload_file_with_flag_overrides(tmp_path: Path) -> None:
    (tmp_path / "w.yaml").write_text("requests: [{model: mlp}]\nload: {kind: poisson, rate: 5}\nduration_s: 9\n")
    config = build_config(
        parse_cli("bench", "--url", "h:1", "--workload", str(tmp_path / "w.yaml"), "--rate", "50", "--duration", "2")
    )
    assert config.workload.load.rate == 50 and config.workload.duration_s == 2  # type: ignore[union-attr]


def test_trace_with_bad_lines_is_refused_before_sending(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    (tmp_path / "t.csv").write_text("TIMESTAMP\n1.0\ngarbage\n2.0\n")
    code, out, err = _run(
        capsys,
        "bench",
        "--url",
        f"127.0.0.1:{free_port()}",
        "--model",
        "m",
        "--rate",
        "5",
        "--trace",
        str(tmp_path / "t.csv"),
        "--duration",
        "1",
        "--output",
        str(tmp_path / "r.json"),
    )
    assert code == ExitCode.BAD_INPUT
    assert "line 3: 'garbage'" in err and out == ""
    assert not (tmp_path / "r.json").exists()


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_unreachable_server_exits_3_with_a_report(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, protocol: str
) -> None:
    output = tmp_path / "r.json"
    code, out, err = _run(
        capsys,
        "bench",
        "--url",
        f"127.0.0.1:{free_port()}",
        "--protocol",
        protocol,
        "--model",
        "mlp",
        "--rate",
        "5",
        "--duration",
        "1",
        "--output",
        str(output),
        "--quiet",
    )
    assert code == ExitCode.UNREACHABLE
    assert "adaserve bench: error: cannot reach 127.0.0.1:" in err
    assert "refused" in err.lower() or "connect" in err.lower()
    assert "NOT VALID" in out
    report = json.loads(output.read_text())
    assert report["records"] == [] and report["failure"] and report["summary"]["valid"] is False


def test_compare_command(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    for name, latency in (("a", 10.0), ("b", 15.0)):
        write_report(
            result([record(i, i * 0.1, latency_ms=latency) for i in range(10)]), tmp_path / f"{name}.json", plots=False
        )
    write_report(result([record(0, 0.0)], duration_s=3.0), tmp_path / "other.json", plots=False)
    code, out, _ = _run(
        capsys,
        "bench",
        "compare",
        str(tmp_path / "a.json"),
        str(tmp_path / "b.json"),
        "--output",
        str(tmp_path / "cmp"),
    )
    assert code == ExitCode.OK
    p50 = next(line for line in out.splitlines() if line.startswith("latency.p50_ms"))
    assert p50.split() == ["latency.p50_ms", "10", "15", "1.500"]
    assert (tmp_path / "cmp.cdf.png").is_file() and (tmp_path / "cmp.timeline.png").is_file()

    code, _, err = _run(capsys, "bench", "compare", str(tmp_path / "a.json"), str(tmp_path / "other.json"))
    assert code == ExitCode.BAD_INPUT and "workload.duration_s: 1.0 vs 3.0" in err
    code, _, err = _run(capsys, "bench", "compare", str(tmp_path / "a.json"), str(tmp_path / "other.json"), "--force")
    assert code == ExitCode.OK and "warning: workloads differ" in err
    code, _, err = _run(capsys, "bench", "compare", str(tmp_path / "a.json"), str(tmp_path / "absent.json"))
    assert code == ExitCode.BAD_INPUT and "cannot read result" in err


def test_a_sequence_from_flags(tmp_path: Path) -> None:
    base = ["bench", "--url", "h:1", "--sequence", str(tmp_path / "s.csv")]
    closed = build_config(parse_cli(*base, "--concurrency", "2")).workload
    assert closed.sequence == tmp_path / "s.csv" and closed.requests == () and closed.load == ClosedSpec(concurrency=2)
    timed = build_config(parse_cli(*base, "--model", "b", "--param", "k=1", "--speedup", "30")).workload
    assert timed.load == SequenceSpec(speedup=30) and timed.requests[0].parameters == {"k": 1}


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--sequence", "s.csv", "--param", "k=1", "--speedup", "2"], "apply to the --model(s) named"),
        (["--model", "m", "--speedup", "2", "--duration", "1"], "needs a sequence file"),
        (["--sequence", "s.csv", "--speedup", "2", "--rate", "3"], "choose one load: --rate and --speedup"),
    ],
)
def test_sequence_flag_errors(capsys: pytest.CaptureFixture[str], argv: list[str], message: str) -> None:
    code, _, err = _run(capsys, "bench", "--url", "h:1", *argv)
    assert code == ExitCode.BAD_INPUT and message in err


def test_a_malformed_sequence_is_refused_before_sending(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    (tmp_path / "s.csv").write_text("time_s,model\n0,a\nlater,b\n")
    url = f"127.0.0.1:{free_port()}"
    code, out, err = _run(capsys, "bench", "--url", url, "--sequence", str(tmp_path / "s.csv"), "--concurrency", "1")
    assert code == ExitCode.BAD_INPUT and out == ""
    assert f"{tmp_path / 's.csv'}: 1 malformed row(s)" in err and "line 3: time 'later'" in err
