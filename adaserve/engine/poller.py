"""Triton's poll mode: follow the model repository on disk while serving.

Every few seconds the poller takes each model's fingerprint (the files at the top of its folder, its config and
label files among them, and its version folders' files, `ModelRepository.fingerprint`) and compares it with what it
saw before. A model added is loaded, one whose config, label files or versions changed is reloaded (the router
starts the new engines beside the old and swaps when they are ready, so requests keep being answered; the config's
version_policy says which versions, and a version whose config and files did not change keeps its engine), one
removed is unloaded. A change is acted on only once two polls in a row see it the same, so a model still being
copied in is not loaded half-written. A load that fails is logged and the old engine, if any, keeps serving; the
poller tries again when the files change again, not on every poll.

Under a memory budget (mCache) models load on demand: a change reloads a model only if it is resident, and a new
model waits for its first request.

DAG queries (`dag.yaml`) are followed the same way, after the models of the same poll, so a query added with its
models finds them loaded.
"""

from __future__ import annotations

import asyncio
import logging

from adaserve.engine.router import ModelRouter
from adaserve.errors import AdaserveError
from adaserve.planner.catalog import DagCatalog
from adaserve.repository import Fingerprint

log = logging.getLogger("adaserve.poller")

#: A pending entry for a model that is gone: distinct from every fingerprint, and from "not seen yet".
_GONE = "gone"


class RepositoryPoller:
    """Watches `names` (default: every model and DAG query the repository holds, new ones included) for `router`
    and `dags`."""

    def __init__(self, router: ModelRouter, dags: DagCatalog, names: list[str] | None = None) -> None:
        self.router = router
        self.dags = dags
        self.names = names
        self._seen, _ = self._scan()
        self._pending: dict[str, Fingerprint | str] = {}  # a change seen once, acted on if the next poll agrees

    async def run(self, interval_s: float) -> None:
        """Poll every `interval_s` seconds until cancelled. A poll that fails (the repository folder gone or
        unreadable for a while) is logged, and the next one tries again: the models loaded keep serving."""
        while True:
            await asyncio.sleep(interval_s)
            try:
                await self.poll()
            except OSError as exc:
                log.error("cannot read the model repository; trying again next poll", extra={"error": str(exc)})

    async def poll(self) -> list[str]:
        """Compare the repository with what was seen, and load, reload or unload what settled since; the names
        acted on."""
        now, dag_names = await asyncio.to_thread(self._scan)
        dags = {name for name in set(now) | set(self._seen) if name in dag_names or self.dags.knows(name)}
        acted = []
        for name in sorted(set(now) | set(self._seen), key=lambda name: (name in dags, name)):
            current: Fingerprint | str = now.get(name, _GONE)
            if current == self._seen.get(name, _GONE):
                self._pending.pop(name, None)  # changed and changed back: nothing to do
                continue
            if self._pending.get(name) != current:
                self._pending[name] = current  # first sight of this state: let it settle for one poll
                continue
            del self._pending[name]
            if name in now:
                self._seen[name] = now[name]
            else:
                self._seen.pop(name, None)
            await (self._apply_dag if name in dags else self._apply)(name, name in now)
            acted.append(name)
        return acted

    def _scan(self) -> tuple[dict[str, Fingerprint], set[str]]:
        """The fingerprint of each model and DAG query watched, and which of them are DAG queries."""
        repository = self.router.repository
        dag_names = repository.dag_names()
        names = repository.names() + dag_names if self.names is None else self.names
        found = {name: repository.fingerprint(name) for name in names}
        return {name: fingerprint for name, fingerprint in found.items() if fingerprint is not None}, set(dag_names)

    async def _apply(self, name: str, present: bool) -> None:
        resident = name in self.router.engines
        try:
            if not present:
                if resident:
                    log.info("model removed from the repository: unloading", extra={"model": name})
                    await self.router.unload(name)
            elif resident or self.router.cache is None:
                log.info("model changed in the repository: loading", extra={"model": name, "reload": resident})
                await self.router.load(name, changed_only=True)
        except AdaserveError as exc:
            log.error(
                "model failed to load from the repository; the old engine, if any, keeps serving",
                extra={"model": name, "error": str(exc)},
            )

    async def _apply_dag(self, name: str, present: bool) -> None:
        if not present:
            log.info("DAG query removed from the repository: unloading", extra={"model": name})
            self.dags.unload(name)
            return
        try:
            log.info("DAG query changed in the repository: loading", extra={"model": name})
            await self.dags.load(name)
        except AdaserveError as exc:
            log.error(
                "DAG query failed to load from the repository; the old one, if any, keeps serving",
                extra={"model": name, "error": str(exc)},
            )
