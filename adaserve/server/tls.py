"""TLS on the frontends: Triton's gRPC flags, and the same five for HTTP.

`--grpc-use-ssl --grpc-server-cert CERT --grpc-server-key KEY` serves gRPC over TLS; `--grpc-use-ssl-mutual` with
`--grpc-root-cert CA` also asks every client for a certificate that CA signed (Triton's flags, so tritonclient's
`ssl=True, root_certificates=...` and perf_analyzer's `--ssl-grpc-*` work as they do against Triton). Triton's HTTP
endpoint has no TLS of its own and is meant to sit behind a proxy; here `--http-use-ssl`, `--http-server-cert`,
`--http-server-key`, `--http-root-cert` and `--http-use-ssl-mutual` do the same for HTTP (tritonclient's
`ssl=True, ssl_options=...`, curl's `--cacert`), so a restricted API's key need not cross the network in the clear.

Every file is read and checked at start, by Python's `ssl` (which names what is wrong: a key that does not match
its certificate, a file that is not PEM), before anything listens.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path

import grpc

from adaserve.errors import ConfigError


@dataclass(frozen=True)
class TlsSettings:
    """A frontend's certificate and key (PEM files), and the CA its clients' certificates are checked against:
    required of every client when `mutual`, checked when offered otherwise."""

    cert: Path
    key: Path
    root: Path | None = None
    mutual: bool = False

    @classmethod
    def from_flags(
        cls,
        protocol: str,
        use_ssl: bool,
        use_ssl_mutual: bool,
        server_cert: Path | None,
        server_key: Path | None,
        root_cert: Path | None,
    ) -> TlsSettings | None:
        """`--{protocol}-*` as given: None when the frontend is plain; ConfigError naming the flag or file that is
        missing or wrong."""
        flag = f"--{protocol}"
        files = {"server-cert": server_cert, "server-key": server_key, "root-cert": root_cert}
        if not (use_ssl or use_ssl_mutual):
            given = [name for name, path in files.items() if path is not None]
            if given:
                raise ConfigError(f"{flag}-{given[0]} is given but TLS is off: add {flag}-use-ssl")
            return None
        if server_cert is None or server_key is None:
            missing = "server-cert" if server_cert is None else "server-key"
            raise ConfigError(f"{flag}-use-ssl needs {flag}-{missing} (a PEM file)")
        if use_ssl_mutual and root_cert is None:
            raise ConfigError(
                f"{flag}-use-ssl-mutual needs {flag}-root-cert: the CA that signs the clients' certificates"
            )
        for name, path in files.items():
            if path is not None and not path.is_file():
                raise ConfigError(f"{flag}-{name} {path}: no such file")
        settings = cls(server_cert, server_key, root_cert, use_ssl_mutual)
        try:
            settings.ssl_context()  # loads every file as a handshake will
        except (ssl.SSLError, OSError) as exc:
            named = ", ".join(str(path) for path in files.values() if path is not None)
            reason = getattr(exc, "reason", None) or exc.strerror or str(exc)
            raise ConfigError(f"{flag}: the TLS files {named} cannot be used: {reason}") from None
        return settings

    def ssl_context(self) -> ssl.SSLContext:
        """The HTTP frontend's context: TLS 1.2 or later, HTTP/1.1 by ALPN, client certificates as configured."""
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(self.cert, self.key)
        if self.root is not None:
            context.load_verify_locations(self.root)
            context.verify_mode = ssl.CERT_REQUIRED if self.mutual else ssl.CERT_OPTIONAL
        context.set_alpn_protocols(["http/1.1"])
        return context

    def grpc_credentials(self) -> grpc.ServerCredentials:
        root = self.root.read_bytes() if self.root is not None else None
        return grpc.ssl_server_credentials(
            [(self.key.read_bytes(), self.cert.read_bytes())], root_certificates=root, require_client_auth=self.mutual
        )
