"""A Packrat model behind a real `adaserve serve`: its entries in a serving repository, reloads, what it serves.

An entry links the exported artifact (and, for `workers: auto`, the stored profile) under a new name with its own
config, so the fat instance and Packrat's set are two models of one server, measured one request at a time.
"""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from adaserve.cpu.profiler import PROFILE_FILE
from adaserve.repository import ModelSpec
from benchmarks.common import DEFAULT_SET_ONLY
from tests.server_utils import ServerHandle

#: Longest wait for a model to (re)load: the host imports torch, every worker warms up on a full batch.
LOAD_TIMEOUT_S = 900.0


def link_model(spec: ModelSpec, repository: Path, name: str, overrides: dict[str, Any]) -> Path:
    """An entry `name` in `repository` serving `spec`'s artifact and profile with `spec`'s config and `overrides`.
    An entry with no `workers` serves the default set throughout: no profile linked, none measured meanwhile."""
    directory = repository / name
    (directory / str(spec.version)).mkdir(parents=True, exist_ok=True)
    artifact = directory / str(spec.version) / spec.artifact.name
    artifact.unlink(missing_ok=True)
    artifact.symlink_to(spec.artifact.resolve())
    profile = directory / PROFILE_FILE
    profile.unlink(missing_ok=True)
    if "workers" not in overrides:
        overrides = {**overrides, "packrat": {**overrides.get("packrat", {}), **DEFAULT_SET_ONLY}}
    elif (spec.directory / PROFILE_FILE).exists():
        profile.symlink_to((spec.directory / PROFILE_FILE).resolve())
    write_entry_config(directory, spec, overrides)
    return directory


def write_entry_config(directory: Path, spec: ModelSpec, overrides: dict[str, Any]) -> dict[str, Any]:
    config = {**spec.config.model_dump(mode="json", exclude_defaults=True), **overrides, "name": directory.name}
    config["max_batch_size"] = overrides.get("max_batch_size", spec.config.max_batch_size)
    (directory / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    return config


def reload(server: ServerHandle, repository: Path, spec: ModelSpec, name: str, overrides: dict[str, Any]) -> None:
    """Rewrite an entry's config and load it again through the repository API (blocks until it serves)."""
    write_entry_config(repository / name, spec, overrides)
    repository_call(server, name, "load")


def repository_call(server: ServerHandle, name: str, action: str) -> None:
    """Triton's repository API: `load` (again, from the config on disk) or `unload` an entry; blocks until done."""
    request = urllib.request.Request(
        f"http://{server.http_url}/v2/repository/models/{name}/{action}", data=b"{}", method="POST"
    )
    with urllib.request.urlopen(request, timeout=LOAD_TIMEOUT_S):
        pass


def served_worker_set(server: ServerHandle, name: str) -> dict[str, Any]:
    """The running worker set and why it was chosen, from the model configuration endpoint."""
    with urllib.request.urlopen(f"http://{server.http_url}/v2/models/{name}/config", timeout=10) as response:
        document = json.load(response)
    return dict(json.loads(document["parameters"]["worker_set"]["string_value"]))


def model_stats(server: ServerHandle, name: str) -> dict[str, Any]:
    """The model's statistics (Triton's format: inference and per-batch-size compute counts and times)."""
    with urllib.request.urlopen(f"http://{server.http_url}/v2/models/{name}/stats", timeout=10) as response:
        return dict(json.load(response)["model_stats"][0])


def request_bytes(spec: ModelSpec, rows: int) -> int:
    """A body limit that admits one request of `rows` rows in binary form, with room for the JSON header."""
    return rows * sum(t.row_bytes for t in spec.config.inputs) + (1 << 20)
