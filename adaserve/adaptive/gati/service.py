"""The server side of GATI's cache adaptation service, one per model with `caches.adaptation`.

The engine offers it every request's input rows (it keeps about `sample_fraction` of them in a recency-weighted
window) and what the caches did in every batch (the trigger's counts). Every `check_interval_s` it asks the trigger;
when it fires and the window holds enough rows, a recency-weighted draw of at most `train_rows` of them goes to a
retraining process (`retrain.py`: seconds of CPU, off the event loop). Drawing bounds a retraining's time whatever
the window holds (on one core 8.9 s on 250 rows, 21.3 s on 1,000: `benchmarks/gati/window_draw.py`), and it is what
makes newer rows count more: a draw of every row, as the service sent before, weighs none above another. An
accepted result is written as the next cache set version, and `on_deployed` reloads the model, which the router
does with no downtime (the new engine starts beside the old one, which drains), so the new caches are swapped in
atomically without dropping requests. Nothing here blocks the loop but the sampling copy.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Literal

import numpy as np

from adaserve.adaptive.gati.adapt import HitRateMonitor, SampleWindow
from adaserve.adaptive.gati.cacheset import load_cache_set
from adaserve.config import AdaptationSpec
from adaserve.engine.messages import ExitCounts
from adaserve.engine.processes import how_it_exited
from adaserve.engine.stats import RetrainingStats
from adaserve.repository import ModelSpec

log = logging.getLogger("adaserve.gati")


#: How a retraining ended: deployed, refused by `acceptance`, failed, or stopped because the model unloads.
Outcome = Literal["accepted", "refused", "failed", "stopped"]


class CacheAdaptation:
    """Samples, watches and retrains one model's caches (see the module docstring)."""

    def __init__(
        self,
        model: ModelSpec,
        settings: AdaptationSpec,
        on_deployed: Callable[[], None],
        stats: RetrainingStats | None = None,
    ) -> None:
        """`stats`: where retrainings are counted, which the engine after a reload goes on counting in."""
        assert model.config.caches is not None
        self.model = model
        self.settings = settings
        self.on_deployed = on_deployed
        self.stats = stats or RetrainingStats()
        self.cache_set = load_cache_set(model, "latest")
        self.target = model.config.caches.targets[0]  # the default: the target retrained and watched
        self.composition = self.cache_set.composition(self.target)
        self.window = SampleWindow(
            settings.window_rows, fraction=settings.sample_fraction, max_bytes=int(settings.window_mb * 2**20)
        )
        self.monitor = HitRateMonitor(
            self.composition,
            now=time.monotonic(),
            period_s=settings.period_s,
            margin=settings.margin,
            min_rows=settings.min_rows,
            expect=settings.expect,
        )
        self._process: asyncio.subprocess.Process | None = None  # the retraining running now
        self._closed = False

    def close(self) -> None:
        """The model is unloading: end the retraining it started, if one is running (by its PID)."""
        self._closed = True
        if self._process is not None and self._process.returncode is None:
            self._process.kill()

    def offer(self, rows: np.ndarray) -> None:
        self.window.offer(rows)

    def observe(self, counts: ExitCounts) -> None:
        """A batch's counts; only the default target's rows are judged against its composition's expected rates
        (a stricter target's caches hit less by design, which is no drift)."""
        if counts.target == self.target:
            self.monitor.observe(counts)

    async def follow(self, serving: Callable[[], bool]) -> None:
        """Check the trigger every `check_interval_s` while `serving()`; retrain when it fires."""
        if not self.composition.exits:
            log.warning(
                "learned caches not adapted: the served composition has no exit to retrain",
                extra={"model": self.model.name, "target": self.composition.target},
            )
            return
        in_vain = 0  # retrainings in a row that deployed nothing
        while serving():
            await asyncio.sleep(self.settings.check_interval_s)
            reason = self.monitor.check(time.monotonic())
            enough = min(self.settings.min_window_rows, self.window.capacity)  # the capacity may be cut to window_mb
            if reason is None or len(self.window) < enough or not serving():
                continue
            outcome = await self.retrain(reason)
            if outcome == "accepted":
                self.on_deployed()
                return  # the reloaded model has a service of its own
            self.monitor.reset(self.composition, time.monotonic(), settle=outcome == "refused")
            # The trigger that fired will likely fire again on the same stream, and each retraining takes a core for
            # seconds: after one in vain, wait twice as long as after the last, up to the period.
            in_vain = min(in_vain + 1, 32)
            await asyncio.sleep(min(self.settings.period_s, self.settings.check_interval_s * 2**in_vain))

    async def retrain(self, reason: str) -> Outcome:
        """One retraining in a child process."""
        rows = self.window.draw(self.settings.train_rows)
        extra = {"model": self.model.name, "trigger": reason, "window_rows": len(self.window), "train_rows": len(rows)}
        log.info("retraining learned caches", extra=extra)
        with tempfile.TemporaryDirectory(prefix="adaserve-window-") as folder:
            window = Path(folder) / "window.npy"
            np.save(window, rows)
            self._process = process = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "adaserve.adaptive.gati.retrain",
                str(self.model.directory.parent),
                self.model.name,
                str(window),
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
            out, err = await process.communicate()
            returncode = await process.wait()  # at once: communicate() has waited for the exit
            self._process = None
        if self._closed:  # `close` ended it: no failure, and nothing was deployed
            log.info("cache retraining stopped: the model is unloading", extra=extra)
            return "stopped"
        try:
            result = json.loads(out.decode().strip().splitlines()[-1])
        except (IndexError, ValueError):
            self.stats.outcomes["failed"] += 1
            ended = f"the retraining process {how_it_exited(returncode)}"
            log.error("cache retraining failed", extra={**extra, "error": f"{ended}; {err.decode()[-2000:]}"})
            return "failed"
        self.stats.last_s = result["retrain_s"]
        outcome: Outcome = "accepted" if result["accepted"] else "refused"
        self.stats.outcomes[outcome] += 1
        log.info(f"cache retraining {outcome}", extra={**extra, **result})
        return outcome
