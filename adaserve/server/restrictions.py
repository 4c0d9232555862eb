"""Endpoint restrictions: groups of APIs that answer only requests carrying a header with a given value.

`--restricted-api=model-repository,trace,metrics:admin-key=SECRET` makes the model repository and trace APIs of
both frontends, and REST's `/metrics`, require the header `admin-key: SECRET` (gRPC metadata are its headers, so
tritonclient's `headers=` works the same on both). Triton's own flags restrict one frontend each:
`--http-restricted-api=...` for REST, `--grpc-restricted-protocol=...` for gRPC, where the header is then the
metadata key `triton-grpc-protocol-admin-key`, as Triton has it. A typical use: inference open to every client,
model control, the server's switches and its metrics to the operator only.
"""

from __future__ import annotations

import hmac
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from adaserve.errors import ConfigError, NotAllowedError

if TYPE_CHECKING:  # not imported: `adaserve serve` parses CATEGORIES before it starts its zygote
    import grpc

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
    "metrics",
)
#: Categories with no gRPC call: `/metrics` is REST's alone.
REST_ONLY = frozenset({"metrics"})
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
                if prefix and category in REST_ONLY:
                    raise ConfigError(f"{flag} '{option}': category '{category}' has no gRPC call (REST's /metrics)")
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


def frontend_restrictions(
    shared: Iterable[str], http: Iterable[str], grpc: Iterable[str]
) -> tuple[Restrictions, Restrictions]:
    """The REST and the gRPC frontend's restrictions: `shared` (`--restricted-api`) on both, with the same header
    name on each, and each one's Triton flag (`--http-restricted-api`, `--grpc-restricted-protocol`); ConfigError
    for a category restricted twice on one frontend."""
    shared = list(shared)
    both = Restrictions.parse(shared, "--restricted-api")
    rest = _joined(both, Restrictions.parse(http, "--http-restricted-api"), "--http-restricted-api", "API")
    on_grpc = Restrictions.parse(grpc, "--grpc-restricted-protocol", GRPC_PREFIX)
    return rest, _joined(both, on_grpc, "--grpc-restricted-protocol", "protocol")


def _joined(shared: Restrictions, own: Restrictions, flag: str, what: str) -> Restrictions:
    twice = sorted(shared.required.keys() & own.required.keys())
    if twice:
        raise ConfigError(f"--restricted-api and {flag}: category '{twice[0]}' is restricted by both")
    return Restrictions({**shared.required, **own.required}, what)
