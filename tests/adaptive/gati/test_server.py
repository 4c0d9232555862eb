"""GATI through a real server with tritonclient: the example CNN with a small cache set built on Fashion-MNIST.

Requests come back with the block their answer came from; a row that ran to the end is the base model's output
exactly; `early_exit: false` is the base model; bad parameters are 400s; the caches show in /metrics and in the model
configuration; a model whose cache set is missing keeps serving without early exit; `caches build` makes a model
serve its caches with no step between."""

from __future__ import annotations

import json
import shutil
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from prometheus_client.parser import text_string_to_metric_families
from tritonclient.utils import InferenceServerException

from adaserve.adaptive.gati import explore
from adaserve.adaptive.gati.cacheset import load_cache_set, rewrite_manifest
from adaserve.datasets import load_fashion_mnist
from adaserve.repository import ModelRepository
from tests.adaptive.gati.conftest import build_timed_alike
from tests.adaptive.gati.test_adapt import BUILD
from tests.adaptive.gati.test_build import adaserve
from tests.server_utils import Clients, ServerHandle, link_example, needs_cuda, running_server

WORKERS = {"workers": [{"batch": 4, "threads": 1}]}
#: A low agreement target, so the composition surely exits early on some rows.
CACHES = {"targets": [0.8], "verify_fraction": 1.0}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerHandle]:
    root = tmp_path_factory.mktemp("gati") / "models"
    root.mkdir()
    link_example(root, "cnn", **WORKERS)
    link_example(root, "cnn", "cnn_gati", caches=CACHES, **WORKERS)
    link_example(root, "cnn", "cnn_nocache", caches=CACHES, **WORKERS)
    build_timed_alike(ModelRepository(root).read("cnn_gati"), BUILD, [0.8])
    # The same caches with the chain in a model process beside each worker.
    link_example(root, "cnn", "cnn_gati_process", caches=CACHES | {"lookup": "process"}, **WORKERS)
    copy_cache_set(root, "cnn_gati", "cnn_gati_process")
    models = ["--model=cnn", "--model=cnn_gati", "--model=cnn_nocache", "--model=cnn_gati_process"]
    if torch.cuda.is_available():  # the same caches served from the GPU
        gpu = {"caches": CACHES | {"lookup": "stream"}, "device": "cuda"}
        link_example(root, "cnn", "cnn_gati_gpu", **gpu, **WORKERS)
        copy_cache_set(root, "cnn_gati", "cnn_gati_gpu")
        models.append("--model=cnn_gati_gpu")
    with running_server(root, *models) as handle:
        yield handle


def copy_cache_set(root: Path, model: str, to: str) -> None:
    """`model`'s built cache set, as `to`'s (the same example model under another name)."""
    built = load_cache_set(ModelRepository(root).read(model))
    copy = root / to / "caches" / built.directory.name
    shutil.copytree(built.directory, copy)
    rewrite_manifest(copy, built.manifest.model_copy(update={"model": to}))


def infer(
    client: httpclient.InferenceServerClient, model: str, image: np.ndarray, **parameters: object
) -> tuple[np.ndarray, dict[str, object]]:
    tensor = httpclient.InferInput("image", list(image.shape), "FP32")
    tensor.set_data_from_numpy(image, binary_data=True)
    result = client.infer(model, [tensor], parameters=parameters or None)
    response = result.get_response()
    return result.as_numpy("logits"), dict(response.get("parameters", {}))


def first_images(count: int = 40) -> np.ndarray:
    """Fashion-MNIST's first test images, each as a one-row batch."""
    images, _ = load_fashion_mnist("test")
    return images[:count].reshape(count, 1, 1, 28, 28).astype(np.float32)


def test_answers_name_their_exit_and_rows_that_ran_whole_are_the_model(server: ServerHandle, clients: Clients) -> None:
    images, client = first_images(), clients.http(server.http_url)
    exits = []
    for image in images:
        base, _ = infer(client, "cnn", image)
        logits, parameters = infer(client, "cnn_gati", image)
        exits.append(parameters["exit_block"])
        assert parameters["exited_rows"] == (0 if parameters["exit_block"] == "head" else 1)
        if parameters["exit_block"] == "head":
            np.testing.assert_allclose(logits, base, rtol=1e-5, atol=1e-5)
        off, off_parameters = infer(client, "cnn_gati", image, early_exit=False)
        np.testing.assert_allclose(off, base, rtol=1e-5, atol=1e-5)
        assert "exit_block" not in off_parameters
    assert set(exits) <= {"stage1", "stage2", "head"} and set(exits) - {"head"}, exits

    # A batch of 4 rows in one request: rows that hit leave the batch; the request reports how many.
    logits, parameters = infer(client, "cnn_gati", images[:4, 0])
    assert logits.shape == (4, 10) and 0 <= parameters["exited_rows"] <= 4  # type: ignore[operator]

    # gRPC carries the same parameters.
    grpc = clients.grpc(server.grpc_url)
    tensor = grpcclient.InferInput("image", [1, 1, 28, 28], "FP32")
    tensor.set_data_from_numpy(images[0])
    response = grpc.infer("cnn_gati", [tensor], parameters={"accuracy": 0.8}).get_response(as_json=True)
    assert response["parameters"]["exit_block"]["string_param"] in {"stage1", "stage2", "head"}


def test_after_a_build_requests_without_parameters_exit_early(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, clients: Clients, capsys: pytest.CaptureFixture[str]
) -> None:
    """`caches build` adds the `caches:` block itself, its default the strictest target that deploys an exit: no
    composition can be certified at 0.999 on a few thousand rows, one is at 0.8. The build is the small one with
    the latencies fixed (`build_timed_alike`), so a busy machine's timings do not drop the exits."""
    root = tmp_path / "models"
    root.mkdir()
    link_example(root, "cnn", **WORKERS)
    monkeypatch.setattr(
        explore, "build_cache_set", lambda spec, _, __, *, targets, **___: build_timed_alike(spec, BUILD, targets)
    )
    targets = ["--target", "0.999", "--target", "0.8"]
    assert adaserve("caches", "build", "cnn", "--data", "fashion-mnist", "--model-repository", str(root), *targets) == 0
    printed = capsys.readouterr().out
    assert "default target 0.8, the strictest that deploys an exit: exits after" in printed
    assert "added `caches: {targets: [0.8, 0.999]}`" in printed
    with running_server(root, "--model=cnn") as handle:
        client = clients.http(handle.http_url)
        answers = [infer(client, "cnn", image)[1] for image in first_images(20)]
    exits = [answer["exit_block"] for answer in answers]
    assert set(exits) - {"head"}, exits
    assert all(answer["exited_rows"] == (answer["exit_block"] != "head") for answer in answers), answers


def test_a_request_split_over_batches_reports_every_rows_exit(server: ServerHandle, clients: Clients) -> None:
    """A request of 7 rows runs on the batch-4 worker as two batches; the rows the caches answered in either count
    (they used to count only in the last batch's part). An answered row carries its cache's logits, the others the
    base model's, so the count is checked against the outputs."""
    images, _ = load_fashion_mnist("test")
    client = clients.http(server.http_url)
    counts = []
    for start in range(0, 70, 7):
        rows = images[start : start + 7].reshape(7, 1, 28, 28).astype(np.float32)
        base, _ = infer(client, "cnn", rows)
        logits, parameters = infer(client, "cnn_gati", rows)
        cached = int(np.sum(~np.isclose(logits, base, rtol=1e-5, atol=1e-5).all(axis=1)))
        assert parameters["exited_rows"] == cached, (parameters, cached)
        assert parameters["exit_block"] == "head" if cached < 7 else parameters["exit_block"] in {"stage1", "stage2"}
        counts.append(cached)
    assert any(0 < count < 7 for count in counts), counts


def test_lookups_beside_a_model_process_answer_as_inline_ones(server: ServerHandle, clients: Clients) -> None:
    """`lookup: process` runs the same chain and cache graphs, the chain in a model process: the same exits and
    the same logits, one request at a time and in a batch whose rows leave it at different exits."""
    images, client = first_images(), clients.http(server.http_url)
    exits = []
    for image in images:
        inline, inline_parameters = infer(client, "cnn_gati", image)
        beside, beside_parameters = infer(client, "cnn_gati_process", image)
        assert beside_parameters["exit_block"] == inline_parameters["exit_block"]
        np.testing.assert_allclose(beside, inline, rtol=1e-5, atol=1e-5)
        exits.append(beside_parameters["exit_block"])
    assert set(exits) - {"head"} and "head" in exits, exits  # both kinds of row were tried
    for start in range(0, 40, 4):  # batches of four rows: rows that hit leave, the rest run on
        inline, inline_parameters = infer(client, "cnn_gati", images[start : start + 4, 0])
        beside, beside_parameters = infer(client, "cnn_gati_process", images[start : start + 4, 0])
        np.testing.assert_allclose(beside, inline, rtol=1e-5, atol=1e-5)
        assert beside_parameters["exited_rows"] == inline_parameters["exited_rows"]


@needs_cuda
def test_on_a_gpu_the_caches_answer_as_they_do_on_the_cpu(server: ServerHandle, clients: Clients) -> None:
    """The GPU form (the lookups on a side stream, each beside the next block) answers what the CPU form answers:
    the same exits, the same logits, up to the GPU's rounding, which may move a score near its threshold across it."""
    images, client = first_images(), clients.http(server.http_url)
    same = 0
    for image in images:
        cpu, cpu_parameters = infer(client, "cnn_gati", image)
        gpu, gpu_parameters = infer(client, "cnn_gati_gpu", image)
        if gpu_parameters["exit_block"] == cpu_parameters["exit_block"]:
            same += 1
            np.testing.assert_allclose(gpu, cpu, rtol=1e-3, atol=1e-3)
    assert same >= 36, same
    logits, parameters = infer(client, "cnn_gati_gpu", images[:4, 0])
    assert logits.shape == (4, 10) and 0 <= parameters["exited_rows"] <= 4  # type: ignore[operator]
    config = client.get_model_config("cnn_gati_gpu")
    assert config["parameters"]["early_exit"]["string_value"].startswith("cache set v1 (target 0.8: after ")


def test_bad_parameters_are_400s(server: ServerHandle, clients: Clients) -> None:
    client = clients.http(server.http_url)
    image = np.zeros((1, 1, 28, 28), np.float32)
    for parameters, name in (({"early_exit": "yes"}, "early_exit"), ({"accuracy": 2}, "accuracy")):
        with pytest.raises(InferenceServerException, match=name) as raised:
            infer(client, "cnn_gati", image, **parameters)
        assert raised.value.status() == "400"
    assert infer(client, "cnn_gati", image)[0].shape == (1, 10)  # and the model keeps serving


def test_metrics_and_configuration_show_the_caches(server: ServerHandle, clients: Clients) -> None:
    client = clients.http(server.http_url)
    images, _ = load_fashion_mnist("test")
    for image in images[:10].reshape(10, 1, 1, 28, 28):
        infer(client, "cnn_gati", image.astype(np.float32))
    with urllib.request.urlopen(f"http://{server.http_url}/metrics") as response:
        families = {f.name: f for f in text_string_to_metric_families(response.read().decode())}
    lookups = {
        s.labels["block"]: s.value
        for s in families["adaserve_early_exit_lookups"].samples
        if "cnn_gati" in s.labels.values()
    }
    hits = {
        s.labels["block"]: s.value
        for s in families["adaserve_early_exit_hits"].samples
        if "cnn_gati" in s.labels.values()
    }
    assert lookups and all(0 <= hits[block] <= count for block, count in lookups.items())
    verified = sum(
        s.value
        for s in families["adaserve_early_exit_verified"].samples
        if s.name.endswith("_total") and "cnn_gati" in s.labels.values()
    )
    assert verified == sum(hits.values())  # verify_fraction 1: every hit also ran to the end
    cache_bytes = [s.value for s in families["adaserve_early_exit_cache_bytes"].samples]
    assert cache_bytes and cache_bytes[0] > 0

    config = client.get_model_config("cnn_gati")
    assert config["parameters"]["early_exit"]["string_value"].startswith("cache set v1 (target 0.8: after ")
    missing = client.get_model_config("cnn_nocache")
    assert missing["parameters"]["early_exit"]["string_value"] == "off"
    logits, parameters = infer(client, "cnn_nocache", images[:1].reshape(1, 1, 28, 28).astype(np.float32))
    assert logits.shape == (1, 10) and "exit_block" not in parameters
    log = server.log.read_text()
    assert "learned caches cannot serve" in log and "has no cache set" in json.dumps(log)
