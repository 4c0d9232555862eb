"""A model's footprint: measured from its real processes at each load, kept beside the model for `models list`."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from adaserve.engine.engine import ModelEngine
from adaserve.engine.footprint import Footprint, describe_footprint, read_footprint, record_footprint
from adaserve.repository import FOOTPRINT_FILE, ModelRepository
from tests.engine.engines import run_engine
from tests.server_utils import link_example


def test_a_load_records_its_processes_footprint_beside_the_model_unseen_by_the_poller(tmp_path: Path) -> None:
    model_dir = link_example(tmp_path, "mlp", workers=[{"batch": 1, "threads": 1}, {"batch": 4, "threads": 1}])
    repository = ModelRepository(tmp_path)
    before = repository.fingerprint("mlp")
    at_ready: list[Footprint] = []

    async def body(engine: ModelEngine) -> None:
        deadline = time.monotonic() + 60
        while (footprint := read_footprint(model_dir)) is None:  # taken once ready, beside serving
            assert time.monotonic() < deadline
            await asyncio.sleep(0.01)
        at_ready.append(footprint)

    run_engine(tmp_path, body)
    footprint = read_footprint(model_dir)
    assert footprint is not None and footprint.moment == "unloading"  # the last one, taken as it unloaded
    assert footprint.version == 1 and footprint.processes == 3  # the host and its two workers
    assert 0 < footprint.uss_bytes < footprint.pss_bytes  # they share pages with the zygote
    assert at_ready[0].moment == "ready" and at_ready[0].processes == 3
    # What a load measured is not how the model is served: the poller does not load it again for it.
    assert repository.fingerprint("mlp") == before


def test_models_list_says_what_was_measured_and_when_or_that_nothing_was(tmp_path: Path) -> None:
    model_dir = link_example(tmp_path, "mlp")
    artifact = ModelRepository(tmp_path).read("mlp").artifact
    size_mib = artifact.stat().st_size / (1 << 20)
    assert describe_footprint(model_dir, artifact) == (
        f"footprint=not measured yet (artifact {size_mib:.1f} MiB; a load records it)"
    )
    record_footprint(model_dir, 1, [], "ready")  # no process: nothing measured, but a record all the same
    assert describe_footprint(model_dir, artifact).startswith("footprint=0 MiB PSS (USS 0 MiB) last measured ")
    footprint = Footprint(
        version=2,
        pss_bytes=50 << 20,
        uss_bytes=9 << 20,
        processes=2,
        moment="unloading",
        measured="2026-01-02T03:04:05+00:00",
    )
    (model_dir / FOOTPRINT_FILE).write_text(footprint.model_dump_json())
    assert describe_footprint(model_dir, artifact) == (
        "footprint=50 MiB PSS (USS 9 MiB) last measured 2026-01-02T03:04:05+00:00 as it unloaded, v2, 2 processes"
    )
    (model_dir / FOOTPRINT_FILE).write_text("{not json")
    assert read_footprint(model_dir) is None  # a broken record is as good as none: the next load replaces it
