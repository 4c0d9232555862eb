"""Every example the documentation site shows (docs/examples/, included into its pages as they are) runs here
against a real server on 127.0.0.1, and a model's answers equal the model's own."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
import torch

from tests.server_utils import ROOT, ServerHandle, running_server

EXAMPLES = ROOT / "docs" / "examples"
BIN = Path(sys.executable).parent


def example(name: str) -> ModuleType:
    """An example of docs/examples/ imported as a module, to call the functions the page shows."""
    spec = importlib.util.spec_from_file_location(f"docs_example_{name}", EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _pointed_at(text: str, server: ServerHandle) -> str:
    """An example's text with the addresses and the virtualenv it names replaced by the test server's and this one."""
    return (
        text.replace("127.0.0.1:8000", server.http_url)
        .replace("127.0.0.1:8001", server.grpc_url)
        .replace(".venv/bin/", f"{BIN}/")
    )


def _run(command: list[str], cwd: Path) -> str:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_the_first_requests_of_getting_started(server: ServerHandle, tmp_path: Path) -> None:
    script = _pointed_at((EXAMPLES / "first_request.sh").read_text(), server)
    shell = _run(["bash", "-euo", "pipefail", "-c", script], tmp_path)
    assert shell.startswith('{"name":"mlp"') and '"argmax"' in shell and "mlp_torchscript\tv1" in shell
    assert re.search(r'"\d+\.\d+:\d:[A-Z]', shell)  # a class named ("value:index:label")
    (tmp_path / "first_request.py").write_text(_pointed_at((EXAMPLES / "first_request.py").read_text(), server))
    classes = _run([sys.executable, "first_request.py"], tmp_path)
    assert classes.startswith("[") and len(classes.strip("[]\n").split()) == 4


@pytest.fixture(scope="module")
def own_models(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerHandle]:
    """The export examples that take tensors of any values, each run as the page says into one repository, served
    (the BERT classifier's, whose mask must be 0 or 1, runs in tests/test_transformers_recipe.py)."""
    repository = tmp_path_factory.mktemp("own") / "models"
    for name in ("torch_module", "torchscript_model"):
        _run([sys.executable, str(EXAMPLES / f"{name}.py"), str(repository)], repository.parent)
    with running_server(repository) as server:
        yield server


@pytest.mark.parametrize(("script", "model"), [("torch_module", "scorer"), ("torchscript_model", "ranker")])
def test_an_exported_model_answers_as_the_model_itself(own_models: ServerHandle, script: str, model: str) -> None:
    inputs, outputs = example("ask").ask(model, own_models.http_url)
    with torch.no_grad():
        expected = example(script).build()(*(torch.from_numpy(array) for array in inputs))
    (answer,) = outputs.values()
    np.testing.assert_allclose(answer, expected.numpy(), rtol=1e-4, atol=1e-5)
