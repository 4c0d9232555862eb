"""Cache adaptation: the sample window, the retraining trigger, the acceptance rule, and `adapt` end to end on the
example CNN — an accepted version that the worker's `EarlyExit.load` serves, a refused one, and bad input."""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import shutil
import signal
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from adaserve.adaptive.gati import service as service_module
from adaserve.adaptive.gati.adapt import AdaptSettings, HitRateMonitor, SampleWindow, acceptance, adapt, deploy
from adaserve.adaptive.gati.blocks import BlockChain, load_chain
from adaserve.adaptive.gati.cacheset import (
    CacheSet,
    CacheSetError,
    ChainRecord,
    CompositionRecord,
    ExitRecord,
    load_cache_set,
    read_manifest,
    versions,
)
from adaserve.adaptive.gati.compose import compose
from adaserve.adaptive.gati.explore import ExploreSettings, load_build_data, load_data
from adaserve.adaptive.gati.predictors import TrainSettings, VariantSpec
from adaserve.adaptive.gati.retrain import retrain
from adaserve.adaptive.gati.runtime import EarlyExit
from adaserve.adaptive.gati.service import CacheAdaptation, Outcome
from adaserve.config import AdaptationSpec, LearnedCachesSpec
from adaserve.datasets import load_fashion_mnist
from adaserve.engine.messages import ExitCounts
from adaserve.errors import InvalidInputError
from adaserve.repository import ModelRepository, ModelSpec, read_artifact
from tests.adaptive.gati.conftest import build_timed_alike
from tests.server_utils import link_example

#: The small cache set adapted here (and in test_adaptation_server.py).
BUILD = ExploreSettings(
    variants=(VariantSpec.parse("Pool(4096)"),),
    train=TrainSettings(epochs=2),
    max_samples=3000,
    selector_steps=100,
    latency_repeats=5,
)


def rows(count: int, start: int = 0) -> np.ndarray:
    """Rows whose single value is their position in a stream, to see which ones a window kept."""
    return np.arange(start, start + count, dtype=np.float32).reshape(count, 1)


def test_the_window_keeps_a_fraction_of_what_it_is_offered_up_to_its_capacity() -> None:
    window = SampleWindow(10_000, fraction=0.2, seed=1)
    kept = sum(window.offer(rows(1000, start)) for start in range(0, 20_000, 1000))
    assert 3700 < kept < 4300 and len(window) == kept

    small = SampleWindow(100, fraction=0.5, seed=1)
    for start in range(0, 10_000, 1000):
        small.offer(rows(1000, start))
    held = small.draw(1000)
    assert len(small) == 100 and held.shape == (100, 1)
    assert held.min() > 9000  # only the newest kept rows stay
    assert np.all(np.diff(held[:, 0]) > 0)  # oldest first


def test_rows_holding_nan_or_infinity_are_not_kept() -> None:
    """`adapt` refuses a window holding one such row: kept, one request would fail every retraining until newer rows
    pushed it out."""
    window = SampleWindow(100, fraction=1.0)
    offered = rows(10)
    offered[3, 0], offered[7, 0] = np.nan, np.inf
    assert window.offer(offered) == 8
    assert np.isfinite(window.draw(100)).all() and len(window) == 8


def test_the_window_holds_no_more_rows_than_fit_its_bytes_but_what_a_retraining_needs() -> None:
    window = SampleWindow(2000, fraction=1.0, max_bytes=4000)
    window.offer(np.tile(rows(300), (1, 10)))  # rows of 10 float32s: 40 bytes, 100 fit
    assert window.capacity == len(window) == 100
    assert window.draw(100)[:, 0].min() == 200  # the newest 100
    tiny = SampleWindow(2000, fraction=1.0, max_bytes=40)
    tiny.offer(np.tile(rows(300), (1, 10)))
    assert tiny.capacity == len(tiny) == 20  # one row fits; a retraining needs 20


def test_draws_favour_recent_rows() -> None:
    window = SampleWindow(1000, fraction=1.0, half_life=0.25, seed=2)
    window.offer(rows(1000))
    drawn = np.concatenate([window.draw(100)[:, 0] for _ in range(50)])
    # Weights halve every 250 rows of age: the newest quarter is drawn about 8× as often as the oldest.
    assert np.mean(drawn >= 750) > 4 * np.mean(drawn < 250)
    assert len(np.unique(window.draw(100))) == 100  # without replacement


def test_bad_window_use_is_named() -> None:
    window = SampleWindow(10)
    with pytest.raises(InvalidInputError, match="the sample window is empty"):
        window.draw(5)
    window.offer(np.zeros((5, 1, 28, 28), np.float32))
    with pytest.raises(InvalidInputError, match=r"window rows are shaped \[1, 28, 28\], offered rows \[784\]"):
        window.offer(np.zeros((5, 784), np.float32))
    with pytest.raises(ValueError, match="sampling fraction must be in"):
        SampleWindow(10, fraction=0.0)


def chain_record(agreement: float, *exit_rates: float) -> ChainRecord:
    return ChainRecord(agreement=agreement, mean_latency_s=1e-3, exit_rates=exit_rates)


def composition(*exit_rates: float) -> CompositionRecord:
    exits = tuple(
        ExitRecord(key=f"k{i}", block=f"stage{i + 1}", block_index=i, threshold=0.5) for i in range(len(exit_rates))
    )
    record = chain_record(0.99, *exit_rates)
    return CompositionRecord(
        method="overall",
        target=0.99,
        alpha=0.0,
        memory_budget_bytes=None,
        exits=exits,
        memory_bytes=1,
        calibrate=record,
        evaluate=record,
        default=True,
    )


def counts(rows: int, verified: int = 0, agreed: int = 0, **hits: int) -> ExitCounts:
    return ExitCounts(0.9, dict(hits), dict(hits), rows - sum(hits.values()), verified, agreed)


def test_the_trigger_fires_on_a_low_hit_rate_or_when_the_period_passes() -> None:
    monitor = HitRateMonitor(composition(0.5, 0.2), now=0.0, period_s=900, margin=0.05, min_rows=200)
    monitor.observe(counts(100, stage1=10, stage2=5))
    assert monitor.check(now=10) is None  # too few rows to judge
    monitor.observe(counts(100, stage1=80, stage2=37))
    assert monitor.check(now=20) is None  # 0.45 and 0.66 leave by each exit: within the margin of 0.5 and 0.7
    monitor.observe(counts(200, stage1=100, stage2=20))
    assert monitor.check(now=30) == "rows leaving by stage2 0.600 < expected 0.700 − 0.05"
    assert monitor.check(now=40) is None  # the judged rows are forgotten
    assert monitor.check(now=900) == "period of 900 s passed"
    monitor.reset(composition(0.5, 0.2), now=900)
    assert monitor.check(now=901) is None


def test_rows_moving_to_an_earlier_exit_do_not_fire_the_trigger() -> None:
    """They leave sooner, and lower the later exit's own share: judged by it, a class-skewed stream whose first
    exit took nearly every row retrained the caches into slower ones."""
    monitor = HitRateMonitor(composition(0.5, 0.2), now=0.0, margin=0.05, min_rows=200)
    monitor.observe(counts(200, stage1=190, stage2=2))
    assert monitor.check(now=1) is None
    monitor.observe(counts(200, stage1=80, stage2=60))  # as many leave, but later: that is slower
    assert monitor.check(now=2) == "rows leaving by stage1 0.400 < expected 0.500 − 0.05"


def test_the_trigger_fires_when_verified_hits_disagree() -> None:
    # Expected among hits: 1 − 0.01 / 0.7 ≈ 0.986; judged once 50 hits were verified.
    monitor = HitRateMonitor(composition(0.5, 0.2), now=0.0, min_rows=10_000, min_verified=50)
    monitor.observe(counts(100, verified=30, agreed=25, stage1=50, stage2=20))
    assert monitor.check(now=1) is None
    monitor.observe(counts(100, verified=30, agreed=30, stage1=50, stage2=20))
    assert monitor.check(now=2) == "verified hits agree 0.917 < expected 0.986 − 0.05"
    monitor.observe(counts(100, verified=60, agreed=59, stage1=50, stage2=20))
    assert monitor.check(now=3) is None


def test_the_trigger_expects_the_rates_last_measured_on_todays_traffic() -> None:
    """An adapted version's held-out rows are mostly validation rows, whose rates a lasting drift never reaches:
    judged against them, the trigger fired at every judged window after each retraining."""
    adapted = composition(0.5, 0.2).model_copy(update={"window": chain_record(0.99, 0.3, 0.1)})
    drifted = counts(200, stage1=60, stage2=20)  # 0.30 and 0.10: what the window's held-out rows showed
    paper = HitRateMonitor(adapted, now=0.0, min_rows=200, expect="composition")
    paper.observe(drifted)
    assert paper.check(now=1) == (
        "rows leaving by stage1 0.300 < expected 0.500 − 0.05, by stage2 0.400 < expected 0.700 − 0.05"
    )
    monitor = HitRateMonitor(adapted, now=0.0, min_rows=200)
    monitor.observe(drifted)
    assert monitor.check(now=1) is None
    monitor.observe(counts(200, stage1=40, stage2=34))  # the traffic moves on
    assert monitor.check(now=2) == "rows leaving by stage1 0.200 < expected 0.300 − 0.05"
    # A retraining could not do better on it: no more than the rates just judged are expected from then on.
    monitor.reset(adapted, now=2, settle=True)
    assert monitor.expected == pytest.approx({"stage1": 0.2, "stage2": 0.37})  # judged 0.37 is below 0.3 + 0.1
    monitor.observe(counts(200, stage1=40, stage2=30))
    assert monitor.check(now=3) is None
    monitor.reset(adapted, now=3)  # accepted: the new version's own window rates
    assert monitor.expected == pytest.approx({"stage1": 0.3, "stage2": 0.4})
    built = composition(0.5, 0.2)  # a built version: its composition's rates
    monitor.reset(built, now=4)
    monitor.observe(counts(200, stage1=40, stage2=20))
    assert monitor.check(now=5) == (
        "rows leaving by stage1 0.200 < expected 0.500 − 0.05, by stage2 0.300 < expected 0.700 − 0.05"
    )
    paper.reset(adapted, now=1, settle=True)  # the paper's trigger never settles
    assert paper.expected == pytest.approx({"stage1": 0.5, "stage2": 0.7})


def test_the_acceptance_rule() -> None:
    """Today's traffic (the window's held-out rows): agreement must not fall, nor hits while the deployed caches
    meet the target there. All held-out rows: the target must hold."""
    held_out = chain_record(0.995, 0.5)  # the deployed caches on all held-out rows
    window = chain_record(0.99, 0.5)  # ... and on the window's share of them, meeting the target
    assert acceptance(held_out, chain_record(0.99, 0.6), 0.99, window, chain_record(0.99, 0.6)) is None
    assert acceptance(held_out, chain_record(0.995, 0.5), 0.99, window, chain_record(0.985, 0.9)) == (
        "agreement on the window's held-out rows would fall from 0.9900 to 0.9850"
    )
    assert acceptance(held_out, chain_record(0.985, 0.6), 0.99, window, chain_record(1.0, 0.6)) == (
        "held-out agreement would fall from 0.9950 to 0.9850, below the target 0.99"
    )
    # As many hits, spread over two exits before and one after: summed as floats 0.1 + 0.2 exceed 0.3, no fall.
    assert (
        acceptance(held_out, chain_record(0.99, 0.5), 0.99, chain_record(0.99, 0.1, 0.2), chain_record(0.99, 0.3))
        is None
    )
    assert acceptance(held_out, chain_record(0.999, 0.2), 0.99, window, chain_record(1.0, 0.2)) == (
        "the hit rate on the window's held-out rows would fall from 0.500 to 0.200 while the deployed caches meet "
        "the target 0.99 there (0.9900)"
    )


def test_where_the_windows_rows_show_no_difference_all_held_out_rows_judge_the_hits() -> None:
    """A few dozen window rows, all hit and agreed on by both versions, say nothing: the version deployed on a
    class-skewed stream for that reason hit fewer of all held-out rows and served slower than static caches."""
    held_out = chain_record(0.985, 0.6, 0.366)
    both = chain_record(1.0, 0.9, 0.1)
    assert acceptance(held_out, chain_record(0.995, 0.928), 0.98, both, chain_record(1.0, 1.0)) == (
        "the hit rate on all held-out rows (the window's cannot tell the two apart) would fall from 0.966 to 0.928 "
        "while the deployed caches meet the target 0.98 there (0.9850)"
    )
    assert acceptance(held_out, chain_record(0.99, 0.97), 0.98, both, chain_record(1.0, 1.0)) is None  # more hits
    missing = chain_record(0.97, 0.966)  # the deployed caches miss the target on all rows: more agreement is a gain
    assert acceptance(missing, chain_record(0.98, 0.93), 0.98, both, chain_record(1.0, 1.0)) is None
    assert acceptance(missing, chain_record(0.97, 0.93), 0.98, both, chain_record(1.0, 1.0)) == (
        "the hit rate on all held-out rows (the window's cannot tell the two apart) would fall from 0.966 to 0.930 "
        "for no gain in agreement there (0.9700)"
    )
    # Where the deployed caches miss the target on the window, its few rows may not show what was learned of the
    # drift: a tie there accepts.
    drifted = chain_record(0.85, 0.9)
    assert acceptance(held_out, chain_record(0.99, 0.928), 0.98, drifted, chain_record(0.85, 0.9)) is None
    # The window tells them apart: it decides, as above.
    fewer = chain_record(1.0, 0.8, 0.1)
    assert acceptance(held_out, chain_record(0.995, 0.928), 0.98, fewer, chain_record(1.0, 1.0)) is None


def test_a_drift_is_judged_on_the_windows_rows() -> None:
    """Drifted traffic is a small share of the held-out rows: there the deployed caches may meet the target
    overall and answer today's requests far below it. Caches retrained for it may agree a little less on the
    validation rows; as long as they hold the target there, today's traffic decides."""
    drifted = chain_record(0.8, 0.9)
    held_out = chain_record(0.998, 0.9)
    assert acceptance(held_out, chain_record(0.992, 0.9), 0.99, drifted, chain_record(0.97, 0.95)) is None
    assert acceptance(held_out, chain_record(0.995, 0.3), 0.99, drifted, chain_record(0.99, 0.3)) is None  # fewer hits
    assert acceptance(held_out, chain_record(0.995, 0.8), 0.99, drifted, chain_record(0.8, 0.8)) == (
        "the hit rate on the window's held-out rows would fall from 0.900 to 0.800 for no gain in agreement there "
        "(0.8000)"
    )
    assert acceptance(held_out, chain_record(0.999, 0.9), 0.99, drifted, chain_record(0.75, 0.9)) == (
        "agreement on the window's held-out rows would fall from 0.8000 to 0.7500"
    )
    assert acceptance(chain_record(0.97, 0.9), chain_record(0.975, 0.9), 0.99, drifted, chain_record(0.9, 0.9)) is None
    assert acceptance(held_out, chain_record(1.0), 0.99, drifted, chain_record(1.0)) == (  # agrees, but ends adaptation
        "the retrained caches certify no exit at the target 0.99: a set without exits would serve whole from then "
        "on, with no cache left to adapt"
    )


@dataclass(frozen=True)
class Built:
    spec: ModelSpec
    chain: BlockChain
    cache_set: CacheSet
    validation_x: np.ndarray
    stream: np.ndarray  # rows the set was not built from


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Built:
    root = tmp_path_factory.mktemp("adapt")
    link_example(root, "cnn")
    spec = ModelRepository(root).read("cnn")
    cache_set = build_timed_alike(spec, BUILD, [0.97])
    x, _ = load_data("fashion-mnist", spec.config)
    used = np.concatenate([r for name, r in cache_set.scores().items() if name.endswith("_rows")])
    stream = x[np.setdiff1d(np.arange(len(x)), used)[:300]]
    # Brightened (+0.3): a shift the caches never saw.
    return Built(spec, load_chain(spec), cache_set, x, np.clip(stream + 0.3, 0.0, 1.0))


def test_an_accepted_adaptation_is_a_new_version_the_runtime_loads(built: Built) -> None:
    deployed = built.cache_set.composition(0.97)
    result = adapt(built.chain, built.cache_set, deployed, built.stream, built.validation_x, AdaptSettings())
    assert result.accepted, result.reason
    assert result.after_window.agreement >= result.before_window.agreement
    assert result.rows["evaluate"] == {"validation": 600, "window": 60}  # all held-out validation rows
    assert result.rows["fit_predictor"] == {"validation": 1200, "window": 150}  # 8 validation rows per window row
    assert result.retrain_s > 0 and result.forward_s > 0

    cache_set = deploy(built.spec, result)
    latest = load_cache_set(built.spec, "latest")
    assert latest.version == cache_set.version == built.cache_set.version + 1
    assert latest.manifest.settings["adapted_from"] == f"v{built.cache_set.version}"
    assert latest.composition(0.97).exits == result.composition.exits
    assert latest.composition(0.97).window == result.after_window  # what the trigger will expect of it
    config = built.spec.config.model_copy(update={"caches": LearnedCachesSpec(targets=(0.97,))})
    early_exit = EarlyExit.load(config, built.spec.artifact, read_artifact(built.spec.artifact, 16))
    assert early_exit.description.startswith(f"cache set v{latest.version} ")
    for block, cache in early_exit.plans[0].caches.items():
        assert cache.exit.threshold == next(e.threshold for e in result.composition.exits if e.block_index == block)


def test_an_adaptation_that_lowers_agreement_on_todays_traffic_is_refused(built: Built) -> None:
    # Re-tuned for a far looser target, without holding the deployed agreement: the new caches hit almost every
    # row and many of those hits disagree, which the check on the window's held-out rows must catch.
    original = load_cache_set(built.spec, built.cache_set.version)
    loose = original.composition(0.97).model_copy(update={"target": 0.5})
    settings = AdaptSettings(hold_agreement=False)
    result = adapt(built.chain, original, loose, built.stream, built.validation_x, settings)
    assert not result.accepted
    assert result.reason.startswith("agreement on the window's held-out rows would fall from")
    assert result.after_window.agreement < result.before_window.agreement
    with pytest.raises(CacheSetError, match="a refused adaptation of v1 cannot be deployed: agreement on the"):
        deploy(built.spec, result)


def adaptation_service(built: Built, targets: tuple[float, ...], settings: AdaptationSpec) -> CacheAdaptation:
    """The server's adaptation service for the built model configured with these targets and settings."""
    caches = LearnedCachesSpec(targets=targets, adaptation=settings)
    spec = replace(built.spec, config=built.spec.config.model_copy(update={"caches": caches}))
    return CacheAdaptation(spec, settings, on_deployed=lambda: None)


def test_an_adaptation_composes_every_target_the_set_serves(built: Built) -> None:
    """The default target is retrained; a stricter target of the same set must come out composed for itself, not
    served by the default's caches (what `CacheSet.composition` falls back to when its target is missing)."""
    two = compose(built.cache_set.manifest, built.cache_set.scores(), [0.9, 0.97])
    source = CacheSet(built.cache_set.directory, built.cache_set.version, two)
    result = adapt(built.chain, source, source.composition(0.9), built.stream, built.validation_x, AdaptSettings())
    defaults = {c.target: c for c in result.manifest.compositions if c.default}
    assert sorted(defaults) == [0.9, 0.97]
    assert result.composition == defaults[0.9]
    retrained = {v.key for v in result.manifest.variants}
    assert {e.key for c in defaults.values() for e in c.exits} <= retrained == set(result.weights)


def test_the_service_judges_the_default_targets_rows_alone(built: Built) -> None:
    """Rows served by a stricter target's caches hit less by design: counted with the default's, they read as a
    drift and retrain for nothing (a soak with requests at two targets retrained, and was refused, every few s)."""
    service = adaptation_service(built, (0.97, 0.99), AdaptationSpec())
    service.observe(ExitCounts(0.99, {"stage1": 8}, {}, 8, 0, 0))
    assert service.monitor.rows == 0
    service.observe(ExitCounts(0.97, {"stage1": 8}, {"stage1": 2}, 6, 0, 0))
    assert service.monitor.rows == 8


def test_retrainings_in_vain_back_off_up_to_the_period(built: Built, monkeypatch: pytest.MonkeyPatch) -> None:
    """A trigger that keeps firing on a stream retraining cannot help must not retrain every check (a soak saw one
    every few seconds, each refused, each a core for seconds): the wait doubles after each, up to the period."""
    settings = AdaptationSpec(check_interval_s=5, period_s=60, min_window_rows=20)
    service = adaptation_service(built, (0.97,), settings)
    # The built set's composition: an earlier test may have deployed a version certified with no exit to watch.
    service.composition = built.cache_set.composition(0.97)
    service.window.offer(built.stream)
    monkeypatch.setattr(service.monitor, "check", lambda now: "always")
    retrained: list[str] = []
    waited: list[float] = []

    async def retrain(reason: str) -> Outcome:
        retrained.append(reason)
        return "failed"

    async def sleep(seconds: float) -> None:  # virtual time
        waited.append(seconds)

    monkeypatch.setattr(service, "retrain", retrain)
    monkeypatch.setattr(service_module, "asyncio", SimpleNamespace(sleep=sleep))
    asyncio.run(service.follow(lambda: len(retrained) < 6))
    assert waited == [5, 10, 5, 20, 5, 40, 5, 60, 5, 60, 5, 60]  # a check, then the back-off after each in vain


@pytest.mark.parametrize("outcome", ["refused", "failed"])
def test_after_a_refused_retraining_the_trigger_expects_the_rates_it_judged(
    built: Built, monkeypatch: pytest.MonkeyPatch, outcome: Outcome
) -> None:
    service = adaptation_service(built, (0.97,), AdaptationSpec(min_window_rows=20))
    service.composition = built.cache_set.composition(0.97)
    service.window.offer(built.stream)
    monkeypatch.setattr(service.monitor, "check", lambda now: "always")
    judged = {e.block: 0.01 * (i + 1) for i, e in enumerate(service.composition.exits)}
    service.monitor.judged = judged
    retrained: list[str] = []

    async def retrain(reason: str) -> Outcome:
        retrained.append(reason)
        return outcome

    async def sleep(seconds: float) -> None:  # virtual time
        pass

    monkeypatch.setattr(service, "retrain", retrain)
    monkeypatch.setattr(service_module, "asyncio", SimpleNamespace(sleep=sleep))
    asyncio.run(service.follow(lambda: not retrained))
    exits, rates = service.composition.exits, itertools.accumulate(service.composition.evaluate.exit_rates)
    evaluate = {e.block: rate for e, rate in zip(exits, rates, strict=True)}  # the shares leaving by each exit
    assert service.monitor.expected == (judged if outcome == "refused" else evaluate)  # a failure says nothing


def test_a_window_cut_to_its_bytes_retrains_once_full(built: Built, monkeypatch: pytest.MonkeyPatch) -> None:
    """`min_window_rows` above what `window_mb` holds would wait for rows the window can never hold."""
    settings = AdaptationSpec(window_mb=0.1, min_window_rows=200, check_interval_s=5)  # 33 rows of 1×28×28 float32
    service = adaptation_service(built, (0.97,), settings)
    service.composition = built.cache_set.composition(0.97)
    monkeypatch.setattr(service.monitor, "check", lambda now: "always")
    retrained: list[int] = []

    async def retrain(reason: str) -> Outcome:
        retrained.append(len(service.window))
        return "failed"

    async def sleep(seconds: float) -> None:  # virtual time
        pass

    monkeypatch.setattr(service, "retrain", retrain)
    monkeypatch.setattr(service_module, "asyncio", SimpleNamespace(sleep=sleep))
    checks = iter(range(3))
    service.offer(built.stream)
    asyncio.run(service.follow(lambda: next(checks, None) is not None))
    assert service.window.capacity == 33 and retrained and retrained[0] == 33


def retrain_and_kill(service: CacheAdaptation, kill: Callable[[], None]) -> Outcome:
    """Start a retraining, `kill` it once its process runs, and return what the retraining returned."""

    async def run() -> Outcome:
        retraining = asyncio.get_running_loop().create_task(service.retrain("test"))
        while service._process is None:
            await asyncio.sleep(0.01)
        kill()
        return await retraining

    return asyncio.run(run())


def test_a_retraining_whose_process_is_killed_fails_saying_how_it_ended(
    built: Built, caplog: pytest.LogCaptureFixture
) -> None:
    """A retraining process that dies says nothing on stderr; the failure must still name what happened (a soak
    that killed the server's children logged failures whose error was an empty string)."""
    service = adaptation_service(built, (0.97,), AdaptationSpec())
    service.window.offer(built.stream)
    assert retrain_and_kill(service, lambda: os.kill(service._process.pid, signal.SIGKILL)) == "failed"  # type: ignore[union-attr]
    assert service.stats.outcomes == {"failed": 1}
    (failure,) = [r for r in caplog.records if r.getMessage() == "cache retraining failed"]
    assert failure.error.startswith("the retraining process was killed by SIGKILL")  # type: ignore[attr-defined]


def test_a_retraining_ended_by_the_model_unloading_is_no_failure(
    built: Built, caplog: pytest.LogCaptureFixture
) -> None:
    """The engine's stop closes the service, which kills the retraining by its PID: an error log line and a
    failure counted at every unload that met a retraining would be false alarms."""
    caplog.set_level(logging.INFO, logger="adaserve.gati")
    service = adaptation_service(built, (0.97,), AdaptationSpec())
    service.window.offer(built.stream)
    assert retrain_and_kill(service, service.close) == "stopped"
    assert service.stats.outcomes == {}
    assert [r.getMessage() for r in caplog.records if r.name == "adaserve.gati"] == [
        "retraining learned caches",
        "cache retraining stopped: the model is unloading",
    ]


def test_a_retraining_trains_on_a_draw_of_at_most_train_rows(
    built: Built, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A retraining's time grows with its rows (41 s at the default window's 2,000 on one core): the service sends
    the retraining process a recency-weighted draw of `train_rows`, not the whole window."""
    service = adaptation_service(built, (0.97,), AdaptationSpec(window_rows=300, train_rows=50))
    service.window = SampleWindow(300, fraction=1.0)
    service.window.offer(built.stream[:300])
    sent: list[tuple[int, ...]] = []

    async def retraining_process(*args: str, **kwargs: object) -> SimpleNamespace:
        sent.append(np.load(args[-1]).shape)  # the window file, read before the service deletes it
        reply = b'{"accepted": false, "reason": "test", "retrain_s": 1.0}\n'

        async def communicate() -> tuple[bytes, bytes]:
            return reply, b""

        async def wait() -> int:
            return 0

        return SimpleNamespace(communicate=communicate, wait=wait, returncode=0)

    monkeypatch.setattr(asyncio, "create_subprocess_exec", retraining_process)
    caplog.set_level(logging.INFO, logger="adaserve.gati")
    assert asyncio.run(service.retrain("test")) == "refused"
    assert sent == [(50, *built.stream.shape[1:])]
    (started,) = [r for r in caplog.records if r.getMessage() == "retraining learned caches"]
    assert (started.window_rows, started.train_rows) == (300, 50)  # type: ignore[attr-defined]


def test_the_retraining_process_deploys_and_keeps_the_newest_adapted_versions(built: Built, tmp_path: Path) -> None:
    adaptation = {"keep_versions": 2}
    model = link_example(tmp_path, "cnn", caches={"targets": [0.97], "adaptation": adaptation})
    for number in (1, 2, 3):  # v1 as built; v2 and v3 as adaptation writes them (v1's caches, adapted_from set)
        shutil.copytree(built.cache_set.directory, model / "caches" / f"v{number}")
    for number in (2, 3):
        manifest = read_manifest(model / "caches" / f"v{number}")
        adapted = manifest.model_copy(update={"settings": {**manifest.settings, "adapted_from": f"v{number - 1}"}})
        (model / "caches" / f"v{number}" / "manifest.json").write_text(adapted.model_dump_json())
    np.save(tmp_path / "window.npy", built.stream)

    result = retrain(tmp_path, "cnn", tmp_path / "window.npy")
    assert (result["accepted"], result["source_version"], result["version"]) == (True, 3, 4), result["reason"]
    assert result["removed_versions"] == [2]  # v3 and v4 are kept, and v1, which a build wrote
    assert versions(model) == [1, 3, 4]
    assert read_manifest(model / "caches" / "v4").settings["adapted_from"] == "v3"


def test_bad_input_is_named(built: Built, tmp_path: Path) -> None:
    deployed = built.cache_set.composition(0.97)
    with pytest.raises(InvalidInputError, match=r"window rows are shaped \[784\], but the validation data's rows"):
        adapt(
            built.chain, built.cache_set, deployed, built.stream.reshape(-1, 784), built.validation_x, AdaptSettings()
        )
    with pytest.raises(InvalidInputError, match="the window holds 5 rows; adaptation needs at least 20"):
        adapt(built.chain, built.cache_set, deployed, built.stream[:5], built.validation_x, AdaptSettings())
    with pytest.raises(InvalidInputError, match=r"the validation data has 100 rows, but .* was built from at least"):
        adapt(built.chain, built.cache_set, deployed, built.stream, built.validation_x[:100], AdaptSettings())


def test_a_set_built_with_fit_data_adapts_on_the_rows_it_was_built_from(tmp_path: Path) -> None:
    link_example(tmp_path, "cnn")
    spec = ModelRepository(tmp_path).read("cnn")
    train_x, train_y = load_fashion_mnist("train")
    fit = tmp_path / "fit.npz"
    np.savez(fit, x=train_x[:300], y=train_y[:300])
    # Risk 0.5: a build this small has too few check rows to certify any exit at the default 0.05.
    cache_set = build_timed_alike(spec, replace(BUILD, max_samples=300), [0.97], fit_source=str(fit), risk=0.5)
    assert cache_set.manifest.data.fit_source == str(fit)
    assert min(cache_set.scores()["fit_predictor_rows"]) == 10_000  # the fit rows follow the test split's

    deployed = cache_set.composition(0.97)
    stream = np.clip(train_x[-300:] + 0.4, 0, 1)
    x, _, fit_rows = load_build_data("fashion-mnist", str(fit), spec.config)
    assert (len(x), fit_rows) == (10_300, 300)
    result = adapt(load_chain(spec), cache_set, deployed, stream, x, AdaptSettings())
    assert result.rows["fit_predictor"] == {"validation": 300, "window": 150}  # all 300 fit rows (8 per row wanted)
    with pytest.raises(InvalidInputError, match=r"the validation data has 10000 rows, but .* at least 10300"):
        adapt(load_chain(spec), cache_set, deployed, stream, x[:10_000], AdaptSettings())
