"""The `adaserve` command line: models list, infer against a real server, errors with exit codes."""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import platform
import signal
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest

from adaserve.cli import COMMANDS, build_parser
from adaserve.datasets import FASHION_MNIST_CLASSES, load_fashion_mnist
from tests.server.test_compression import ByteCounter
from tests.server.test_dag import write_dag
from tests.server_utils import EXAMPLES, ServerHandle, process_stat, without_packages


def adaserve(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "adaserve", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=120, env=env)


def test_help_says_what_each_command_is_for_most_common_first() -> None:
    run = adaserve("--help")
    assert run.returncode == 0
    commands = [line.split()[0] for line in run.stdout.split("commands:")[1].splitlines()[2:] if line[4:5].isalpha()]
    assert commands[:4] == ["serve", "infer", "models", "bench"], run.stdout
    assert "adaserve serves PyTorch models" in run.stdout and "exit codes: 0 done" in run.stdout


def test_a_command_is_parsed_by_its_parser_alone_without_the_other_commands_modules() -> None:
    """`adaserve serve` starts its zygote once its arguments are parsed: its parser alone imports neither numpy nor
    pydantic nor grpc nor the load generator, and parses as the whole command line does."""
    full = _choices(build_parser())
    assert list(full) == [name for names, _ in COMMANDS for name in names]  # every command, in --help's order
    for names, _ in COMMANDS:
        assert list(_choices(build_parser(names[0]))) == list(names)
    assert list(_choices(build_parser("serv"))) == list(full)  # not a command: argparse names the choices
    argv = ["serve", "--http-port", "9000", "--cache-policy", "lru", "--model-memory-budget", "1GiB"]
    assert build_parser("serve").parse_args(argv) == build_parser().parse_args(argv)
    script = (
        "import sys; from adaserve.cli import build_parser; build_parser('serve'); "
        "print([m for m in ('numpy', 'pydantic', 'grpc', 'adaserve.bench', 'adaserve.repository') if m in sys.modules])"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True)
    assert done.stdout.strip() == "[]"


def _choices(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    (commands,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(commands.choices)


def test_infer_matches_each_file_to_a_named_input(server: ServerHandle, tmp_path: Path) -> None:
    np.save(tmp_path / "x.npy", np.zeros((2, 784), dtype=np.float32))
    x = str(tmp_path / "x.npy")
    named = adaserve("infer", "mlp", "--input", f"image={x}", "--url", server.http_url)
    assert named.returncode == 0, named.stderr
    assert named.stdout == adaserve("infer", "mlp", "--input", x, "--url", server.http_url).stdout
    for inputs, message in (
        (["--input", f"pixels={x}"], "model 'mlp' has no input 'pixels'; its inputs are image"),
        (["--input", x, "--input", x], "an --input without a name is for a model with one input"),
        (["--input", f"image={x}", "--input", f"image={x}"], "--input image=... is given 2 times"),
        (["--input", "=x.npy"], "expected NAME=FILE.npy (or FILE.npy for a model's only input)"),
    ):
        refused = adaserve("infer", "mlp", *inputs, "--url", server.http_url)
        assert refused.returncode == 2 and message in refused.stderr, refused.stderr


def test_infer_without_its_client_says_which_extra_to_install(tmp_path: Path) -> None:
    np.save(tmp_path / "x.npy", np.zeros((784,), dtype=np.float32))
    env = without_packages(tmp_path / "blocked", "tritonclient")
    run = adaserve("infer", "mlp", "--input", str(tmp_path / "x.npy"), env=env)
    assert run.returncode == 2 and "pip install 'adaserve[client]'" in run.stderr and "Traceback" not in run.stderr


def test_models_list_shows_the_example_repository() -> None:
    run = adaserve("models", "list", "--model-repository", str(EXAMPLES))
    assert run.returncode == 0
    lines = {line.split("\t")[0]: line for line in run.stdout.splitlines()}
    assert set(lines) >= {"mlp", "cnn", "mlp_torchscript"}
    assert "torch_export" in lines["mlp"] and "inputs=image:FP32[-1, 784]" in lines["mlp"]
    assert "\tfootprint=" in lines["mlp"]  # measured by a load, or not yet (tests/engine/test_footprint.py)
    assert "torchscript" in lines["mlp_torchscript"]


def test_models_list_names_an_invalid_config(repository: Path) -> None:
    run = adaserve("models", "list", "--model-repository", str(repository))
    assert run.returncode == 0
    assert any(line.startswith("mlp\tv1") for line in run.stdout.splitlines())


def test_infer_prints_the_outputs(server: ServerHandle, tmp_path: Path) -> None:
    image = np.zeros((784,), dtype=np.float32)
    np.save(tmp_path / "x.npy", image)
    run = adaserve(
        "infer",
        "mlp",
        "--input",
        str(tmp_path / "x.npy"),
        "--url",
        server.http_url,
        "--parameters",
        '{"latency_ms": 5}',
    )
    assert run.returncode == 0, run.stderr
    assert '"name": "logits", "shape": [1, 10]' in run.stdout and '"argmax"' in run.stdout


def test_infer_compresses_the_request_and_asks_for_a_compressed_answer(server: ServerHandle, tmp_path: Path) -> None:
    np.save(tmp_path / "x.npy", np.zeros((16, 784), np.float32))  # sixteen equal rows: a body that compresses well
    runs, relays = {}, {}
    for compression in ("", "gzip", "deflate"):
        relays[compression] = relay = ByteCounter(server.http_url)
        try:
            flags = ["--compression", compression] if compression else []
            runs[compression] = adaserve("infer", "mlp", "--input", str(tmp_path / "x.npy"), "--url", relay.url, *flags)
        finally:
            relay.close()
        assert runs[compression].returncode == 0, runs[compression].stderr
    for compression in ("gzip", "deflate"):
        assert runs[compression].stdout == runs[""].stdout
        assert relays[compression].sent < relays[""].sent - 20_000  # the 50 KB of zeros went compressed
        assert relays[compression].received < relays[""].received
    assert adaserve("infer", "mlp", "--input", str(tmp_path / "x.npy"), "--compression", "br").returncode == 2


def test_infer_prints_the_top_classes_with_their_labels(server: ServerHandle, tmp_path: Path) -> None:
    images, labels = load_fashion_mnist("test")
    np.save(tmp_path / "x.npy", images[0])
    run = adaserve("infer", "cnn", "--input", str(tmp_path / "x.npy"), "--url", server.http_url, "--classes", "2")
    assert run.returncode == 0, run.stderr
    answer = json.loads(run.stdout.splitlines()[0])
    assert answer["name"] == "logits" and answer["shape"] == [1, 2] and "argmax" not in run.stdout
    value, index, label = answer["data"][0][0].split(":")
    assert (int(index), label) == (int(labels[0]), FASHION_MNIST_CLASSES[labels[0]]) and float(value) > 0


class _Refusing(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        self.send_response(503)
        self.end_headers()
        self.wfile.write(b'{"error": "not now"}')

    def log_message(self, format: str, *args: object) -> None:  # quiet
        pass


def test_a_server_that_answers_with_an_error_exits_3() -> None:
    """Exit 1 is for a server that could not be reached; one that answered "no" is exit 3, whatever the status."""
    with ThreadingHTTPServer(("127.0.0.1", 0), _Refusing) as refusing:
        threading.Thread(target=refusing.serve_forever, daemon=True).start()
        url = f"127.0.0.1:{refusing.server_address[1]}"
        try:
            run = adaserve("models", "list", "--cluster", url)
        finally:
            refusing.shutdown()
    assert run.returncode == 3 and f"the server at {url} refused the request: 503" in run.stderr, run.stderr


def test_errors_are_plain_and_exit_non_zero(tmp_path: Path) -> None:
    missing = adaserve("models", "list", "--model-repository", str(tmp_path / "nowhere"))
    assert missing.returncode == 2 and "model repository is not a directory" in missing.stderr
    np.save(tmp_path / "x.npy", np.zeros((784,), dtype=np.float32))
    refused = adaserve("infer", "mlp", "--input", str(tmp_path / "x.npy"), "--url", "127.0.0.1:1")
    assert refused.returncode == 1 and "adaserve: error: cannot reach a server at 127.0.0.1:1" in refused.stderr
    (tmp_path / "text.npy").write_text("hello")
    for input_file, parameters, message in (
        (tmp_path / "text.npy", "{}", f"--input: cannot read {tmp_path / 'text.npy'} as a .npy array"),
        (tmp_path / "absent.npy", "{}", f"--input: cannot read {tmp_path / 'absent.npy'} as a .npy array"),
        (tmp_path / "x.npy", "{bad", "--parameters: not JSON"),
        (tmp_path / "x.npy", "[5]", "--parameters: expected a JSON object"),
    ):
        bad = adaserve("infer", "mlp", "--input", str(input_file), "--parameters", parameters, "--url", "127.0.0.1:1")
        assert bad.returncode == 2 and message in bad.stderr and "Traceback" not in bad.stderr, bad.stderr
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = str(busy.getsockname()[1])
        taken = _serve_refused("--http-port", port, "--grpc-port", "0")
        taken_grpc = _serve_refused("--http-port", "0", "--grpc-port", port)
    assert f"cannot listen for HTTP on 127.0.0.1:{port}" in taken
    assert f"cannot listen for gRPC on 127.0.0.1:{port}" in taken_grpc and "Traceback" not in taken_grpc, taken_grpc
    negative = adaserve("serve", "--spare-hosts", "-1")  # one bad flag through the command itself: exit code 2
    assert negative.returncode == 2 and "--spare-hosts" in negative.stderr and "0 or more" in negative.stderr


@pytest.mark.parametrize("option", ["--http-idle-timeout", "--repository-poll-secs"])
@pytest.mark.parametrize("bad", ["0", "-1", "soon", "inf"])
def test_a_period_that_is_not_a_number_above_zero_is_refused_by_name(
    option: str, bad: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """The parser `adaserve serve` runs, in this process: argparse exits 2 for every refused flag (as the command's
    own run above shows for one)."""
    with pytest.raises(SystemExit) as exited:
        build_parser("serve").parse_args(["serve", option, bad])
    assert exited.value.code == 2
    assert f"{option}: expected a number above 0; got '{bad}'" in capsys.readouterr().err


def _serve_refused(*args: str) -> str:
    """What `adaserve serve --model-repository EXAMPLES ARGS` wrote to stderr, once it exited 2: all of it, to EOF
    (BlockingIOError if a process still held it, as the zygote it started first did, importing torch for seconds
    after the server had left)."""
    command = [sys.executable, "-m", "adaserve", "serve", "--model-repository", str(EXAMPLES), *args]
    with subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) as refused:
        assert refused.wait(timeout=120) == 2 and refused.stderr is not None
        stderr = refused.stderr.fileno()
        os.set_blocking(stderr, False)
        said = b""
        while chunk := os.read(stderr, 65536):
            said += chunk
    return said.decode()


#: tgkill(2), which sends a signal to one thread of another process; Python has no call for it.
SYS_TGKILL = {"x86_64": 234, "aarch64": 131}.get(platform.machine())


@pytest.mark.parametrize("thread", ["main", "another"])
def test_ctrl_c_ends_a_command_with_a_line_not_a_traceback(tmp_path: Path, thread: str) -> None:
    """Whichever thread of `infer` the kernel hands the SIGINT to (its HTTP client's gevent keeps resolver threads
    beside the main one), the command ends with a line."""
    if thread == "another" and SYS_TGKILL is None:
        pytest.skip(f"no tgkill number for {platform.machine()}")
    np.save(tmp_path / "x.npy", np.zeros((784,), dtype=np.float32))
    with socket.socket() as silent:  # accepts the connection, never answers: `infer` waits
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        silent.settimeout(60)
        url = f"127.0.0.1:{silent.getsockname()[1]}"
        command = [sys.executable, "-m", "adaserve", "infer", "mlp", "--input", str(tmp_path / "x.npy"), "--url", url]
        with subprocess.Popen(command, stderr=subprocess.PIPE, text=True) as process:
            connection, _ = silent.accept()
            with connection:
                connection.settimeout(60)
                assert connection.recv(65536)  # the command sent its request; now it waits for the answer
                _wait_until_sleeping(process.pid)
                if thread == "main":
                    process.send_signal(signal.SIGINT)
                else:
                    others = sorted(int(t) for t in os.listdir(f"/proc/{process.pid}/task") if int(t) != process.pid)
                    assert others, "infer runs no thread beside the main one"
                    libc = ctypes.CDLL(None, use_errno=True)
                    assert libc.syscall(SYS_TGKILL, process.pid, others[0], signal.SIGINT) == 0
                _, stderr = process.communicate(timeout=60)
    assert process.returncode == 130
    assert "adaserve: interrupted" in stderr and "Traceback" not in stderr, stderr


def _wait_until_sleeping(pid: int, timeout_s: float = 30.0) -> None:
    """Until the main thread of process `pid` sleeps in the kernel (state S), as it does waiting for an answer."""
    deadline = time.monotonic() + timeout_s
    while (fields := process_stat(pid)) is None or fields[0] != "S":
        assert fields is not None, f"process {pid} is gone"
        assert time.monotonic() < deadline, f"process {pid} never waited"
        time.sleep(0.01)


def test_models_list_shows_dag_queries_and_names_an_invalid_one(tmp_path: Path) -> None:
    write_dag(tmp_path, "pipe")
    write_dag(tmp_path, "broken", budget_policy="greedy")
    run = adaserve("models", "list", "--model-repository", str(tmp_path))
    assert run.returncode == 0, run.stderr
    lines = {line.split("\t")[0]: line for line in run.stdout.splitlines()}
    nodes = "nodes=first[double],second[double|slow]"
    assert lines["pipe"] == f"pipe\tdag\tmax_batch=4\tbudget_policy=proportional\t{nodes}"
    assert lines["broken"].startswith("broken\tINVALID\t") and "field 'budget_policy'" in lines["broken"]
