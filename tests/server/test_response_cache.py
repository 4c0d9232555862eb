"""Triton's response cache: the cache itself (keys, least-recently-used eviction within its size, the flag), and a
real server answering repeated requests from it over HTTP and gRPC, with Triton's statistics and the metrics."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from adaserve.errors import ConfigError
from adaserve.server.response_cache import ENTRY_OVERHEAD_BYTES, ResponseCache, cache_size_from_config
from tests.server_utils import Clients, ServerHandle, link_example, metric, running_server

IMAGE = ["image"], ["FP32"]


def key(array: np.ndarray, parameters: dict[str, Any] | None = None, **changes: Any) -> bytes:
    """The key of a request to model `m` version 1 with this input and these parameters (`changes` replace the
    other parts of the key)."""
    parts: dict[str, Any] = {"model": "m", "version": 1, "source": ("config", 1), "names": ["image"]}
    parts.update(datatypes=["FP32"], arrays=[array], parameters=parameters or {})
    parts.update(changes)
    return ResponseCache.key(**parts)


def test_a_key_changes_with_everything_that_decides_the_answer_and_nothing_else() -> None:
    image = np.arange(12, dtype=np.float32).reshape(3, 4)
    base = key(image, {"accuracy": 0.9, "early_exit": True})
    changed = [
        key(image, {"accuracy": 0.9, "early_exit": True}, model="n"),
        key(image, {"accuracy": 0.9, "early_exit": True}, version=2),
        key(image, {"accuracy": 0.9, "early_exit": True}, source=("config", 2)),  # the files changed on disk
        key(image, {"accuracy": 0.9, "early_exit": True}, names=["pixels"]),
        key(image.view(np.int32), {"accuracy": 0.9, "early_exit": True}, datatypes=["INT32"]),  # the same bytes
        key(image.reshape(4, 3), {"accuracy": 0.9, "early_exit": True}),  # the same bytes, another shape
        key(image + 1, {"accuracy": 0.9, "early_exit": True}),
        key(image, {"accuracy": 0.8, "early_exit": True}),
        key(image, {"accuracy": 0.9, "early_exit": False}),
        key(image, {"accuracy": 0.9}),
    ]
    assert len({base, *changed}) == len(changed) + 1
    # Order, scheduling parameters and a strided view of the same values are not part of what decides it.
    assert key(image, {"early_exit": True, "accuracy": 0.9, "priority": 1, "timeout": 5000}) == base
    wide = np.zeros((3, 8), np.float32)
    wide[:, ::2] = image
    assert key(wide[:, ::2], {"accuracy": 0.9, "early_exit": True}) == base


def test_the_least_recently_used_answers_go_first_and_only_as_many_as_make_room() -> None:
    row = np.zeros((1, 10), np.float32)  # 40 bytes
    entry = row.nbytes + ENTRY_OVERHEAD_BYTES
    cache = ResponseCache(3 * entry)
    keys = [key(row + i) for i in range(4)]
    for k in keys[:3]:
        assert cache.put(k, [row], {})
    assert cache.get(keys[0]) is not None  # now the most recently used
    assert cache.put(keys[3], [row], {"exit_block": "head"})
    assert cache.get(keys[1]) is None and cache.evictions == 1
    assert [cache.get(k) is not None for k in (keys[0], keys[2], keys[3])] == [True, True, True]
    assert len(cache) == 3 and cache.used_bytes == 3 * entry
    answer = cache.get(keys[3])
    assert answer is not None and answer.parameters == {"exit_block": "head"}
    with pytest.raises(ValueError, match="read-only"):
        answer.outputs[0][0, 0] = 1  # a hit hands out the arrays it keeps


def test_an_answer_larger_than_the_cache_is_not_kept_and_evicts_nothing() -> None:
    small, large = np.zeros((1, 10), np.float32), np.zeros((64, 10), np.float32)
    cache = ResponseCache(large.nbytes)  # its entry overhead makes it too large
    assert cache.put(key(small), [small], {})
    assert not cache.put(key(large), [large], {})
    assert (cache.too_large, cache.evictions, len(cache)) == (1, 0, 1)
    assert cache.get(key(small)) is not None


def test_putting_an_answer_again_replaces_it_without_counting_it_twice() -> None:
    row = np.zeros((1, 10), np.float32)
    cache = ResponseCache(10 * (row.nbytes + ENTRY_OVERHEAD_BYTES))
    cache.put(key(row), [row], {})
    cache.put(key(row), [row + 1], {})
    answer = cache.get(key(row))
    assert len(cache) == 1 and cache.used_bytes == row.nbytes + ENTRY_OVERHEAD_BYTES
    assert answer is not None and answer.outputs[0][0, 0] == 1


@pytest.mark.parametrize(
    ("options", "size"),
    [((), None), (("local,size=1048576",), 1048576), (("local,size=100MB",), 10**8), (("local,size=1GiB",), 2**30)],
)
def test_the_cache_config_flag_in_tritons_form(options: tuple[str, ...], size: int | None) -> None:
    assert cache_size_from_config(options) == size


@pytest.mark.parametrize(
    ("option", "message"),
    [
        ("redis,host=localhost", "the only cache here is 'local'"),
        ("local", "the local cache's one setting is size=BYTES"),
        ("local,capacity=5", "the local cache's one setting is size=BYTES"),
        ("local,size=0", "size is bytes above 0"),
        ("local,size=40%", "size is bytes above 0"),
        ("local,size=lots", "size is bytes above 0"),
    ],
)
def test_a_bad_cache_config_names_the_option(option: str, message: str) -> None:
    with pytest.raises(ConfigError, match=f"--cache-config '{option}': {message}"):
        cache_size_from_config([option])


# -- a real server -----------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("response-cache") / "models"
    link_example(root, "mlp", response_cache={"enable": True})
    link_example(root, "cnn")  # does not keep its answers
    return root


@pytest.fixture(scope="module")
def server(repository: Path) -> Iterator[ServerHandle]:
    with running_server(repository, "--cache-config", "local,size=1MB") as handle:
        yield handle


def images(seed: int, rows: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).random((rows, 784), dtype=np.float32)


def infer(
    server: ServerHandle, image: np.ndarray, protocol: str = "http", *, priority: int = 0, **parameters: Any
) -> np.ndarray:
    """The mlp's logits; `priority` and `timeout` (microseconds) as tritonclient sends them."""
    module: Any = httpclient if protocol == "http" else grpcclient
    tensor = module.InferInput("image", list(image.shape), "FP32")
    tensor.set_data_from_numpy(image)
    timeout = parameters.pop("timeout", None)
    with Clients() as clients:
        client = clients.of(server, protocol)
        result = client.infer("mlp", [tensor], parameters=parameters or None, priority=priority, timeout=timeout)
    return result.as_numpy("logits")


def statistics(server: ServerHandle, model: str = "mlp") -> dict[str, Any]:
    with httpclient.InferenceServerClient(server.http_url) as client:
        (stats,) = client.get_inference_statistics(model)["model_stats"]
    return stats


def counts(server: ServerHandle) -> tuple[int, int, int]:
    """(hits, misses, batches executed) of the mlp so far."""
    stats = statistics(server)
    inference = stats["inference_stats"]
    return inference["cache_hit"]["count"], inference["cache_miss"]["count"], stats["execution_count"]


def test_a_repeated_request_is_answered_from_the_cache_on_both_protocols(server: ServerHandle) -> None:
    hits, misses, executed = counts(server)
    image = images(1, rows=3)
    first = infer(server, image)
    again = [infer(server, image), infer(server, image, "grpc")]
    for answer in again:
        np.testing.assert_array_equal(answer, first)
    assert counts(server) == (hits + 2, misses + 1, executed + 1)
    stats = statistics(server)["inference_stats"]
    assert stats["success"]["count"] >= 3 and stats["cache_hit"]["ns"] > 0 and stats["cache_miss"]["ns"] > 0
    assert metric(server, 'adaserve_response_cache_hits_total{model="mlp",version="1"}') == hits + 2
    assert metric(server, "adaserve_response_cache_entries") >= 1
    assert metric(server, "adaserve_response_cache_capacity_bytes") == 10**6


def test_a_hit_answers_in_the_form_each_request_asks_for(server: ServerHandle, clients: Clients) -> None:
    """The cache keeps outputs whole: a request for the top classes (the classification extension) hits the answer
    a request for the logits left."""
    image = images(8)
    first = infer(server, image)
    hits, misses, executed = counts(server)
    client = clients.grpc(server.grpc_url)
    tensor = grpcclient.InferInput("image", [1, 784], "FP32")
    tensor.set_data_from_numpy(image)
    result = client.infer("mlp", [tensor], outputs=[grpcclient.InferRequestedOutput("logits", class_count=1)])
    (top,) = result.as_numpy("logits")[:, 0]
    assert int(top.decode().split(":")[1]) == int(np.argmax(first))
    assert counts(server) == (hits + 1, misses, executed)


def test_other_inputs_or_parameters_run_the_model_and_scheduling_ones_do_not(server: ServerHandle) -> None:
    image = images(2)
    infer(server, image)
    hits, misses, executed = counts(server)
    infer(server, images(3))  # other values
    infer(server, image[:, ::-1].copy())  # the same values in another order
    infer(server, image, trace_label="a")  # a parameter the model may read
    infer(server, image, trace_label="b")
    assert counts(server) == (hits, misses + 4, executed + 4)
    infer(server, image, timeout=10_000_000)  # when it may wait, not what it computes
    infer(server, image, "grpc", priority=1)
    infer(server, image, trace_label="a")
    assert counts(server) == (hits + 3, misses + 4, executed + 4)


def test_a_bad_scheduling_parameter_is_refused_even_when_the_answer_is_cached(server: ServerHandle) -> None:
    image = images(4)
    infer(server, image)
    with pytest.raises(InferenceServerException, match="parameter 'timeout' must be a whole number"):
        infer(server, image, timeout=-5)


def test_a_model_that_does_not_enable_the_cache_runs_every_request(server: ServerHandle, clients: Clients) -> None:
    client = clients.http(server.http_url)
    tensor = httpclient.InferInput("image", [1, 1, 28, 28], "FP32")
    tensor.set_data_from_numpy(images(5).reshape(1, 1, 28, 28))
    before = statistics(server, "cnn")["execution_count"]
    for _ in range(3):
        client.infer("cnn", [tensor])
    stats = statistics(server, "cnn")
    assert stats["execution_count"] == before + 3 and stats["inference_stats"]["cache_hit"]["count"] == 0
    assert client.get_model_config("cnn")["response_cache"] == {"enable": False}
    assert client.get_model_config("mlp")["response_cache"] == {"enable": True}


def test_a_model_changed_on_disk_and_reloaded_never_answers_from_its_old_files(
    server: ServerHandle, repository: Path, clients: Clients
) -> None:
    client = clients.http(server.http_url)
    image = images(6)
    infer(server, image)
    client.load_model("mlp")  # the same files: its answers stay
    hits, misses, _ = counts(server)
    infer(server, image)
    assert counts(server)[:2] == (hits + 1, misses)
    artifact = repository / "mlp" / "1" / "model.pt2"
    target = artifact.resolve()
    artifact.unlink()
    shutil.copyfile(target, artifact)  # the same model, but other files as far as anyone can tell
    client.load_model("mlp")
    infer(server, image)
    assert counts(server)[:2] == (0, 1)  # a new engine, counting afresh: its first request ran


def test_a_server_without_a_cache_runs_a_caching_model_and_says_why(tmp_path: Path) -> None:
    root = tmp_path / "models"
    link_example(root, "mlp", response_cache={"enable": True})
    with running_server(root) as handle:
        image = images(7)
        for _ in range(2):
            infer(handle, image)
        assert counts(handle) == (0, 0, 2)
        log = handle.log.read_text()
    assert log.count("model enables response_cache, but this server has no response cache") == 1
