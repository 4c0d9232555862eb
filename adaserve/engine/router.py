"""The router: which models are loaded, and which engine serves a request.

Without a memory budget, models are loaded from the repository at start (all of them, or those named) and through
the repository extension's load/unload. With one (mCache), every model of the repository can be served but only
those that fit are resident: a request for another loads it on demand and the cache's eviction policy picks what
makes room (`adaserve.cache`); a model is pinned while a request uses it, so it is never evicted mid-request.

A reload starts the new version beside the old one and swaps only when it is ready, so a reload never interrupts
serving. A model that fails to load is recorded with its reason; the others keep serving. A load or unload runs to
its end even when its caller stops waiting (the client hung up, a gRPC deadline passed), as Triton's do: cut off
half-way, it would leave a host process that no engine owns.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Coroutine
from contextlib import asynccontextmanager
from dataclasses import dataclass

from adaserve.cache import Loaded, ModelCache
from adaserve.engine.engine import EngineState, ModelEngine
from adaserve.engine.processes import HostLauncher
from adaserve.errors import AdaserveError, ModelNotFoundError, ModelNotReadyError
from adaserve.repository import ModelRepository, ModelSpec

log = logging.getLogger("adaserve.router")


@dataclass(frozen=True)
class IndexEntry:
    """One row of the repository index (Triton's repository extension)."""

    name: str
    version: str
    state: str
    reason: str


@dataclass(frozen=True)
class CacheSettings:
    """mCache: the bytes models may hold together, and the policy that picks what to evict."""

    budget_bytes: int
    policy: str = "iam"


class ModelRouter:
    def __init__(
        self, repository: ModelRepository, cache: CacheSettings | None = None, *, spare_hosts: int = 0
    ) -> None:
        """`spare_hosts`: model host processes kept started ahead of loads (`HostLauncher`)."""
        self.repository = repository
        self.hosts = HostLauncher(spare_hosts)
        self._engines: dict[str, ModelEngine] = {}
        self._errors: dict[str, str] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._operations: set[asyncio.Task[None]] = set()  # loads, unloads and reloads, each in a task of its own
        self.cache: ModelCache | None = None
        if cache is not None:
            self.cache = ModelCache(
                cache.budget_bytes,
                cache.policy,
                load=self._load_resident,
                unload=self._unload_resident,
                size_hint=self._size_hint,
            )

    async def load_all(self, names: list[str] | None = None) -> None:
        """Load the named models (default: every model in the repository, or none when a cache decides residency).

        Failures are logged, not raised.
        """
        if names is None:
            names = [] if self.cache is not None else self.repository.names()
        for name in names:
            try:
                await self.load(name)
            except AdaserveError as exc:
                log.error("model failed to load", extra={"model": name, "error": str(exc)})

    @asynccontextmanager
    async def serving(self, name: str, version: str = "") -> AsyncIterator[ModelEngine]:
        """The ready engine for a request, loaded first if a cache manages residency, and pinned while in use."""
        if self.cache is None:
            yield self.ready_engine(name, version)
            return
        self.check_servable(name, version)
        async with self.cache.use(name):
            yield self.ready_engine(name, version)

    def check_servable(self, name: str, version: str = "") -> None:
        """Fail fast (404 / 503) before a request body is decoded: the model is ready, or the cache can load it."""
        if self.cache is None or name in self._engines:
            self.ready_engine(name, version)
            return
        spec = self.spec(name, version)
        if version and version != str(spec.version):
            raise ModelNotReadyError(f"model '{name}' version {version} is not served (it serves {spec.version})")

    def spec(self, name: str, version: str = "") -> ModelSpec:
        """What a model is (config, version), whether or not it is resident now."""
        if self.cache is None or name in self._engines:
            return self.engine(name, version).model
        self._check_known(name)
        return self.repository.read(name)

    async def load(self, name: str) -> None:
        """Load or reload a model from the repository; raises ConfigError / ModelNotFoundError with the cause.

        Under a memory budget the cache loads it, evicting other models by its policy to make room.
        """
        await asyncio.shield(self._operation(self._load(name)))

    async def _load(self, name: str) -> None:
        if self.cache is not None and name not in self._engines:
            self._check_known(name)
            async with self.cache.use(name):
                return
        await self._start(name)

    async def _start(self, name: str) -> None:
        async with self._lock(name):
            try:
                spec = self.repository.read(name)
                engine = ModelEngine(spec, reload=lambda: self._reload_soon(name), hosts=self.hosts)
                await engine.start()
            except AdaserveError as exc:
                self._errors[name] = str(exc)
                raise
            self._errors.pop(name, None)
            old, self._engines[name] = self._engines.get(name), engine
            if old is not None:
                await old.stop()

    def _reload_soon(self, name: str) -> None:
        """Load the model again in a task of the router's own (the engine asking is the one being replaced)."""

        async def reload() -> None:
            try:
                await self._start(name)
            except AdaserveError as exc:
                log.error(
                    "model failed to reload; the old engine keeps serving", extra={"model": name, "error": str(exc)}
                )

        self._operation(reload())

    def _operation(self, operation: Coroutine[None, None, None]) -> asyncio.Task[None]:
        """Run a load, unload or reload in a task of the router's own: cancelling whoever waits for it leaves it
        running; `close()` ends it. Its outcome shows in the repository index whether or not anyone waits."""
        task = asyncio.get_running_loop().create_task(operation)
        self._operations.add(task)
        task.add_done_callback(self._settled)
        return task

    def _settled(self, task: asyncio.Task[None]) -> None:
        self._operations.discard(task)
        if not task.cancelled():
            task.exception()  # retrieved: a caller that went away would otherwise leave it unread

    async def unload(self, name: str) -> None:
        """Triton's unload: a model of the repository that is not loaded stays so and the call succeeds (a failed
        load's reason is cleared); a name the repository does not know is a ModelNotFoundError."""
        await asyncio.shield(self._operation(self._unload(name)))

    async def _unload(self, name: str) -> None:
        if name not in self._engines:
            self._check_known(name)
        await self._stop(name)
        self._errors.pop(name, None)
        if self.cache is not None:
            self.cache.forget(name)

    async def _stop(self, name: str) -> None:
        """Stop the model's engine, if it has one: an unload through the API and the cache's eviction of the same
        model may both come to stop it."""
        async with self._lock(name):
            engine = self._engines.pop(name, None)
            if engine is not None:
                await engine.stop()

    # -- the cache's view of a model: load and measure, unload, size before the first load -------------------
    async def _load_resident(self, name: str) -> Loaded:
        await self._start(name)
        engine = self._engines[name]
        return Loaded(engine.memory_bytes, engine.host_wait_s)

    async def _unload_resident(self, name: str) -> None:
        await self._stop(name)

    def _size_hint(self, name: str) -> int:
        """Before a model's first load its size is unknown; its artifact's bytes are the best guess at hand."""
        return self.repository.read(name).artifact.stat().st_size

    def _check_known(self, name: str) -> None:
        if name not in self.repository.names():
            raise ModelNotFoundError(f"unknown model '{name}'")

    async def close(self) -> None:
        operations = list(self._operations)
        for task in operations:
            task.cancel()  # a load must not start an engine after the server has stopped
        await asyncio.gather(*operations, return_exceptions=True)  # each stops what it had started
        engines, self._engines = list(self._engines.values()), {}
        await asyncio.gather(*(engine.stop(drain_timeout_s=5.0) for engine in engines))
        await self.hosts.close()

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
                idle = "not resident: loaded on its next request" if self.cache is not None else "unloaded"
                entries.append(IndexEntry(name, "", "UNAVAILABLE", self._errors.get(name, idle)))
        return entries

    def _lock(self, name: str) -> asyncio.Lock:
        return self._locks.setdefault(name, asyncio.Lock())
