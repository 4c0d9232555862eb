"""The router: which models are loaded, and which engine serves a request.

Without a memory budget, models are loaded from the repository at start (all of them, or those named) and through
the repository extension's load/unload. With one (mCache), every model of the repository can be served but only
those that fit are resident: a request for another loads it on demand and the cache's eviction policy picks what
makes room (`adaserve.cache`); a model is pinned while a request uses it, so it is never evicted mid-request.

A model has an engine for each version its config's version_policy serves (by default the newest alone); a request
that names no version goes to the newest served. A reload starts the new engines beside the old ones and swaps them
all in only when every one is ready, so a reload never interrupts serving. A reload through the repository API
starts every version again (it also picks up a new profile or cache set); the poller's reload, as Triton's, starts
only the versions whose files or config changed and keeps the engines of the others serving. A model that fails to
load is recorded with its reason; the others keep serving. A load or unload runs to its end even when its caller
stops waiting (the client hung up, a gRPC deadline passed), as Triton's do: cut off half-way, it would leave a host
process that no engine owns.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Coroutine
from contextlib import asynccontextmanager
from dataclasses import dataclass

from adaserve.cache import Loaded, ModelCache
from adaserve.engine.cores import Cores
from adaserve.engine.engine import EngineState, ModelEngine
from adaserve.engine.processes import HostLauncher
from adaserve.engine.stats import RetrainingStats
from adaserve.errors import AdaserveError, ModelNotFoundError, ModelNotReadyError
from adaserve.repository import ModelRepository, ModelSpec, is_version, version_source

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
        self.cores = Cores()  # every CPU model's workers run on this server's cores
        self._served: dict[str, dict[int, ModelEngine]] = {}  # name → version → engine, each version served
        self._sources: dict[str, dict[int, tuple[object, ...]]] = {}  # name → version → the files it started from
        self._errors: dict[str, str] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._operations: set[asyncio.Task[None]] = set()  # loads, unloads and reloads, each in a task of its own
        # (name, version) → GATI's retrainings, counted across the reloads that deploy them
        self._retrainings: dict[tuple[str, int], RetrainingStats] = {}
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

        They load side by side: a model's host spends most of its start importing torch and loading the artifact,
        and on two cores the example repository's three models were ready in 9.5-12 s one after another. Failures
        are logged, not raised.
        """
        if names is None:
            names = [] if self.cache is not None else self.repository.names()
        await asyncio.gather(*(self._load_logged(name) for name in names))

    async def _load_logged(self, name: str) -> None:
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
        if self.cache is None or name in self._served:
            self.ready_engine(name, version)
            return
        self.spec(name, version)

    def spec(self, name: str, version: str = "") -> ModelSpec:
        """What a model is (config, version), whether or not it is resident now."""
        if self.cache is None or name in self._served:
            return self.engine(name, version).model
        self._check_known(name)
        newest = self.repository.read(name)
        if not version or version == str(newest.version):
            return newest
        if not is_version(version) or int(version) not in newest.versions:
            raise ModelNotFoundError(f"unknown version '{version}' of model '{name}'")
        if int(version) not in newest.served:
            raise ModelNotReadyError(
                f"model '{name}' version {version} is not served (its version_policy serves {list(newest.served)})"
            )
        return self.repository.read(name, int(version))

    def source(self, name: str, version: int) -> tuple[object, ...] | None:
        """What the served engine of a version was started from (the files at the top of the model's folder and the
        version folder, as the poller fingerprints them): equal for two engines started from the same files. None
        when none is served."""
        return self._sources.get(name, {}).get(version)

    async def load(self, name: str, *, changed_only: bool = False) -> None:
        """Load or reload a model from the repository; raises ConfigError / ModelNotFoundError with the cause.
        `changed_only`: keep the engines of versions whose config and files did not change (the poller's reload).

        Under a memory budget the cache loads it, evicting other models by its policy to make room.
        """
        await asyncio.shield(self._operation(self._load(name, changed_only)))

    async def _load(self, name: str, changed_only: bool = False) -> None:
        if self.cache is not None and name not in self._served:
            self._check_known(name)
            async with self.cache.use(name):
                return
        await self._start(name, changed_only)

    async def _start(self, name: str, changed_only: bool = False) -> None:
        """Start an engine for each version the model's version_policy serves (with `changed_only`, each whose
        files changed since its engine started), then swap them in for the old ones together; if one fails, none
        is swapped in and the ones started stop."""
        async with self._lock(name):
            old = self._served.get(name, {})
            fingerprint = self.repository.fingerprint(name)
            started: dict[int, ModelEngine] = {}
            kept: dict[int, tuple[ModelEngine, ModelSpec]] = {}  # unchanged: the engine, and its spec as read now
            sources: dict[int, tuple[object, ...]] = {}
            try:
                for spec in self.repository.read_served(name):
                    if fingerprint is not None:
                        sources[spec.version] = version_source(fingerprint, spec.version)
                    previous = old.get(spec.version)
                    if (
                        changed_only
                        and previous is not None
                        and previous.state is EngineState.READY
                        and spec.version in sources
                        and self._sources.get(name, {}).get(spec.version) == sources[spec.version]
                    ):
                        kept[spec.version] = previous, spec
                        continue
                    engine = ModelEngine(
                        spec,
                        reload=lambda: self._reload_soon(name),
                        retrainings=self._retrainings.setdefault((name, spec.version), RetrainingStats()),
                        hosts=self.hosts,
                        cores=self.cores,
                    )
                    await engine.start()  # a start that fails stops what it started
                    started[spec.version] = engine
            except BaseException as exc:
                await asyncio.gather(*(engine.stop(drain_timeout_s=0) for engine in started.values()))
                if isinstance(exc, AdaserveError) and not isinstance(exc, ModelNotFoundError):
                    self._errors[name] = str(exc)  # a name the repository does not hold has no load state
                raise
            self._errors.pop(name, None)
            for engine, spec in kept.values():
                engine.model = spec  # the same config and files; the versions beside it may differ (now, not before)
            self._served[name] = {**{version: engine for version, (engine, _) in kept.items()}, **started}
            self._sources[name] = sources
            await asyncio.gather(*(engine.stop() for version, engine in old.items() if version not in kept))

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
        if name not in self._served:
            self._check_known(name)
        await self._stop(name)
        self._errors.pop(name, None)
        if self.cache is not None:
            self.cache.forget(name)

    async def _stop(self, name: str) -> None:
        """Stop the model's engine, if it has one: an unload through the API and the cache's eviction of the same
        model may both come to stop it."""
        async with self._lock(name):
            engines = self._served.pop(name, {})
            self._sources.pop(name, None)
            await asyncio.gather(*(engine.stop() for engine in engines.values()))

    # -- the cache's view of a model: load and measure, unload, size before the first load -------------------
    async def _load_resident(self, name: str) -> Loaded:
        await self._start(name)
        engines = self._served[name].values()
        return Loaded(self.memory_bytes(name), max(e.host_wait_s for e in engines))

    def memory_bytes(self, name: str) -> int:
        """What a loaded model holds: every version it serves, as the model cache and the cluster count it."""
        return sum(engine.memory_bytes for engine in self.served_engines(name))

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
        engines, self._served = self.all_engines(), {}
        await asyncio.gather(*(engine.stop(drain_timeout_s=5.0) for engine in engines))
        await self.hosts.close()

    def engine(self, name: str, version: str = "") -> ModelEngine:
        """The engine serving `name` at `version`; with no version asked for, the newest version served."""
        served = self._served.get(name)
        if served is None:
            self._check_known(name)  # a model whose folder went after a failed load is unknown, not failed
            if name in self._errors:
                raise ModelNotReadyError(f"model '{name}' is not loaded: {self._errors[name]}")
            raise ModelNotReadyError(f"model '{name}' is not loaded; load it through the repository API")
        if not version:
            return served[max(served)]
        engine = served.get(int(version)) if is_version(version) else None
        if engine is None:
            newest = served[max(served)]
            if is_version(version) and int(version) in newest.model.versions:
                raise ModelNotReadyError(
                    f"model '{name}' version {version} is not loaded (serving versions {sorted(served)}; the "
                    "config's version_policy picks them)"
                )
            raise ModelNotFoundError(f"unknown version '{version}' of model '{name}'")
        return engine

    def start_delay_s(self, name: str) -> float | None:
        """How long before a request for `name` could start computing: 0 when its newest version is ready, its
        expected load time when the model cache must load it first, None when it cannot be served now (not
        loaded and no cache to load it, failed, or never loaded so its load time is unknown)."""
        if self.ready(name):
            return 0.0
        if self.cache is None or name in self._errors:
            return None
        return self.cache.load_penalty_s(name)

    def ready_engine(self, name: str, version: str = "") -> ModelEngine:
        engine = self.engine(name, version)
        if engine.state is not EngineState.READY:
            raise ModelNotReadyError(f"model '{name}' is {engine.state.value.lower()}")
        return engine

    def ready(self, name: str) -> bool:
        """Whether `name`'s newest version served is ready: asked for every request on a cluster node, so it looks
        at that model alone (`engines` builds the whole table)."""
        served = self._served.get(name)
        if not served:
            return False
        return served[max(served)].state is EngineState.READY

    @property
    def engines(self) -> dict[str, ModelEngine]:
        """Each loaded model's engine for requests that name no version: its newest version served."""
        return {name: served[max(served)] for name, served in self._served.items()}

    def served_engines(self, name: str) -> list[ModelEngine]:
        """The engines of every version `name` serves, oldest first; the errors of `engine` when it is not loaded."""
        self.engine(name)
        served = self._served[name]
        return [served[version] for version in sorted(served)]

    def all_engines(self) -> list[ModelEngine]:
        """Every engine, each version served of each model."""
        return [engine for served in self._served.values() for engine in served.values()]

    def index(self) -> list[IndexEntry]:
        entries = []
        for name in sorted(set(self.repository.names()) | set(self._served)):
            served = self._served.get(name)
            if served:
                entries += [IndexEntry(name, str(v), served[v].state.value, "") for v in sorted(served)]
            else:
                idle = "not resident: loaded on its next request" if self.cache is not None else "unloaded"
                entries.append(IndexEntry(name, "", "UNAVAILABLE", self._errors.get(name, idle)))
        return entries

    def _lock(self, name: str) -> asyncio.Lock:
        return self._locks.setdefault(name, asyncio.Lock())
