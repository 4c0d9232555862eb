"""The load loop against a scripted sender: no network, answers steered by the test."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from adaserve.bench.client import ModelUnavailable, Outcome, Sender
from adaserve.bench.codec import ModelInfo, Payload, Tensor, TensorMeta
from adaserve.bench.results import Status
from adaserve.bench.runner import BenchConfig, run_bench
from adaserve.bench.workload import parse_workload

INFO = ModelInfo("m", (TensorMeta("x", "FP32", (-1, 4)),), (TensorMeta("y", "FP32", (-1, 4)),))


class ScriptedSender(Sender):
    """Answers after `delay_s` (never when None) with the request's model in the response parameters."""

    def __init__(self, delay_s: float | None) -> None:
        self.delay_s = delay_s
        self.in_flight = 0
        self.most_in_flight = 0

    def encode(
        self, model: str, version: str, tensors: Sequence[Tensor], outputs: Sequence[str], params: Mapping[str, Any]
    ) -> Payload:
        return Payload(model, model.encode())

    async def model_info(self, model: str, version: str) -> ModelInfo:
        if model == "missing":
            raise ModelUnavailable("model 'missing' is not ready")
        return INFO

    async def infer(self, payload: Payload) -> Outcome:
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            if self.delay_s is None:
                await asyncio.Event().wait()
            await asyncio.sleep(self.delay_s or 0)
            return Outcome({"model": payload.body.decode()})
        finally:
            self.in_flight -= 1

    async def close(self) -> None:
        pass


def _run(sender: ScriptedSender, load: dict[str, Any], **options: Any) -> Any:
    workload = {"requests": [{"model": "m"}], "load": load, **options.pop("workload", {})}
    config = BenchConfig(url="fake:1", workload=parse_workload(workload), **options)
    return run_bench(config, make_sender=lambda _: sender)


def test_open_loop_sends_everything_when_nothing_is_answered() -> None:
    result = _run(ScriptedSender(None), {"kind": "constant", "rate": 200}, workload={"duration_s": 0.5}, drain_s=0.1)
    assert len(result.records) == 100
    lateness_ms = np.array([(r.sent_s - r.scheduled_s) * 1000 for r in result.records])
    assert lateness_ms.min() >= 0
    assert {r.status for r in result.records} == {Status.CANCELLED}
    assert result.summary.errors_by_kind == {"cancelled": 100}
    assert result.summary.sent_rate_rps == pytest.approx(200)


def test_too_many_outstanding_requests_are_recorded_as_not_sent() -> None:
    result = _run(
        ScriptedSender(None),
        {"kind": "constant", "rate": 100},
        workload={"duration_s": 0.3},
        drain_s=0.0,
        max_outstanding=10,
    )
    counts = Counter(r.status for r in result.records)
    assert counts == {Status.CANCELLED: 10, Status.NOT_SENT: 20}
    assert not result.valid and "the generator fell behind: 20 request(s) not sent" in result.summary.problems[0]


def test_closed_loop_count_bound_is_exact_and_concurrency_is_kept() -> None:
    sender = ScriptedSender(0.005)
    result = _run(sender, {"kind": "closed", "concurrency": 3}, workload={"max_requests": 20})
    assert [r.id for r in result.records] == list(range(20))
    assert all(r.status is Status.OK and r.parameters == {"model": "m"} for r in result.records)
    assert sender.most_in_flight == 3
    assert result.summary.asked_rate_rps is None and result.valid


def test_closed_loop_stops_issuing_at_the_duration_and_drains() -> None:
    result = _run(ScriptedSender(0.1), {"kind": "closed", "concurrency": 2}, workload={"duration_s": 0.35})
    assert 2 <= len(result.records) <= 8  # each client issues every 0.1 s at best; how many fit is up to the machine
    assert all(r.status is Status.OK for r in result.records)
    assert max(r.sent_s for r in result.records) < 0.35


def test_requests_unanswered_after_the_drain_are_cancelled() -> None:
    result = _run(
        ScriptedSender(None), {"kind": "closed", "concurrency": 2}, workload={"duration_s": 0.1}, drain_s=0.05
    )
    assert [r.status for r in result.records] == [Status.CANCELLED, Status.CANCELLED]
    assert result.records[0].error == "no answer before the drain timeout or an interrupt"


def test_mix_follows_the_weights_and_the_seed() -> None:
    workload = {"requests": [{"model": "a", "weight": 3}, {"model": "b"}], "max_requests": 400}
    result = _run(ScriptedSender(0.0), {"kind": "closed", "concurrency": 4}, workload=workload)
    share = Counter(r.model for r in result.records)["a"] / 400
    assert share == pytest.approx(0.75, abs=0.06)
    again = _run(ScriptedSender(0.0), {"kind": "closed", "concurrency": 1}, workload=workload)
    assert [r.model for r in again.records] == [r.model for r in result.records]


def test_a_missing_model_fails_before_sending() -> None:
    result = _run(
        ScriptedSender(0.0),
        {"kind": "poisson", "rate": 10},
        workload={"requests": [{"model": "missing"}], "duration_s": 1.0},
    )
    assert result.failure == "model 'missing' is not ready"
    assert result.records == [] and not result.valid


class RecordingSender(ScriptedSender):
    """Also keeps the parameters each model's requests were encoded with."""

    def __init__(self, delay_s: float | None) -> None:
        super().__init__(delay_s)
        self.encoded: dict[str, Mapping[str, Any]] = {}

    def encode(
        self, model: str, version: str, tensors: Sequence[Tensor], outputs: Sequence[str], params: Mapping[str, Any]
    ) -> Payload:
        self.encoded[model] = params
        return super().encode(model, version, tensors, outputs, params)


def _sequence(tmp_path: Path, rows: list[tuple[float, str]]) -> Path:
    path = tmp_path / "sequence.csv"
    path.write_text("time_s,model\n" + "".join(f"{t},{m}\n" for t, m in rows))
    return path


ROWS = [(0.0, "a"), (2.0, "b"), (2.5, "a"), (6.0, "c"), (8.0, "b")]


def test_a_sequence_sends_each_request_to_its_model_at_its_compressed_time(tmp_path: Path) -> None:
    sender = RecordingSender(0.0)
    workload = {"requests": [{"model": "b", "parameters": {"k": 1}}], "sequence": _sequence(tmp_path, ROWS)}
    # How late a send may be is the benchmarks' business (and a loaded CI machine's); this checks the schedule.
    result = _run(sender, {"kind": "sequence", "speedup": 20}, workload=workload, max_lateness_ms=1e9)
    assert [r.model for r in result.records] == ["a", "b", "a", "c", "b"]
    assert [r.parameters for r in result.records] == [{"model": m} for _, m in ROWS]
    np.testing.assert_allclose([r.scheduled_s for r in result.records], [t / 20 for t, _ in ROWS])
    sent = [r.sent_s for r in result.records]
    assert sent == sorted(sent) and all(r.sent_s >= r.scheduled_s for r in result.records)
    assert sender.encoded == {"a": {}, "b": {"k": 1}, "c": {}}  # a listed kind for b, the default for a and c
    assert result.valid and result.summary.asked_rate_rps == pytest.approx(4 / 0.4)  # arrivals in [0, last)


def test_a_closed_loop_sends_the_sequence_in_order_as_fast_as_its_clients_allow(tmp_path: Path) -> None:
    sender = ScriptedSender(0.01)
    result = _run(sender, {"kind": "closed", "concurrency": 2}, workload={"sequence": _sequence(tmp_path, ROWS)})
    assert [(r.id, r.model) for r in result.records] == list(enumerate(m for _, m in ROWS))
    # concurrency shows in how many were in flight at once, not in a rate: a rate is a timing claim (CI saw 49.9/s)
    assert sender.most_in_flight == 2 and result.summary.ok == len(ROWS)


def test_a_request_bound_shortens_a_sequence_and_never_extends_it(tmp_path: Path) -> None:
    path = _sequence(tmp_path, ROWS)
    short = _run(
        ScriptedSender(0.0), {"kind": "closed", "concurrency": 1}, workload={"sequence": path, "max_requests": 3}
    )
    assert [r.model for r in short.records] == ["a", "b", "a"]
    poisson = {"kind": "poisson", "rate": 500}
    whole = _run(ScriptedSender(0.0), poisson, workload={"sequence": path, "max_requests": 50})
    assert [r.model for r in whole.records] == [m for _, m in ROWS]  # Poisson times, the sequence's models
