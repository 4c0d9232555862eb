"""Triton's endpoint restrictions: groups of APIs that answer only requests carrying a header with a given value.

`--http-restricted-api=model-repository,trace:admin-key=SECRET` makes the REST model repository and trace APIs
require the header `admin-key: SECRET`; `--grpc-restricted-protocol=...` does the same for gRPC, where the header
is the metadata key `triton-grpc-protocol-admin-key` (Triton's names and forms, so tritonclient users pass
`headers=` as they would to Triton). A typical use: inference open to every client, model control and the server's
switches to the operator only.
"""

from __future__ import annotations

import hmac
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

import grpc

from adaserve.errors import ConfigError, NotAllowedError

#: Triton's API categories (the REST endpoints and gRPC RPCs of each are listed where they are served).
CATEGORIES = (
    "health",
    "metadata",
    "inference",
    "shared-memory",
    "model-config",
    "model-repository",
    "statistics",
    "trace",
    "logging",
)
#: gRPC metadata keys of restrictions carry this prefix, as in Triton.
GRPC_PREFIX = "triton-grpc-protocol-"


@dataclass(frozen=True)
class Header:
    name: str  # lower-case, as both frontends hand header names over
    value: str


class Restrictions:
    """Which categories need which header, for one frontend."""

    def __init__(self, required: Mapping[str, Header] | None = None, what: str = "API") -> None:
        self.required = dict(required or {})
        self.what = what  # "API" (REST) or "protocol" (gRPC), for the error message

    @classmethod
    def parse(cls, options: Iterable[str], flag: str, prefix: str = "") -> Restrictions:
        """From Triton's option values, `CATEGORY[,CATEGORY...]:KEY=VALUE`, each category in one group at most."""
        required: dict[str, Header] = {}
        for option in options:
            categories, colon, header = option.partition(":")
            key, equals, value = header.partition("=")
            if not colon or not equals or not key or not categories:
                raise ConfigError(f"{flag} '{option}': expected CATEGORY[,CATEGORY...]:KEY=VALUE")
            for category in categories.split(","):
                if category not in CATEGORIES:
                    raise ConfigError(
                        f"{flag} '{option}': unknown category '{category}'; the categories are: {', '.join(CATEGORIES)}"
                    )
                if category in required:
                    raise ConfigError(f"{flag}: category '{category}' is in more than one group")
                required[category] = Header(prefix + key.lower(), value)
        return cls(required, "protocol" if prefix else "API")

    def restricts(self, category: str) -> bool:
        return category in self.required

    def check(self, category: str, headers: Callable[[], Mapping[str, str]]) -> None:
        """NotAllowedError unless the category is open or `headers()` carries its header and value."""
        header = self.required.get(category)
        if header is None:
            return
        given = headers().get(header.name)
        if given is None or not hmac.compare_digest(given.encode(), header.value.encode()):
            raise NotAllowedError(f"This {self.what} is restricted, expecting header '{header.name}'")

    def check_call(self, category: str, context: grpc.aio.ServicerContext) -> None:
        """`check` for a gRPC call, whose metadata are its headers."""
        self.check(category, lambda: dict(context.invocation_metadata() or ()))
