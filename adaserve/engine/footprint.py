"""A model's footprint: what its processes (host and workers) add to the machine's memory, kept beside the model.

PSS is that figure: the pages only they hold (USS) plus their share of the pages they share with the zygote and
the other models' processes, so the PSS of every process of a server adds up to what the server holds. `/metrics`
reads it live (`adaserve_model_process_memory_bytes`); a load records it in `<model dir>/footprint.json` once
ready and again as it unloads, for `adaserve models list` to show before the model is loaded. What a model adds
depends on what shares with it (more models, a smaller share of the zygote's torch each) and on its worker set, so
the record says when it was measured, of how many processes.
"""

from __future__ import annotations

import contextlib
import logging
import os
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from adaserve.repository import FOOTPRINT_FILE

__all__ = [
    "FOOTPRINT_FILE",
    "Footprint",
    "ProcessMemory",
    "describe_footprint",
    "read_footprint",
    "record_footprint",
]

MIB = 1 << 20

log = logging.getLogger("adaserve.engine")


@dataclass(frozen=True)
class ProcessMemory:
    """What processes add to the machine's memory, from /proc/PID/smaps_rollup: PSS counts each shared page divided
    among the processes sharing it (summed over a process tree, what the tree adds), USS the pages only a process
    holds, RSS every page it maps."""

    pss_bytes: int
    uss_bytes: int
    rss_bytes: int

    @staticmethod
    def of(pids: list[int]) -> ProcessMemory:
        """The sum over `pids`; a process that has exited meanwhile counts nothing."""
        pss = uss = rss = 0
        for pid in pids:
            try:
                lines = Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:]
            except OSError:
                continue
            fields = {line.split(":")[0]: int(line.split()[1]) * 1024 for line in lines}
            pss += fields["Pss"]
            uss += fields["Private_Clean"] + fields["Private_Dirty"]
            rss += fields["Rss"]
        return ProcessMemory(pss, uss, rss)


class Footprint(BaseModel):
    """One measurement of a loaded model's processes."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    version: int = Field(ge=1, description="the model version that was loaded")
    pss_bytes: int = Field(ge=0, description="what the processes add: their own pages and their share of the rest")
    uss_bytes: int = Field(ge=0, description="the pages only they hold")
    processes: int = Field(ge=0, description="the host and its workers, those alive when measured")
    moment: Literal["ready", "unloading"] = Field(description="once the load was ready, or as it unloaded")
    measured: str = Field(description="when (ISO 8601, UTC)")


def record_footprint(
    model_dir: Path, version: int, pids: list[int], moment: Literal["ready", "unloading"]
) -> Footprint:
    """Measure the processes `pids` and keep the figure in `model_dir`; a repository that cannot be written keeps
    nothing (the figure is still returned)."""
    held = ProcessMemory.of(pids)
    footprint = Footprint(
        version=version,
        pss_bytes=held.pss_bytes,
        uss_bytes=held.uss_bytes,
        processes=len(pids),
        moment=moment,
        measured=datetime.now(UTC).isoformat(timespec="seconds"),
    )
    path = model_dir / FOOTPRINT_FILE
    partial = path.with_name(f".{FOOTPRINT_FILE}.{os.getpid()}.tmp")
    try:
        partial.write_text(footprint.model_dump_json(indent=1) + "\n")
        partial.replace(path)  # whole or not at all: `models list` may read it meanwhile
    except OSError as exc:
        log.debug("cannot keep the model's footprint: %s", exc, extra={"model_dir": str(model_dir)})
        with contextlib.suppress(OSError):
            partial.unlink()
    return footprint


def read_footprint(model_dir: Path) -> Footprint | None:
    """The last footprint recorded for the model in `model_dir`; None when none was (or it cannot be read)."""
    try:
        return Footprint.model_validate_json((model_dir / FOOTPRINT_FILE).read_bytes())
    except (OSError, ValidationError):
        return None


def describe_footprint(model_dir: Path, artifact: Path) -> str:
    """For `models list`: the last recorded footprint, marked as such; else that none was measured yet, with the
    size of the model's artifact on disk (about what its weights take in memory, shared by its workers)."""
    footprint = read_footprint(model_dir)
    if footprint is None:
        with contextlib.suppress(OSError):
            return f"footprint=not measured yet (artifact {artifact.stat().st_size / MIB:.1f} MiB; a load records it)"
        return "footprint=not measured yet (a load records it)"
    return (
        f"footprint={footprint.pss_bytes / MIB:.0f} MiB PSS (USS {footprint.uss_bytes / MIB:.0f} MiB) last measured "
        f"{footprint.measured} {'once ready' if footprint.moment == 'ready' else 'as it unloaded'}, "
        f"v{footprint.version}, {footprint.processes} processes"
    )
