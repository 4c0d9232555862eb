"""RepositoryPoller over a real router and real processes: what each change on disk does, one poll at a time."""

from __future__ import annotations

import asyncio
import logging
import shutil
from collections.abc import Awaitable, Callable
from pathlib import Path

import numpy as np
import pytest
import torch

from adaserve.engine.poller import RepositoryPoller
from adaserve.engine.router import ModelRouter
from adaserve.repository import ModelRepository
from adaserve.server.dataplane import DataPlane
from tests.server_utils import Spin, link_example, write_config, write_fussy_model

ONE_WORKER = [{"batch": 4, "threads": 1}]


def add_identity_version(directory: Path, version: int) -> None:
    """A version of a fussy model (y = 2x) that answers y = x instead, so a test can tell which one serves."""
    (directory / str(version)).mkdir()
    torch.jit.save(torch.jit.script(Spin(1)), str(directory / str(version) / "model.pt"))


def run_router(repository: Path, body: Callable[[ModelRouter], Awaitable[None]]) -> None:
    """Run `body` on a router over `repository`, and close the router whatever happened."""

    async def main() -> None:
        router = ModelRouter(ModelRepository(repository))
        try:
            await body(router)
        finally:
            await router.close()

    asyncio.run(main())


def poller_errors(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    """The poller's error lines so far (other loggers' lines may be captured too, at whatever level the root has)."""
    return [r for r in caplog.records if r.name == "adaserve.poller" and r.levelno >= logging.ERROR]


async def settle(poller: RepositoryPoller) -> list[str]:
    """Two polls: a change is acted on when the second sees it as the first did."""
    assert await poller.poll() == []
    return await poller.poll()


def test_each_change_on_disk_is_followed_after_it_settles(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    link_example(tmp_path, "mlp", workers=ONE_WORKER)

    async def body(router: ModelRouter) -> None:
        await router.load_all()
        poller = RepositoryPoller(router, DataPlane(router).dags)
        assert await poller.poll() == []  # nothing changed

        fussy = write_fussy_model(tmp_path, workers=ONE_WORKER)  # added: loaded
        assert await settle(poller) == ["fussy"]
        x = np.ones((1, 4), dtype=np.float32)
        assert (await router.engines["fussy"].infer([x], 1, {})).outputs[0].tolist() == [[2.0] * 4]

        add_identity_version(fussy, 2)  # a newer version: reloaded, and it answers
        assert await settle(poller) == ["fussy"]
        engine = router.engines["fussy"]
        assert engine.model.version == 2
        assert (await engine.infer([x], 1, {})).outputs[0].tolist() == [[1.0] * 4]

        (fussy / "config.yaml").write_text("max_batch_size: [not a number\n")  # broken: the old engine stays
        with caplog.at_level(logging.ERROR, logger="adaserve.poller"):
            assert await settle(poller) == ["fussy"]
        (record,) = poller_errors(caplog)
        assert record.getMessage().startswith("model failed to load from the repository")
        assert record.model == "fussy" and "max_batch_size" in record.error  # the cause, named
        assert router.engines["fussy"] is engine
        assert await poller.poll() == []  # not retried until the files change again

        shutil.rmtree(fussy)  # removed: unloaded
        assert await settle(poller) == ["fussy"]
        assert "fussy" not in router.engines and list(router.engines) == ["mlp"]

    run_router(tmp_path, body)


def test_a_change_undone_before_it_settled_does_nothing_and_a_partial_copy_waits(tmp_path: Path) -> None:
    link_example(tmp_path, "mlp", workers=ONE_WORKER)

    async def body(router: ModelRouter) -> None:
        await router.load("mlp")
        poller = RepositoryPoller(router, DataPlane(router).dags)
        config = tmp_path / "mlp" / "config.yaml"
        text = config.read_text()
        config.write_text(text + "# edited\n")
        assert await poller.poll() == []
        config.write_text(text)
        config.touch()  # the same text, but a new modification time: a change all the same
        assert await poller.poll() == []  # it moved again: still settling
        assert await poller.poll() == ["mlp"]

        copying = tmp_path / "copying"  # a model still arriving: its config first, its version later
        write_config(copying, {"inputs": [], "outputs": []})
        assert await poller.poll() == []
        (copying / "1").mkdir()
        assert await poller.poll() == []  # it changed between the two polls: not acted on yet
        assert "copying" not in router.engines

    run_router(tmp_path, body)


def test_only_the_named_models_are_watched(tmp_path: Path) -> None:
    link_example(tmp_path, "mlp", workers=ONE_WORKER)

    async def body(router: ModelRouter) -> None:
        await router.load_all(["mlp"])
        poller = RepositoryPoller(router, DataPlane(router).dags, ["mlp"])
        write_fussy_model(tmp_path, workers=ONE_WORKER)
        assert await settle(poller) == []
        assert list(router.engines) == ["mlp"]

    run_router(tmp_path, body)


def test_a_repository_that_goes_away_for_a_while_is_logged_and_followed_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    repository = tmp_path / "models"
    link_example(repository, "mlp", workers=ONE_WORKER)

    async def body(router: ModelRouter) -> None:
        await router.load("mlp")
        poller = RepositoryPoller(router, DataPlane(router).dags)
        polling = asyncio.get_running_loop().create_task(poller.run(0.02))
        aside = tmp_path / "aside"
        with caplog.at_level(logging.ERROR, logger="adaserve.poller"):
            repository.rename(aside)  # unmounted, say
            for _ in range(500):
                if poller_errors(caplog):
                    break
                await asyncio.sleep(0.02)
            aside.rename(repository)
        assert poller_errors(caplog)[0].getMessage().startswith("cannot read the model repository")
        write_fussy_model(repository, workers=ONE_WORKER)
        for _ in range(1000):
            if "fussy" in router.engines:
                break
            await asyncio.sleep(0.02)
        assert not polling.done() and sorted(router.engines) == ["fussy", "mlp"]
        polling.cancel()

    run_router(repository, body)


def test_the_poller_restarts_only_the_versions_that_changed_and_the_api_restarts_all(tmp_path: Path) -> None:
    fussy = write_fussy_model(tmp_path, workers=ONE_WORKER, version_policy={"all": True})
    x = np.ones((1, 4), dtype=np.float32)

    async def body(router: ModelRouter) -> None:
        await router.load_all()
        poller = RepositoryPoller(router, DataPlane(router).dags)
        first = router.engine("fussy", "1")
        add_identity_version(fussy, 2)  # a version added: version 1's files and the config are as they were
        assert await settle(poller) == ["fussy"]
        assert router.engine("fussy", "1") is first  # kept serving, not restarted
        assert router.engine("fussy", "1").model.served == (1, 2)  # and it knows its new neighbour
        assert (await router.engine("fussy", "2").infer([x], 1, {})).outputs[0].tolist() == [[1.0] * 4]

        second = router.engine("fussy", "2")
        torch.jit.save(torch.jit.script(Spin(2)), str(fussy / "2" / "model.pt"))  # version 2 rewritten
        assert await settle(poller) == ["fussy"]
        assert router.engine("fussy", "1") is first and router.engine("fussy", "2") is not second

        await router.load("fussy")  # through the repository API: every version starts again
        assert router.engine("fussy", "1") is not first
        assert (await router.engine("fussy", "1").infer([x], 1, {})).outputs[0].tolist() == [[2.0] * 4]

        engines = [router.engine("fussy", "1"), router.engine("fussy", "2")]
        (fussy / "config.yaml").write_text((fussy / "config.yaml").read_text() + "\n")  # the config: both again
        assert await settle(poller) == ["fussy"]
        assert all(router.engine("fussy", v) is not engine for v, engine in zip(("1", "2"), engines, strict=True))

    run_router(tmp_path, body)


def test_a_label_file_changed_reloads_the_model_with_its_new_class_names(tmp_path: Path) -> None:
    """The config names the labels beside it: they decide the classification extension's answers."""
    directory = link_example(tmp_path, "mlp", workers=ONE_WORKER)
    labels = directory / "labels.txt"

    async def body(router: ModelRouter) -> None:
        await router.load_all()
        poller = RepositoryPoller(router, DataPlane(router).dags)
        before = router.engines["mlp"]
        names = [f"class {i}" for i in range(10)]
        labels.unlink()  # the example's, linked: write a file of its own in its place
        labels.write_text("\n".join(names) + "\n")
        assert await settle(poller) == ["mlp"]
        assert router.engines["mlp"] is not before
        assert list(router.engines["mlp"].model.labels["logits"]) == names

    run_router(tmp_path, body)
