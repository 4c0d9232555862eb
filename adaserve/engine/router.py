"""The router: which models are loaded, and which engine serves a request.

Models are loaded from the repository at start (all of them, or those named) and through the repository
extension's load/unload. A reload starts the new version beside the old one and swaps only when it is ready, so a
reload never interrupts serving. A model that fails to load is recorded with its reason; the others keep serving.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from adaserve.engine.engine import EngineState, ModelEngine
from adaserve.errors import AdaserveError, ModelNotFoundError, ModelNotReadyError
from adaserve.repository import ModelRepository

log = logging.getLogger("adaserve.router")


@dataclass(frozen=True)
class IndexEntry:
    """One row of the repository index (Triton's repository extension)."""

    name: str
    version: str
    state: str
    reason: str


class ModelRouter:
    def __init__(self, repository: ModelRepository) -> None:
        self.repository = repository
        self._engines: dict[str, ModelEngine] = {}
        self._errors: dict[str, str] = {}
        self._locks: dict[str, asyncio.Lock] = {}

    async def load_all(self, names: list[str] | None = None) -> None:
        """Load the named models (default: every model in the repository); failures are logged, not raised."""
        for name in names if names is not None else self.repository.names():
            try:
                await self.load(name)
            except AdaserveError as exc:
                log.error("model failed to load", extra={"model": name, "error": str(exc)})

    async def load(self, name: str) -> None:
        """Load or reload a model from the repository; raises ConfigError / ModelNotFoundError with the cause."""
        async with self._lock(name):
            try:
                engine = ModelEngine(self.repository.read(name))
                await engine.start()
            except AdaserveError as exc:
                self._errors[name] = str(exc)
                raise
            self._errors.pop(name, None)
            old, self._engines[name] = self._engines.get(name), engine
            if old is not None:
                await old.stop()

    async def unload(self, name: str) -> None:
        async with self._lock(name):
            engine = self._engines.pop(name, None)
            if engine is None:
                raise ModelNotFoundError(f"model '{name}' is not loaded")
            await engine.stop()

    async def close(self) -> None:
        engines, self._engines = list(self._engines.values()), {}
        await asyncio.gather(*(engine.stop(drain_timeout_s=5.0) for engine in engines))

    def engine(self, name: str, version: str = "") -> ModelEngine:
        """The engine serving `name` (and `version`, when one is asked for)."""
        engine = self._engines.get(name)
        if engine is None:
            if name in self._errors:
                raise ModelNotReadyError(f"model '{name}' is not loaded: {self._errors[name]}")
            if name in self.repository.names():
                raise ModelNotReadyError(f"model '{name}' is not loaded; load it through the repository API")
            raise ModelNotFoundError(f"unknown model '{name}'")
        if version and version != str(engine.model.version):
            if version.isdigit() and int(version) in engine.model.versions:
                raise ModelNotReadyError(
                    f"model '{name}' version {version} is not loaded (serving version {engine.model.version})"
                )
            raise ModelNotFoundError(f"unknown version '{version}' of model '{name}'")
        return engine

    def ready_engine(self, name: str, version: str = "") -> ModelEngine:
        engine = self.engine(name, version)
        if engine.state is not EngineState.READY:
            raise ModelNotReadyError(f"model '{name}' is {engine.state.value.lower()}")
        return engine

    @property
    def engines(self) -> dict[str, ModelEngine]:
        return dict(self._engines)

    def index(self) -> list[IndexEntry]:
        entries = []
        for name in sorted(set(self.repository.names()) | set(self._engines)):
            engine = self._engines.get(name)
            if engine is not None:
                entries.append(IndexEntry(name, str(engine.model.version), engine.state.value, ""))
            else:
                entries.append(IndexEntry(name, "", "UNAVAILABLE", self._errors.get(name, "unloaded")))
        return entries

    def _lock(self, name: str) -> asyncio.Lock:
        return self._locks.setdefault(name, asyncio.Lock())
