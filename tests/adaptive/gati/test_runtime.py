"""GATI's early exit as a worker runs it, on the example CNN with hand-made caches (thresholds chosen so that some,
all or no rows hit): rows a cache answers carry its prediction and leave the batch, the rest are the model's
output exactly, requests answered early are reported at once, and the counts add up — inline, with the lookups beside
the model (the model in a process of its own), and with each lookup beside the next block (a side stream on a GPU;
here, without one, the same order run in turn) alike; on a GPU too, when there is one."""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import pytest
import torch

from adaserve.adaptive.gati.blocks import BlockChain, load_chain, split_model
from adaserve.adaptive.gati.cacheset import CacheSetError, ExitRecord, LearnedCache
from adaserve.adaptive.gati.model_process import Sizes
from adaserve.adaptive.gati.predictors import VariantSpec, build_predictor
from adaserve.adaptive.gati.runtime import EarlyExit, ExitPlan, Lookup, spans
from adaserve.adaptive.gati.selectors import Selector
from adaserve.config import LearnedCachesSpec
from adaserve.datasets import load_fashion_mnist
from adaserve.engine.messages import RowParameters
from adaserve.engine.streams import on_device
from adaserve.errors import InvalidInputError
from adaserve.repository import ModelRepository, read_artifact
from tests.server_utils import EXAMPLES, link_example, needs_cuda

ALWAYS, NEVER = 0.0, 2.0  # selector thresholds: a sigmoid score is always >= 0 and never >= 2


@pytest.fixture(scope="module")
def chain(tmp_path_factory: pytest.TempPathFactory) -> BlockChain:
    root = tmp_path_factory.mktemp("runtime")
    link_example(root, "cnn")
    return load_chain(ModelRepository(root).read("cnn"))


@pytest.fixture(scope="module")
def images() -> np.ndarray:
    x, _ = load_fashion_mnist("test")
    return np.ascontiguousarray(x[:12].reshape(12, 1, 28, 28), dtype=np.float32)


def cache_after(
    chain: BlockChain, block: int, threshold: float, seed: int = 0, device: str = "cpu", sharpen: float = 1.0
) -> LearnedCache:
    """A cache with random weights after `block` (what it predicts does not matter here, which rows hit does);
    `sharpen` scales its predictor's logits, which spreads the rows' scores (a random predictor's are within 1e-4
    of each other)."""
    torch.manual_seed(seed)
    with torch.inference_mode():
        shape = tuple(chain.run(torch.zeros(1, 1, 28, 28, device=device), 0, block + 1).shape[1:])
    predictor = build_predictor(VariantSpec.parse("Pool(64)"), shape, 10)
    assert predictor is not None
    last = [module for module in predictor.modules() if isinstance(module, torch.nn.Linear)][-1]
    with torch.no_grad():
        last.weight.mul_(sharpen)
        last.bias.mul_(sharpen)
    exit = ExitRecord(key=f"b{block}", block=chain.names[block], block_index=block, threshold=threshold)
    return LearnedCache(exit, predictor.eval(), Selector(10).eval()).eval().to(device)


@functools.cache
def chain_on_gpu() -> BlockChain:
    """The example CNN split as a GPU host splits it: the stored program moved to the GPU first."""
    spec = ModelRepository(EXAMPLES).read("cnn")
    stored = on_device(read_artifact(spec.artifact, spec.config.max_batch_size), torch.device("cuda"))
    return split_model(stored, "auto")


LOOKUPS: list[Lookup] = ["inline", "process", "stream"]
#: Room for the example CNN's batches of up to 16 rows in a model process: its largest row is stage1's, 12,544 bytes.
ROOM = Sizes(rows=16, row_bytes=12_544, reports=2)


def runtime(
    chain: BlockChain, *plans: ExitPlan, lookup: Lookup = "inline", verify: float = 0.0, device: str = "cpu"
) -> EarlyExit:
    early_exit = EarlyExit(chain, plans, verify, "test", lookup, torch.device(device))
    early_exit.start_lookups(lookup, ROOM)
    return early_exit


def run(
    early_exit: EarlyExit, images: np.ndarray, requests: list[RowParameters]
) -> tuple[np.ndarray, list[RowParameters], list[RowParameters]]:
    """The outputs, the requests answered early, and the others' response parameters."""
    outputs = np.full((len(images), 10), np.nan, np.float32)
    early: list[RowParameters] = []
    with torch.inference_mode():
        rest = early_exit.run(torch.from_numpy(images).to(early_exit.device), outputs, requests, early.extend)
    return outputs, early, rest


def requests_of(*sizes: int, **values: object) -> list[RowParameters]:
    offsets = np.cumsum([0, *sizes])
    return [RowParameters(int(o), size, dict(values)) for o, size in zip(offsets, sizes, strict=False)]


@pytest.mark.parametrize("verify", [0.0, 1.0])
@pytest.mark.parametrize("lookup", LOOKUPS)
def test_hits_leave_the_batch_and_the_rest_is_the_model_exactly(
    chain: BlockChain, images: np.ndarray, lookup: Lookup, verify: float
) -> None:
    x = torch.from_numpy(images)
    with torch.inference_mode():
        base = chain.run(x).numpy()
        _, probe_logits, probe_score = cache_after(chain, 1, NEVER)(chain.run(x, 0, 2))
    threshold = float(np.median(probe_score.numpy()))  # about half the rows hit after stage2
    cache = cache_after(chain, 1, threshold)
    early_exit = runtime(chain, ExitPlan(0.99, {1: cache}), lookup=lookup, verify=verify)
    requests = requests_of(1, 1, 2, 3, 5)
    outputs, early, rest = run(early_exit, images, requests)

    hit = probe_score.numpy() >= threshold
    assert 0 < hit.sum() < len(hit)
    # Rows that miss run on in a smaller batch than the base's: the same math, though not always the same kernels
    # (bit-equal on one CPU, 2e-6 apart on another).
    np.testing.assert_allclose(outputs[~hit], base[~hit], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(outputs[hit], probe_logits.numpy()[hit], rtol=1e-5, atol=1e-6)
    for request in requests:
        rows = slice(request.offset, request.offset + request.rows)
        exited = int(hit[rows].sum())
        answered_early = exited == request.rows
        found = [p for p in (early if answered_early else rest) if p.offset == request.offset]
        assert len(found) == 1 and found[0].rows == request.rows
        assert found[0].values == {"exit_block": "stage2" if answered_early else "head", "exited_rows": exited}
    (counts,) = early_exit.take_counts()
    assert counts.lookups == {"stage2": len(images)} and counts.hits == {"stage2": int(hit.sum())}
    assert counts.whole == int((~hit).sum())
    # verify_fraction 1: every hit also ran to the end and was compared with the model; 0: none did
    agree = probe_logits.numpy()[hit].argmax(1) == base[hit].argmax(1)
    assert counts.verified == int(hit.sum() * verify) and counts.agreed == int(agree.sum() * verify)
    assert early_exit.take_counts() == []  # taken: the next batch starts from zero


def test_rows_that_hit_at_the_first_exit_skip_the_second(chain: BlockChain, images: np.ndarray) -> None:
    early_exit = runtime(chain, ExitPlan(0.9, {0: cache_after(chain, 0, ALWAYS), 1: cache_after(chain, 1, ALWAYS)}))
    _, early, rest = run(early_exit, images, requests_of(4, 8))
    assert rest == [] and [p.values["exit_block"] for p in early] == ["stage1", "stage1"]
    (counts,) = early_exit.take_counts()
    assert counts.lookups == {"stage1": 12} and counts.hits == {"stage1": 12} and counts.whole == 0


def test_early_exit_false_and_accuracy_pick_the_plan(chain: BlockChain, images: np.ndarray) -> None:
    never, always = cache_after(chain, 1, NEVER), cache_after(chain, 1, ALWAYS)
    # The config's first target (0.99) is the default; accuracy picks the least target at or above it.
    early_exit = runtime(chain, ExitPlan(0.99, {1: never}), ExitPlan(0.9, {1: always}), lookup="process")
    with torch.inference_mode():
        base = chain.run(torch.from_numpy(images)).numpy()
    requests = [
        RowParameters(0, 3, {}),  # default 0.99: never hits
        RowParameters(3, 3, {"accuracy": 0.8}),  # → 0.9: always hits
        RowParameters(6, 3, {"accuracy": 0.995}),  # above every target → the highest, 0.99
        RowParameters(9, 3, {"early_exit": False, "accuracy": 0.8}),  # off: the whole model, no parameters
    ]
    outputs, early, rest = run(early_exit, images, requests)
    assert [p.offset for p in early] == [3]
    assert sorted(p.offset for p in rest) == [0, 6]
    whole = [0, 1, 2, 6, 7, 8, 9, 10, 11]  # computed in a batch of 9, the base in one of 12: close, not bit-equal
    np.testing.assert_allclose(outputs[whole], base[whole], rtol=1e-5, atol=1e-5)
    # Counted per target: the monitor of adaptation judges the default target's rows alone.
    assert [(c.target, c.lookups, c.hits) for c in early_exit.take_counts()] == [
        (0.9, {"stage2": 3}, {"stage2": 3}),
        (0.99, {"stage2": 6}, {}),
    ]


@pytest.mark.parametrize("lookup", LOOKUPS)
def test_a_plan_with_no_exit_runs_the_model_whole(chain: BlockChain, images: np.ndarray, lookup: Lookup) -> None:
    """What a request gets when certification accepted no setting for its target: the base model, no lookup."""
    early_exit = runtime(chain, ExitPlan(0.99, {}), lookup=lookup)
    with torch.inference_mode():
        base = chain.run(torch.from_numpy(images)).numpy()
    outputs, early, rest = run(early_exit, images, requests_of(4, 8))
    assert early == [] and [p.offset for p in rest] == [0, 4]
    np.testing.assert_allclose(outputs, base, rtol=1e-5, atol=1e-5)
    (counts,) = early_exit.take_counts()
    assert counts.lookups == {} and counts.whole == 12


def test_bad_parameters_are_refused(chain: BlockChain, images: np.ndarray) -> None:
    early_exit = runtime(chain, ExitPlan(0.99, {}))
    for values, name in (({"early_exit": "yes"}, "early_exit"), ({"accuracy": 1.5}, "accuracy")):
        with pytest.raises(InvalidInputError, match=name):
            run(early_exit, images, [RowParameters(0, 12, values)])


def test_a_missing_or_mismatched_cache_set_is_named(tmp_path: Path) -> None:
    link_example(tmp_path, "cnn", caches={"blocks": ["stage1", "stage2", "head"]})
    spec = ModelRepository(tmp_path).read("cnn")
    stored = read_artifact(spec.artifact, spec.config.max_batch_size)
    with pytest.raises(CacheSetError, match="has no cache set; build one with `adaserve caches build cnn`"):
        EarlyExit.load(spec.config, spec.artifact, stored)


@pytest.mark.parametrize("lookup", ["process", "stream"])
def test_a_block_that_fails_after_an_exit_fails_the_batch(
    chain: BlockChain, images: np.ndarray, lookup: Lookup
) -> None:
    """With lookups beside the model, the blocks after the first exit run while a lookup is under way (with
    `process`, in the model process); a block's error there is the batch's error, raised on the worker's thread
    (the only one that answers) with its message, and the next batch is served."""
    failed: list[bool] = []

    def fails_once(x: torch.Tensor) -> torch.Tensor:
        if not failed:
            failed.append(True)
            raise RuntimeError("block failed")
        return chain.blocks[1](x)

    broken = BlockChain(chain.names, (chain.blocks[0], fails_once, chain.blocks[2]), chain.weight_bytes)
    early_exit = runtime(broken, ExitPlan(0.9, {0: cache_after(chain, 0, NEVER)}), lookup=lookup)
    with pytest.raises(RuntimeError, match="block failed"):
        run(early_exit, images, requests_of(12))
    outputs, early, rest = run(early_exit, images, requests_of(5, 7))
    with torch.inference_mode():
        base = chain.run(torch.from_numpy(images)).numpy()
    np.testing.assert_allclose(outputs, base, rtol=1e-5, atol=1e-5)
    assert early == [] and [p.values["exit_block"] for p in rest] == ["head", "head"]


@pytest.mark.parametrize(
    ("lookup", "device"),
    [
        *((lookup, "cpu") for lookup in LOOKUPS),
        *(pytest.param(lookup, "cuda", marks=needs_cuda) for lookup in ("inline", "stream")),
    ],
)
def test_rows_left_by_each_exit_are_answered_by_the_next(
    chain: BlockChain, images: np.ndarray, lookup: Lookup, device: str
) -> None:
    """Two exits, each answering about half of the rows it sees: with the lookups beside the model too, the rows
    the first exit left are dropped before the second sees them, and every row is answered once, by the first exit
    that hit."""
    if device == "cuda":
        chain = chain_on_gpu()
    x = torch.from_numpy(images).to(device)
    with torch.inference_mode():
        base = chain.run(x).cpu().numpy()
        probes = [cache_after(chain, b, NEVER, seed=b, device=device, sharpen=100) for b in (0, 1)]
        scores = [probes[b](chain.run(x, 0, b + 1))[2].cpu().numpy() for b in (0, 1)]
    thresholds = [threshold_in_widest_gap(scores[b]) for b in (0, 1)]
    caches = {b: cache_after(chain, b, thresholds[b], seed=b, device=device, sharpen=100) for b in (0, 1)}
    early_exit = runtime(chain, ExitPlan(0.9, caches), lookup=lookup, device=device)
    for _ in range(3):  # the model process is reused from batch to batch
        outputs, early, rest = run(early_exit, images, requests_of(*[1] * 12))
        first = scores[0] >= thresholds[0]
        second = ~first & (scores[1] >= thresholds[1])
        exits = {p.offset: p.values["exit_block"] for p in [*early, *rest]}
        assert sorted(exits) == list(range(12))
        assert [exits[row] for row in range(12)] == [
            "stage1" if first[row] else "stage2" if second[row] else "head" for row in range(12)
        ]
        rest_rows = ~first & ~second
        np.testing.assert_allclose(outputs[rest_rows], base[rest_rows], rtol=1e-5, atol=1e-5)
        (counts,) = early_exit.take_counts()
        assert counts.lookups == {"stage1": 12, "stage2": int((~first).sum())}
        assert counts.whole == int(rest_rows.sum())


def threshold_in_widest_gap(scores: np.ndarray, least: int = 3) -> float:
    """A threshold midway in the widest gap between the rows' scores that leaves `least` rows on each side. Float
    noise cannot move a row across it: a model process runs its blocks on other rows than the probe did, with other
    threads, and a row 1.5e-5 from the median once crossed it on a busy machine ('head' where 'stage2' was due)."""
    ordered = np.sort(scores)
    gaps = ordered[least : len(ordered) - least + 1] - ordered[least - 1 : len(ordered) - least]
    below = least - 1 + int(np.argmax(gaps))
    assert gaps.max() > 1e-4, f"the scores are too close together to split: {ordered}"
    return float((ordered[below] + ordered[below + 1]) / 2)


@pytest.mark.parametrize("padded", [False, True], ids=["eager", "padded"])
def test_once_every_row_is_answered_no_block_runs(chain: BlockChain, images: np.ndarray, padded: bool) -> None:
    """Padded too: a GPU worker's batch whose rows all exited replays no later segment's graph."""

    def never(x: torch.Tensor) -> torch.Tensor:
        raise AssertionError("a block ran on an empty batch")

    cut = BlockChain(chain.names, (chain.blocks[0], never, never), chain.weight_bytes)
    early_exit = runtime(cut, ExitPlan(0.9, {0: cache_after(chain, 0, ALWAYS)}))
    if padded:
        early_exit = early_exit.for_worker(GRANULARITY)
    outputs, early, rest = run(early_exit, images, requests_of(5, 7))
    assert rest == [] and len(early) == 2 and not np.isnan(outputs).any()


@pytest.mark.parametrize(
    ("asked", "where"),
    [("process", "process"), ("inline", "inline"), ("auto", "inline"), ("stream", "stream")],
)
def test_the_lookup_runs_where_the_config_says(chain: BlockChain, asked: str, where: Lookup) -> None:
    spec = LearnedCachesSpec.model_validate({"lookup": asked})
    assert spec.lookup_at == where
    early_exit = EarlyExit(chain, [ExitPlan(0.99, {1: cache_after(chain, 1, NEVER)})], 0.0, "test", where)
    with torch.inference_mode():
        early_exit.warm_up(2, (1, 28, 28), torch.float32)  # on the CPU: `stream` without a GPU looks up in turn
    assert early_exit.lookups_run == where


def test_a_verified_hit_is_not_looked_up_again(chain: BlockChain, images: np.ndarray) -> None:
    """With verify_fraction 1, rows answered after stage1 run on to be checked; stage2's cache must not answer them
    a second time (their answer is out already)."""
    first, second = cache_after(chain, 0, ALWAYS), cache_after(chain, 1, ALWAYS, seed=1)
    early_exit = runtime(chain, ExitPlan(0.9, {0: first, 1: second}), verify=1.0)
    outputs, early, rest = run(early_exit, images, requests_of(12))
    with torch.inference_mode():
        expected = first(chain.run(torch.from_numpy(images), 0, 1))[1].numpy()
    np.testing.assert_allclose(outputs, expected, rtol=1e-5, atol=1e-6)
    assert [p.values for p in early] == [{"exit_block": "stage1", "exited_rows": 12}] and rest == []
    (counts,) = early_exit.take_counts()
    assert counts.lookups == {"stage1": 12, "stage2": 0} and counts.hits == {"stage1": 12}
    assert counts.verified == 12 and counts.whole == 0


def test_seeded_runtimes_verify_the_same_hits(chain: BlockChain, images: np.ndarray) -> None:
    """Benchmarks compare runs on one stream; the verified hits feed the retraining trigger, so they must repeat."""
    cache = cache_after(chain, 0, ALWAYS)

    def verified_rows(seed: int) -> list[int]:
        early_exit = runtime(chain, ExitPlan(0.9, {0: cache}), verify=0.5)
        early_exit.seed(seed)
        verified = []
        for _ in range(8):
            run(early_exit, images, requests_of(12))
            (counts,) = early_exit.take_counts()
            verified.append(counts.verified)
        return verified

    assert verified_rows(0) == verified_rows(0)
    assert verified_rows(0) != verified_rows(1)  # 8 batches of 12 draws each: equal by chance about never


#: The granularity of the worker whose graphs the padded segments stand in for: batches of 1, 2, 4, 8 and 16 rows.
GRANULARITY = 16


@pytest.mark.parametrize("exits", [(0, 1), (0,), (1,)], ids=["both", "stage1", "stage2"])
@pytest.mark.parametrize(
    ("lookup", "device"),
    [
        *((lookup, "cpu") for lookup in ("inline", "stream")),
        *(pytest.param(lookup, "cuda", marks=needs_cuda) for lookup in ("inline", "stream")),
    ],
)
def test_padded_segments_answer_as_the_chain_does_block_by_block(
    chain: BlockChain, images: np.ndarray, lookup: Lookup, device: str, exits: tuple[int, ...]
) -> None:
    """A GPU worker's CUDA graphs, and on the CPU their stand-in: each segment between two exits runs on the smallest
    power of two batch that holds the rows still in the batch (stale rows of larger batches after them). For every
    batch size, with rows exiting at different blocks, the outputs and each row's exit block are the eager runner's."""
    if device == "cuda":
        chain = chain_on_gpu()
    x = torch.from_numpy(images).to(device)
    with torch.inference_mode():
        probes = {b: cache_after(chain, b, NEVER, seed=b, device=device, sharpen=100) for b in exits}
        scores = {b: probes[b](chain.run(x, 0, b + 1))[2].cpu().numpy() for b in exits}
    thresholds = {b: threshold_in_widest_gap(scores[b]) for b in exits}
    caches = {b: cache_after(chain, b, thresholds[b], seed=b, device=device, sharpen=100) for b in exits}
    plan = ExitPlan(0.9, caches)
    eager = runtime(chain, plan, lookup=lookup, device=device)
    stream = torch.cuda.Stream() if device == "cuda" else None
    padded = EarlyExit(chain, [plan], 0.0, "test", lookup, torch.device(device)).for_worker(GRANULARITY, stream)
    with torch.inference_mode():
        padded.warm_up(GRANULARITY, (1, 28, 28), torch.float32)
    overlapped = lookup == "stream"
    assert set(padded.segments._padded) == {(0, 3), *spans(exits, 3, overlapped)}  # captured at warm-up
    assert spans((0, 1), 3, False) == ((0, 1), (1, 2), (2, 3)) and spans((0,), 3, False) == ((0, 1), (1, 3))
    seen = set()
    for rows in (12, 1, 5, 3, 8, 2, 7, 4, 11, 6, 9, 10):  # a smaller batch after a larger: stale rows in the pad
        want, want_early, want_rest = run(eager, images[:rows], requests_of(*[1] * rows))
        got, got_early, got_rest = run(padded, images[:rows], requests_of(*[1] * rows))
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
        blocks = {p.offset: p.values["exit_block"] for p in [*want_early, *want_rest]}
        assert {p.offset: p.values["exit_block"] for p in [*got_early, *got_rest]} == blocks
        assert sorted(p.offset for p in got_early) == sorted(p.offset for p in want_early)
        seen |= set(blocks.values())
    assert seen == {*(chain.names[b] for b in exits), "head"}
    assert eager.take_counts() == padded.take_counts()
