"""TLS on both frontends (Triton's `--grpc-use-ssl*` flags and the same for HTTP), exercised by tritonclient over
real handshakes with certificates made here by openssl: a CA, the server's certificate for 127.0.0.1, a client's
certificate from that CA and one from another CA."""

from __future__ import annotations

import ssl
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gevent.ssl
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from adaserve.bench import Status, read_result
from adaserve.bench.cli import ExitCode
from adaserve.errors import ConfigError
from adaserve.server.tls import TlsSettings
from tests.bench.factories import parse_cli
from tests.server_utils import Clients, ServerHandle, link_example, make_certificates, running_server


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_certificates(tmp_path_factory.mktemp("certs"))


def tls_flags(certs: Path, mutual: bool) -> list[str]:
    flags = []
    for protocol in ("http", "grpc"):
        flags += [f"--{protocol}-use-ssl{'-mutual' if mutual else ''}"]
        flags += [f"--{protocol}-server-cert={certs / 'server.pem'}", f"--{protocol}-server-key={certs / 'server.key'}"]
        flags += [f"--{protocol}-root-cert={certs / 'ca.pem'}"] if mutual else []
    return flags


def client_context(certs: Path, client: str | None = None) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=certs / "ca.pem")
    if client is not None:
        context.load_cert_chain(certs / f"{client}.pem", certs / f"{client}.key")
    return context


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory: pytest.TempPathFactory, certs: Path) -> Iterator[ServerHandle]:
    root = tmp_path_factory.mktemp("tls") / "models"
    link_example(root, "mlp")
    with running_server(root, *tls_flags(certs, mutual=False), https=client_context(certs)) as handle:
        yield handle


@pytest.fixture(scope="module")
def mutual_server(tmp_path_factory: pytest.TempPathFactory, certs: Path) -> Iterator[ServerHandle]:
    root = tmp_path_factory.mktemp("mutual") / "models"
    link_example(root, "mlp")
    with running_server(root, *tls_flags(certs, mutual=True), https=client_context(certs, "client")) as handle:
        yield handle


def http_client(
    clients: Clients, server: ServerHandle, certs: Path, client: str | None = None
) -> httpclient.InferenceServerClient:
    def context() -> ssl.SSLContext:  # gevent's, as tritonclient's HTTP client runs on gevent
        made = gevent.ssl.create_default_context(cafile=str(certs / "ca.pem"))
        if client is not None:
            made.load_cert_chain(certs / f"{client}.pem", certs / f"{client}.key")
        return made

    return clients.http(server.http_url, ssl=True, ssl_context_factory=context)


def grpc_client(
    clients: Clients, server: ServerHandle, certs: Path, client: str | None = None
) -> grpcclient.InferenceServerClient:
    mine = {}
    if client is not None:
        mine = {"private_key": str(certs / f"{client}.key"), "certificate_chain": str(certs / f"{client}.pem")}
    return clients.grpc(server.grpc_url, ssl=True, root_certificates=str(certs / "ca.pem"), **mine)


def infer(client: Any, protocol: str) -> np.ndarray:
    module: Any = httpclient if protocol == "http" else grpcclient
    tensor = module.InferInput("image", [2, 784], "FP32")
    tensor.set_data_from_numpy(np.ones((2, 784), dtype=np.float32))
    return np.asarray(client.infer("mlp", [tensor]).as_numpy("logits"))


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_client_that_trusts_the_ca_is_served_over_tls(
    tls_server: ServerHandle, certs: Path, protocol: str, clients: Clients
) -> None:
    make = http_client if protocol == "http" else grpc_client
    client = make(clients, tls_server, certs)
    assert client.is_server_ready()
    assert infer(client, protocol).shape == (2, 10)


def test_plain_clients_are_not_answered_by_a_tls_server(tls_server: ServerHandle, clients: Clients) -> None:
    with pytest.raises((urllib.error.URLError, ConnectionError)):
        urllib.request.urlopen(f"http://{tls_server.http_url}/v2/health/ready", timeout=5)
    plain = clients.grpc(tls_server.grpc_url)
    with pytest.raises(InferenceServerException):
        plain.is_server_ready(client_timeout=5)


def test_a_client_that_does_not_trust_the_servers_ca_refuses_it(tls_server: ServerHandle, certs: Path) -> None:
    stranger = ssl.create_default_context(cafile=certs / "other-ca.pem")
    with pytest.raises(urllib.error.URLError, match="CERTIFICATE_VERIFY_FAILED"):
        urllib.request.urlopen(f"https://{tls_server.http_url}/v2/health/ready", timeout=5, context=stranger)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_mutual_tls_serves_only_clients_with_a_certificate_from_the_root(
    mutual_server: ServerHandle, certs: Path, protocol: str, clients: Clients
) -> None:
    make = http_client if protocol == "http" else grpc_client
    assert infer(make(clients, mutual_server, certs, "client"), protocol).shape == (2, 10)
    for refused in (None, "stranger"):  # no certificate; one another CA signed
        with pytest.raises(Exception):  # noqa: B017  (the handshake fails: an SSL error, or the client's UNAVAILABLE)
            client = make(clients, mutual_server, certs, refused)
            if protocol == "grpc":
                client.is_server_ready(client_timeout=5)
            else:
                urllib.request.urlopen(
                    f"https://{mutual_server.http_url}/v2/health/ready",
                    timeout=5,
                    context=client_context(certs, refused),
                ).read()
    assert make(clients, mutual_server, certs, "client").is_server_ready()  # and it goes on serving


def flags(certs: Path, **given: Any) -> TlsSettings | None:
    values = {"use_ssl": False, "use_ssl_mutual": False, "server_cert": None, "server_key": None, "root_cert": None}
    values |= {name: certs / value if isinstance(value, str) else value for name, value in given.items()}
    return TlsSettings.from_flags("grpc", **values)


def test_tls_settings_load_from_the_flags(certs: Path) -> None:
    assert flags(certs) is None
    settings = flags(certs, use_ssl=True, server_cert="server.pem", server_key="server.key")
    assert settings is not None and not settings.mutual and settings.ssl_context().verify_mode == ssl.CERT_NONE
    mutual = flags(certs, use_ssl_mutual=True, server_cert="server.pem", server_key="server.key", root_cert="ca.pem")
    assert mutual is not None and mutual.ssl_context().verify_mode == ssl.CERT_REQUIRED


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({"server_cert": "server.pem"}, "--grpc-server-cert is given but TLS is off: add --grpc-use-ssl"),
        ({"use_ssl": True, "server_key": "server.key"}, "--grpc-use-ssl needs --grpc-server-cert"),
        ({"use_ssl": True, "server_cert": "server.pem"}, "--grpc-use-ssl needs --grpc-server-key"),
        (
            {"use_ssl_mutual": True, "server_cert": "server.pem", "server_key": "server.key"},
            "--grpc-use-ssl-mutual needs --grpc-root-cert",
        ),
        ({"use_ssl": True, "server_cert": "absent.pem", "server_key": "server.key"}, "absent.pem: no such file"),
        (
            {"use_ssl": True, "server_cert": "server.pem", "server_key": "client.key"},
            r"server\.pem, .*client\.key cannot be used: KEY_VALUES_MISMATCH",
        ),
        (
            {"use_ssl": True, "server_cert": "server.ext", "server_key": "server.key"},
            r"server\.ext, .*server\.key cannot be used",
        ),
    ],
)
def test_bad_tls_flags_are_refused_by_name(certs: Path, given: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        flags(certs, **given)


def test_serve_with_bad_tls_flags_stops_before_listening(certs: Path) -> None:
    command = [
        sys.executable,
        "-m",
        "adaserve",
        "serve",
        "--http-use-ssl",
        f"--http-server-cert={certs / 'server.pem'}",
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "--http-use-ssl needs --http-server-key" in done.stderr


def bench(capsys: pytest.CaptureFixture[str], tmp_path: Path, url: str, protocol: str, *tls: str) -> tuple[int, str]:
    """`adaserve bench` (20 requests, closed loop) with TLS flags; its exit code and what it printed."""
    output = tmp_path / f"bench-{protocol}.json"
    argv = ["--url", url, "--protocol", protocol, "--model", "mlp", "--concurrency", "2", "--requests", "20"]
    args = parse_cli("bench", *argv, *tls, "--output", str(output), "--quiet")
    code = args.func(args)
    out, err = capsys.readouterr()
    if code == ExitCode.OK:
        result = read_result(output)
        assert len(result.records) == 20 and all(r.status is Status.OK for r in result.records)
    return code, out + err


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_adaserve_bench_sends_over_tls(
    tls_server: ServerHandle, certs: Path, protocol: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    url = f"https://{tls_server.http_url}" if protocol == "http" else tls_server.grpc_url
    ca = f"--ca-cert={certs / 'ca.pem'}"
    code, printed = bench(capsys, tmp_path, url, protocol, ca)
    assert code == ExitCode.OK, printed
    code, printed = bench(capsys, tmp_path, url, protocol, "--tls")  # the system's CAs do not know this one
    assert code == ExitCode.UNREACHABLE and "cannot reach" in printed, printed


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_adaserve_bench_shows_its_certificate_for_mutual_tls(
    mutual_server: ServerHandle, certs: Path, protocol: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    url = mutual_server.http_url if protocol == "http" else mutual_server.grpc_url
    mine = [f"--ca-cert={certs / 'ca.pem'}", f"--client-cert={certs / 'client.pem'}"]
    code, printed = bench(capsys, tmp_path, url, protocol, *mine, f"--client-key={certs / 'client.key'}")
    assert code == ExitCode.OK, printed


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--client-cert", "client.pem"], "a client certificate needs its key"),
        (["--ca-cert", "absent.pem"], "absent.pem: no such file"),
        (["--ca-cert", "server.ext"], "the TLS files cannot be used"),
    ],
)
def test_adaserve_bench_refuses_unusable_tls_files(
    certs: Path, flags: list[str], message: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    flags = [flags[0], str(certs / flags[1])]
    code, printed = bench(capsys, tmp_path, "127.0.0.1:1", "http", *flags)
    assert code == ExitCode.BAD_INPUT and message in printed, printed


def adaserve_infer(tmp_path: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    np.save(tmp_path / "x.npy", np.zeros((784,), dtype=np.float32))
    command = [sys.executable, "-m", "adaserve", "infer", "mlp", "--input", str(tmp_path / "x.npy"), *argv]
    return subprocess.run(command, capture_output=True, text=True, timeout=60)


def test_adaserve_infer_over_tls(
    tls_server: ServerHandle, mutual_server: ServerHandle, certs: Path, tmp_path: Path
) -> None:
    ca = f"--ca-cert={certs / 'ca.pem'}"
    run = adaserve_infer(tmp_path, "--url", f"https://{tls_server.http_url}", ca)
    assert run.returncode == 0 and '"name": "logits", "shape": [1, 10]' in run.stdout, run.stderr
    mine = [f"--client-cert={certs / 'client.pem'}", f"--client-key={certs / 'client.key'}"]
    run = adaserve_infer(tmp_path, "--url", mutual_server.http_url, ca, *mine)
    assert run.returncode == 0 and '"name": "logits", "shape": [1, 10]' in run.stdout, run.stderr
    run = adaserve_infer(tmp_path, "--url", mutual_server.http_url, ca, mine[0])
    assert run.returncode == 2 and "TLS: Value error, a client certificate needs its key" in run.stderr, run.stderr
