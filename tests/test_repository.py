"""The model repository: discovery, versions, artifact checks, and loading torch.export programs."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from torch import nn

from adaserve.errors import ConfigError, InvalidInputError, ModelNotFoundError
from adaserve.repository import ModelRepository, append_config_block, load_artifact

MAX_BATCH = 8


def add_model(
    root: Path, name: str, versions: tuple[int | str, ...] = (1,), artifact: str = "model.pt2", **fields: Any
) -> Path:
    """`<root>/<name>/config.yaml` and a placeholder artifact in each version folder (read() does not load it)."""
    directory = root / name
    directory.mkdir(parents=True)
    config = {
        "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 3]}],
        "outputs": [{"name": "y", "datatype": "FP32", "shape": [-1, 2]}],
        **fields,
    }
    (directory / "config.yaml").write_text(yaml.safe_dump(config))
    for version in versions:
        (directory / str(version)).mkdir()
        (directory / str(version) / artifact).write_bytes(b"placeholder")
    return directory


@pytest.fixture
def root(tmp_path: Path) -> Path:
    path = tmp_path / "models"
    path.mkdir()
    return path


def escaped(path: Path) -> str:
    return re.escape(str(path))


# -- discovery -------------------------------------------------------------------------------------------------


def test_names_lists_only_folders_with_a_config(root: Path) -> None:
    add_model(root, "mlp")
    add_model(root, "cnn", versions=())
    (root / "not_a_model").mkdir()
    (root / "not_a_model" / "1").mkdir()
    (root / "README.md").write_text("notes")
    (root / "config.yaml").write_text("a stray file at the top")
    assert ModelRepository(root).names() == ["cnn", "mlp"]


def test_models_added_on_disk_are_seen_without_a_new_repository(root: Path) -> None:
    repository = ModelRepository(root)
    assert repository.names() == []
    add_model(root, "late")
    assert repository.names() == ["late"]
    assert repository.read("late").version == 1


def test_root_must_be_a_directory(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=rf"^{escaped(tmp_path / 'nowhere')}: model repository is not a directory"):
        ModelRepository(tmp_path / "nowhere")


def test_read_picks_the_newest_numeric_version(root: Path) -> None:
    directory = add_model(root, "mlp", versions=(1, 2, 10), max_batch_size=4)
    (directory / "latest").mkdir()  # not a version
    (directory / "11").write_text("a file, not a version folder")
    spec = ModelRepository(root).read("mlp")
    assert (spec.version, spec.versions) == (10, (1, 2, 10))  # 10 is newer than 2, though it sorts before it as text
    assert spec.artifact == directory / "10" / "model.pt2"
    assert (spec.name, spec.platform, spec.directory) == ("mlp", "torch_export", directory)
    assert spec.config.max_batch_size == 4


@pytest.mark.parametrize(
    ("policy", "served"),
    [(None, (10,)), ({"latest": 2}, (2, 10)), ({"all": True}, (1, 2, 10)), ({"specific": [2, 1]}, (1, 2))],
)
def test_the_version_policy_picks_the_versions_served(root: Path, policy: Any, served: tuple[int, ...]) -> None:
    """Triton's version_policy; the default spec is the newest version served, and each served one can be read."""
    add_model(root, "mlp", versions=(1, 2, 10), **({"version_policy": policy} if policy else {}))
    repository = ModelRepository(root)
    spec = repository.read("mlp")
    assert (spec.served, spec.version) == (served, served[-1])
    assert [repository.read("mlp", v).artifact.parent.name for v in served] == [str(v) for v in served]
    assert repository.read_served("mlp") == [repository.read("mlp", v) for v in served]


def test_a_version_the_policy_does_not_serve_or_that_has_no_folder_is_refused_by_name(root: Path) -> None:
    add_model(root, "mlp", versions=(1, 2))
    with pytest.raises(ConfigError, match=r"version 1 is not one its version_policy serves \(\[2\]\)"):
        ModelRepository(root).read("mlp", 1)
    add_model(root, "pinned", versions=(1, 2), version_policy={"specific": [2, 3]})
    with pytest.raises(ConfigError, match=r"field 'version_policy': version_policy names versions \[3\] that have no"):
        ModelRepository(root).read("pinned")


def test_torchscript_artifact_sets_the_platform(root: Path) -> None:
    directory = add_model(root, "ts", artifact="model.pt")
    spec = ModelRepository(root).read("ts")
    assert (spec.artifact, spec.platform) == (directory / "1" / "model.pt", "torchscript")


def test_export_is_preferred_when_both_artifacts_exist(root: Path) -> None:
    directory = add_model(root, "both")
    (directory / "1" / "model.pt").write_bytes(b"placeholder")
    assert ModelRepository(root).read("both").artifact.name == "model.pt2"


def test_configured_platform_picks_its_artifact(root: Path) -> None:
    directory = add_model(root, "both", platform="torchscript")
    (directory / "1" / "model.pt").write_bytes(b"placeholder")
    spec = ModelRepository(root).read("both")
    assert (spec.artifact.name, spec.platform) == ("model.pt", "torchscript")


# -- errors ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["absent", "not_a_model", "m" * 255])
def test_unknown_model(root: Path, name: str) -> None:
    (root / "not_a_model").mkdir()
    with pytest.raises(
        ModelNotFoundError, match=rf"^no model named '{re.escape(name)}' in repository {escaped(root)}$"
    ):
        ModelRepository(root).read(name)


@pytest.mark.parametrize(
    ("name", "problem"),
    [
        ("../models", "a name is one folder of the repository"),
        ("a/b", "a name is one folder of the repository"),
        (".hidden", "a name is one folder of the repository: no '/' and no leading '.'"),
        ("m" * 3000, "it is longer than 255 bytes"),
        ("\x00", "it holds a control character"),
        ("", "it is empty"),
    ],
)
def test_a_name_no_model_can_have_is_the_clients_error(root: Path, name: str, problem: str) -> None:
    """A 400, not a 404 or (a NUL reaching the file system) a 500."""
    add_model(root, ".hidden")
    with pytest.raises(InvalidInputError, match=re.escape(f"{name!r} is not a model name: {problem}")):
        ModelRepository(root).read(name)


def test_missing_version_folder(root: Path) -> None:
    directory = add_model(root, "mlp", versions=())
    (directory / "v1").mkdir()
    with pytest.raises(ConfigError, match=rf"^{escaped(directory)}: no version folder"):
        ModelRepository(root).read("mlp")


def test_missing_artifact_in_the_newest_version(root: Path) -> None:
    directory = add_model(root, "mlp", versions=(1,))
    (directory / "2").mkdir()
    with pytest.raises(
        ConfigError, match=rf"^{escaped(directory / '2')}: no model file; expected one of model.pt2, model.pt$"
    ):
        ModelRepository(root).read("mlp")


def test_artifact_of_the_other_platform_is_not_taken(root: Path) -> None:
    directory = add_model(root, "mlp", platform="torchscript")
    with pytest.raises(ConfigError, match=rf"^{escaped(directory / '1')}: no model file; expected one of model.pt$"):
        ModelRepository(root).read("mlp")


def test_invalid_config_names_its_file(root: Path) -> None:
    directory = add_model(root, "mlp", max_batch_size=0)
    with pytest.raises(ConfigError, match=rf"^{escaped(directory / 'config.yaml')}: field 'max_batch_size'"):
        ModelRepository(root).read("mlp")


def test_a_worker_pinned_to_a_cpu_this_server_may_not_use_is_refused_naming_it(root: Path) -> None:
    """Checked where the model is read to be served, not in the config's types (plans for other machines use
    them); before, the worker's start failed with a bare "Invalid argument"."""
    usable = sorted(os.sched_getaffinity(0))
    absent = max(usable) + 1
    directory = add_model(root, "mlp", workers=[{"batch": 1, "cpus": usable[:1]}, {"batch": 1, "cpus": [absent]}])
    message = f"field 'workers.1.cpus': CPUs [{absent}] are not available to this server (it may use {usable})"
    with pytest.raises(ConfigError, match=rf"^{escaped(directory / 'config.yaml')}: {re.escape(message)}$"):
        ModelRepository(root).read("mlp")


# -- loading artifacts (worker side) ---------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def restore_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """load_artifact sets TORCH_FORCE_WEIGHTS_ONLY_LOAD for its whole process; undo it after each test."""
    monkeypatch.setenv("TORCH_FORCE_WEIGHTS_ONLY_LOAD", "1")  # what a worker runs with; the old value comes back


class Affine(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.linear = nn.Linear(3, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x).tanh()


class TwoInputs(nn.Module):
    """The second input is reduced over its batch, so it can be exported with a fixed batch of its own."""

    def forward(self, x: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
        return x * table.sum(0)


def export(path: Path, module: nn.Module, *examples: torch.Tensor, dynamic: Any = None) -> Path:
    torch.export.save(torch.export.export(module.eval(), examples, dynamic_shapes=dynamic), str(path))
    return path


@pytest.fixture(scope="module")
def programs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Tiny torch.export programs, exported once for the module."""
    folder = tmp_path_factory.mktemp("programs")
    x = torch.randn(4, 3)

    def batch(upper: int | None) -> Any:
        return torch.export.Dim("batch", min=1, max=upper)

    return {
        "good": export(folder / "good.pt2", Affine(), x, dynamic=({0: batch(MAX_BATCH)},)),
        "unbounded": export(folder / "unbounded.pt2", Affine(), x, dynamic=({0: batch(None)},)),
        "fixed": export(folder / "fixed.pt2", Affine(), x),
        "small": export(folder / "small.pt2", Affine(), x, dynamic=({0: batch(MAX_BATCH // 2)},)),
        "second_fixed": export(
            folder / "second.pt2", TwoInputs(), x, torch.randn(5, 3), dynamic=({0: batch(MAX_BATCH)}, None)
        ),
    }


def test_a_good_program_computes_what_eager_does(programs: dict[str, Path]) -> None:
    module = load_artifact(programs["good"], MAX_BATCH)
    eager = Affine().eval()
    for rows in (1, 2, 5, MAX_BATCH):
        x = torch.randn(rows, 3)
        with torch.no_grad():
            torch.testing.assert_close(module(x), eager(x))


@pytest.mark.parametrize(("program", "max_batch_size"), [("good", MAX_BATCH // 2), ("unbounded", 4096)])
def test_a_program_may_allow_more_than_max_batch_size(
    programs: dict[str, Path], program: str, max_batch_size: int
) -> None:
    module = load_artifact(programs[program], max_batch_size)
    assert module(torch.ones(3, 3)).shape == (3, 2)


def test_program_exported_with_a_fixed_batch(programs: dict[str, Path]) -> None:
    path = programs["fixed"]
    message = rf"^{escaped(path)}: input 0 was exported with a fixed batch size 4; export it with a dynamic"
    with pytest.raises(ConfigError, match=message):
        load_artifact(path, MAX_BATCH)


def test_every_input_needs_a_dynamic_batch(programs: dict[str, Path]) -> None:
    path = programs["second_fixed"]
    with pytest.raises(ConfigError, match=rf"^{escaped(path)}: input 1 was exported with a fixed batch size 5"):
        load_artifact(path, MAX_BATCH)


def test_program_exported_for_smaller_batches_than_max_batch_size(programs: dict[str, Path]) -> None:
    path = programs["small"]
    message = rf"^{escaped(path)}: input 0 was exported for batches up to 4, below max_batch_size {MAX_BATCH}$"
    with pytest.raises(ConfigError, match=message):
        load_artifact(path, MAX_BATCH)
    assert load_artifact(path, MAX_BATCH // 2)(torch.ones(4, 3)).shape == (4, 2)


@pytest.mark.parametrize("content", [b"", b"this is not a torch.export archive", b"PK\x03\x04 truncated zip"])
def test_corrupt_program(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "model.pt2"
    path.write_bytes(content)
    with pytest.raises(ConfigError, match=rf"^{escaped(path)}: cannot load model: "):
        load_artifact(path, MAX_BATCH)


@pytest.mark.filterwarnings(r"ignore:`torch\.jit\.load` is deprecated:DeprecationWarning")
def test_corrupt_torchscript(tmp_path: Path) -> None:
    path = tmp_path / "model.pt"
    path.write_bytes(b"not an archive")
    with pytest.raises(ConfigError, match=rf"^{escaped(path)}: cannot load model: RuntimeError"):
        load_artifact(path, MAX_BATCH)


def test_missing_program(tmp_path: Path) -> None:
    path = tmp_path / "model.pt2"
    with pytest.raises(ConfigError, match=rf"^{escaped(path)}: cannot load model: "):
        load_artifact(path, MAX_BATCH)


# -- adding to a config ----------------------------------------------------------------------------------------


def test_a_block_is_appended_as_text_and_a_bad_one_leaves_the_file_as_it_was(root: Path) -> None:
    directory = add_model(root, "m")
    path = directory / "config.yaml"
    path.write_text("# kept as written\n" + path.read_text().rstrip("\n"))  # no final newline
    append_config_block(directory, "activator", "{}")
    assert path.read_text().startswith("# kept as written\n") and path.read_text().endswith("\nactivator: {}\n")
    assert ModelRepository(root).read("m").config.activator is not None
    written = path.read_text()
    with pytest.raises(ConfigError, match="max_batch_size"):
        append_config_block(directory, "max_batch_size", "-3")
    assert path.read_text() == written
