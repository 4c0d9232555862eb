"""Optional dependencies: what each of adaserve's extras installs, and the error that names the one missing.

The server needs none of them. `pip install 'adaserve[client]'` brings tritonclient's HTTP client for
`adaserve infer`; `pip install 'adaserve[zoo]'` brings `transformers` for the BERT and GPT-2 reference models;
`pip install 'adaserve[cluster]'` brings Ray for `adaserve cluster up` and `serve --ray`.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from adaserve.errors import AdaserveError

#: The top-level modules each extra installs, as an import names them.
EXTRAS = {"client": ("tritonclient", "gevent", "geventhttpclient"), "zoo": ("transformers",), "cluster": ("ray",)}


class MissingExtraError(AdaserveError):
    """A feature whose package is not installed; the message says which extra installs it."""


@contextmanager
def needs_extra(extra: str, feature: str) -> Iterator[None]:
    """Imports in the block come with `extra`: one that fails because its package is absent raises
    MissingExtraError naming `feature` and the pip command that installs the extra."""
    try:
        yield
    except ModuleNotFoundError as exc:
        if (exc.name or "").partition(".")[0] not in EXTRAS[extra]:
            raise
        raise MissingExtraError(
            f"{feature} needs {exc.name}, which adaserve installs with its {extra!r} extra: "
            f"pip install 'adaserve[{extra}]'"
        ) from None
