"""The CUDA form of the request path: staging into a device ring, and workers as threads of the host.

CI has no GPU, so most of these run the same classes on the CPU, where a staged copy is done at once and has no
event: what they check is the order (a batch never reads rows before their copy was issued, nor slots whose copy
is stale) and the thread workers' plumbing. The last tests need a GPU and run wherever one is present.
"""

from __future__ import annotations

import asyncio
import os
import re
import select
import signal
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from adaserve.config import ModelConfig
from adaserve.engine import streams
from adaserve.engine.engine import ModelEngine
from adaserve.engine.host import _start_thread
from adaserve.engine.messages import (
    BatchDone,
    FrameReader,
    RunBatch,
    SpawnWorker,
    Stop,
    WorkerReady,
    write_message,
    write_staged,
)
from adaserve.engine.pool import PoolLayout, SharedRings
from adaserve.engine.streams import StagedInputs, StreamLane, on_device
from adaserve.engine.worker import BatchRunner
from adaserve.errors import ConfigError
from adaserve.repository import ModelRepository, executable, read_artifact
from tests.engine.engines import run_engine
from tests.server_utils import EXAMPLES, link_example, needs_cuda, running_server

CONFIG = ModelConfig.model_validate(
    {
        "name": "linear",
        "max_batch_size": 4,
        "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 3]}],
        "outputs": [{"name": "y", "datatype": "FP32", "shape": [-1, 2]}],
    }
)
SLOTS = 8
Parts = tuple[SharedRings, StagedInputs, BatchRunner, torch.nn.Module]


class Worker:
    """A stream worker thread started the way the host starts one, driven over its two pipes."""

    def __init__(self, runner: BatchRunner, staged: StagedInputs, worker_id: int = 0) -> None:
        command_read, self.commands = os.pipe()
        self.results, result_write = os.pipe()
        _start_thread(SpawnWorker(worker_id, 4, 1, None), runner, StreamLane(staged), [command_read, result_write])
        self._reader = FrameReader()
        assert isinstance(self.next(), WorkerReady)

    def run(self, batch_id: int, start: int, rows: int) -> None:
        write_message(self.commands, RunBatch(batch_id, start, rows, [rows]))

    def answered(self, timeout_s: float) -> bool:
        return bool(select.select([self.results], [], [], timeout_s)[0])

    def next(self) -> object:
        """The next message; EOFError when the worker's result pipe closed."""
        while True:
            assert self.answered(30.0), "no message from the worker in 30 s"
            data = os.read(self.results, 1 << 16)
            if not data:
                raise EOFError
            messages = self._reader.feed(data)
            if messages:
                assert len(messages) == 1
                return messages[0]


@pytest.fixture
def parts() -> Iterator[Parts]:
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2).eval()
    rings, fd = SharedRings.create(PoolLayout.for_config(CONFIG, SLOTS), "streams-test")
    staged = StagedInputs(rings, torch.device("cpu"))
    yield rings, staged, BatchRunner(CONFIG, model, rings, device_inputs=staged.rings), model
    rings.close()
    os.close(fd)


def _expected(model: torch.nn.Module, rows: np.ndarray) -> np.ndarray:
    with torch.inference_mode():
        return model(torch.from_numpy(rows)).numpy()


def test_a_batch_waits_for_its_rows_and_reads_the_copy_staged_on_arrival(parts: Parts) -> None:
    rings, staged, runner, model = parts
    worker = Worker(runner, staged)
    arrived = np.arange(6, dtype=np.float32).reshape(2, 3)
    rings.inputs[0][2:4] = arrived
    worker.run(batch_id=1, start=2, rows=2)
    assert not worker.answered(0.2), "the batch ran before its rows were staged"
    staged.stage(2, 2)
    rings.inputs[0][2:4] = -1.0  # the pool changes after the copy: the batch must read the device ring's copy
    done = worker.next()
    assert isinstance(done, BatchDone) and done.batch_id == 1 and done.errors is None
    np.testing.assert_allclose(rings.outputs[0][2:4], _expected(model, arrived), rtol=1e-6)


def test_a_request_split_over_two_workers_is_read_by_each_and_released_after(parts: Parts) -> None:
    rings, staged, runner, model = parts
    first, second = Worker(runner, staged, 0), Worker(runner, staged, 1)
    rows = np.random.default_rng(0).normal(size=(4, 3)).astype(np.float32)
    rings.inputs[0][4:8] = rows
    staged.stage(4, 4)
    first.run(batch_id=1, start=4, rows=2)
    second.run(batch_id=2, start=6, rows=2)
    assert {first.next().batch_id, second.next().batch_id} == {1, 2}  # type: ignore[attr-defined]
    np.testing.assert_allclose(rings.outputs[0][4:8], _expected(model, rows), rtol=1e-6)
    # The slots were released: a batch over them now waits for a new copy rather than reading the old one.
    first.run(batch_id=3, start=4, rows=2)
    assert not first.answered(0.2)
    staged.stage(4, 2)
    assert first.next().batch_id == 3  # type: ignore[attr-defined]


def test_the_stager_thread_stages_what_the_engine_names_until_the_pipe_closes(parts: Parts) -> None:
    rings, staged, _, _ = parts
    read, write = os.pipe()
    stager = threading.Thread(target=staged.follow, args=(read,))
    stager.start()
    rings.inputs[0][0:3] = 7.0
    write_staged(write, 0, 3)
    staged.order(None, 0, 3)  # returns once the stager has issued the copy
    np.testing.assert_array_equal(staged.rings[0][0:3].numpy(), 7.0)
    os.close(write)
    stager.join(10.0)
    assert not stager.is_alive()
    os.close(read)


def test_rows_never_staged_fail_their_batch_by_name_and_the_worker_thread_closes_its_pipes(
    parts: Parts,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _, staged, runner, _ = parts
    monkeypatch.setattr(streams, "STAGE_TIMEOUT_S", 0.1)
    with pytest.raises(RuntimeError, match=re.escape("slots 5..6 were not staged within 0.1 s")):
        staged.order(None, 5, 2)
    worker = Worker(runner, staged)
    worker.run(batch_id=1, start=5, rows=2)
    with pytest.raises(EOFError):  # the engine sees a worker exit, and re-runs or fails what it held
        worker.next()


def test_a_stopped_worker_thread_closes_its_pipes(parts: Parts) -> None:
    _, staged, runner, _ = parts
    worker = Worker(runner, staged)
    write_message(worker.commands, Stop())
    with pytest.raises(EOFError):
        worker.next()


@pytest.mark.parametrize("model", ["mlp", "cnn"])
def test_a_stored_model_moved_to_a_device_computes_what_it_did(model: str) -> None:
    path = next((EXAMPLES / model / "1").glob("model.pt*"))
    stored = read_artifact(path, 4)
    rows = torch.rand((2, 1, 28, 28)) if model == "cnn" else torch.rand((2, 784))
    expected = executable(stored)(rows)
    moved = executable(on_device(stored, torch.device("cpu")))
    torch.testing.assert_close(moved(rows), expected)


def test_device_cuda_without_a_gpu_is_a_clear_load_error(tmp_path: Path) -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA device")
    link_example(tmp_path, "mlp", device="cuda")

    async def main() -> None:
        engine = ModelEngine(ModelRepository(tmp_path).read("mlp"))
        with pytest.raises(ConfigError, match="device cuda: this machine has no CUDA device"):
            await engine.start()

    asyncio.run(main())


def test_a_batch_that_dies_leaves_its_rows_staged_for_the_worker_that_runs_them_again(
    parts: Parts, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, staged, _, _ = parts
    monkeypatch.setattr(streams, "STAGE_TIMEOUT_S", 0.1)
    lane = StreamLane(staged)
    staged.stage(0, 2)
    with pytest.raises(RuntimeError, match="the worker died"), lane.running(0, 2):
        raise RuntimeError("the worker died")
    with lane.running(0, 2):  # does not wait: the rows are still staged
        pass
    with pytest.raises(RuntimeError, match="not staged"), lane.running(0, 2):  # released by the batch that ran
        pass


@pytest.mark.parametrize(
    ("batch", "sizes"), [(1, [1]), (2, [1, 2]), (6, [1, 2, 4, 6]), (8, [1, 2, 4, 8]), (16, [1, 2, 4, 8, 16])]
)
def test_a_worker_captures_a_graph_per_power_of_two_up_to_its_granularity(batch: int, sizes: list[int]) -> None:
    assert streams.graph_sizes(batch) == sizes


def test_a_stream_worker_without_a_gpu_runs_its_model_eagerly(parts: Parts) -> None:
    rings, staged, _, model = parts
    runner, lane = streams.stream_worker(CONFIG, model, rings, staged, 4)
    assert lane.stream is None and runner.forward == model.forward
    rows = np.random.default_rng(2).normal(size=(3, 3)).astype(np.float32)
    rings.inputs[0][0:3] = rows
    staged.stage(0, 3)
    with torch.inference_mode(), lane.running(0, 3):
        runner.run(0, 3)
    np.testing.assert_allclose(rings.outputs[0][0:3], _expected(model, rows), rtol=1e-6)


def test_padded_forward_runs_the_smallest_size_that_holds_the_rows() -> None:
    """The CPU stand-in of the graphs: rows copied into the buffer of the next size up, the first rows returned."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(5, 4), torch.nn.ReLU(), torch.nn.Linear(4, 3)).eval()
    sizes: list[int] = []

    def forward(x: torch.Tensor) -> torch.Tensor:
        sizes.append(x.shape[0])
        return model(x)

    padded = streams.PaddedForward(forward, 6)
    with torch.inference_mode():
        for rows in (6, 1, 3, 5, 2, 4, 6):
            x = torch.rand((rows, 5))
            (answer,) = padded(x)
            torch.testing.assert_close(answer, model(x))
    assert sizes == [6, 1, 4, 6, 2, 4, 6]


@needs_cuda
def test_graphed_forward_answers_every_row_count_as_the_model_does() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(784, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10)).cuda().eval()
    stream = torch.cuda.Stream()
    graphed = streams.GraphedForward(model, 6, stream)
    with torch.inference_mode():
        for rows in (6, 1, 3, 5, 2, 4, 6):
            x = torch.rand((rows, 784), device="cuda")
            with torch.cuda.stream(stream):
                (answer,) = graphed(x)
                expected = model(x)
            stream.synchronize()
            torch.testing.assert_close(answer, expected)
    assert sorted(graphed._graphs) == [1, 2, 4, 6]


@needs_cuda
@pytest.mark.parametrize(
    "overrides",
    [
        {"cuda_graphs": True},
        {"cuda_graphs": False},
        {"batching": {"policy": "fixed-timeout", "max_queue_delay_us": 1000}},
        {"batching": {"policy": "none"}},
    ],
    ids=["elastic-graphs", "elastic-eager", "fixed-timeout", "none"],
)
def test_a_cuda_model_serves_concurrent_requests_of_mixed_sizes_exactly(
    tmp_path: Path, overrides: dict[str, object]
) -> None:
    """Every batching policy on the same path, with and without CUDA graphs."""
    link_example(tmp_path, "mlp", device="cuda", **overrides)
    spec = ModelRepository(tmp_path).read("mlp")
    model = executable(read_artifact(spec.artifact, spec.config.max_batch_size))
    rng = np.random.default_rng(0)
    requests = [rng.random((int(rows), 784), dtype=np.float32) for rows in rng.integers(1, 9, 200)]

    async def body(engine: ModelEngine) -> None:
        results = await asyncio.gather(*(engine.infer([x], len(x), {}) for x in requests))
        for x, result in zip(requests, results, strict=True):
            np.testing.assert_allclose(result.outputs[0], _expected(model, x), rtol=1e-4, atol=1e-5)

    run_engine(tmp_path, body)


@needs_cuda
def test_a_cuda_host_killed_under_load_loses_no_request(tmp_path: Path) -> None:
    """On CUDA the workers are the host's threads, so killing the host ends them all at once: the engine starts a
    new host, stages every row still in the pool on its new stage pipe, and runs the held rows again."""
    link_example(tmp_path, "mlp", device="cuda")
    spec = ModelRepository(tmp_path).read("mlp")
    model = executable(read_artifact(spec.artifact, spec.config.max_batch_size))
    rng = np.random.default_rng(4)
    requests = [rng.random((int(rows), 784), dtype=np.float32) for rows in rng.integers(1, 9, 120)]

    async def body(engine: ModelEngine) -> None:
        assert engine._host is not None
        first_host = engine._host.process.pid
        before = [asyncio.ensure_future(engine.infer([x], len(x), {})) for x in requests[:60]]
        await asyncio.sleep(0)  # the first requests are in the pool and on their way to the workers
        os.kill(first_host, signal.SIGKILL)  # our own host, by its PID
        after = [asyncio.ensure_future(engine.infer([x], len(x), {})) for x in requests[60:]]
        results = await asyncio.wait_for(asyncio.gather(*before, *after), 120.0)
        assert engine._host.process.pid != first_host
        assert engine.stats.host_restarts == 1
        for x, result in zip(requests, results, strict=True):
            np.testing.assert_allclose(result.outputs[0], _expected(model, x), rtol=1e-4, atol=1e-5)

    run_engine(tmp_path, body)


@needs_cuda
def test_tritonclient_gets_a_cuda_models_answers_through_the_server(tmp_path: Path) -> None:
    import tritonclient.http as httpclient

    link_example(tmp_path, "mlp", device="cuda")
    spec = ModelRepository(tmp_path).read("mlp")
    model = executable(read_artifact(spec.artifact, spec.config.max_batch_size))
    rows = np.random.default_rng(1).random((5, 784), dtype=np.float32)
    with running_server(tmp_path) as server, httpclient.InferenceServerClient(server.http_url) as client:
        tensor = httpclient.InferInput("image", list(rows.shape), "FP32")
        tensor.set_data_from_numpy(rows, binary_data=True)
        answer = client.infer("mlp", [tensor]).as_numpy("logits")
    np.testing.assert_allclose(answer, _expected(model, rows), rtol=1e-4, atol=1e-5)


@needs_cuda
def test_grpc_clients_get_a_cuda_cnns_answers_through_the_server(tmp_path: Path) -> None:
    """Convolutions on the GPU (cuDNN may use TF32, as PyTorch allows by default): close to the CPU's, same classes;
    a row in the wrong slot would be off by far more."""
    import tritonclient.grpc as grpcclient

    link_example(tmp_path, "cnn", device="cuda")
    spec = ModelRepository(tmp_path).read("cnn")
    model = executable(read_artifact(spec.artifact, spec.config.max_batch_size))
    rng = np.random.default_rng(5)
    requests = [rng.random((int(rows), 1, 28, 28), dtype=np.float32) for rows in rng.integers(1, 9, 40)]
    with running_server(tmp_path) as server, grpcclient.InferenceServerClient(server.grpc_url) as client:
        answers = []
        for rows in requests:
            tensor = grpcclient.InferInput("image", list(rows.shape), "FP32")
            tensor.set_data_from_numpy(rows)
            answers.append(client.infer("cnn", [tensor]).as_numpy("logits"))
    expected = _expected(model, np.concatenate(requests))
    np.testing.assert_allclose(np.concatenate(answers), expected, rtol=1e-2, atol=5e-2)
    assert (np.concatenate(answers).argmax(1) == expected.argmax(1)).mean() > 0.99


class _HostSync(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * float(x.sum())  # reads a value back to the host: a CUDA graph cannot hold that


@needs_cuda
def test_a_model_that_cannot_be_captured_is_a_clear_error_naming_the_switch() -> None:
    """Last in this file: a failed capture is the one CUDA error these tests cause on purpose."""
    stream = torch.cuda.Stream()
    graphed = streams.GraphedForward(_HostSync(), 2, stream)
    with torch.inference_mode(), pytest.raises(ConfigError, match="set cuda_graphs: false to run it eagerly"):
        graphed(torch.rand((2, 4), device="cuda"))
