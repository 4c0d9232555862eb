"""The model repository in Triton's layout: `<root>/<name>/config.yaml` and `<root>/<name>/<version>/model.pt2|.pt`.

Discovery and validation happen here, in the server; loading the artifact (`load_artifact`) happens only inside
worker processes. Loading never unpickles arbitrary objects: workers run with `TORCH_FORCE_WEIGHTS_ONLY_LOAD=1`, so
even torch.export's pickle fallback is held to tensors, and TorchScript archives hold code, not pickled objects.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from adaserve.config import ModelConfig, load_config, load_document
from adaserve.errors import ConfigError, InvalidInputError, ModelNotFoundError
from adaserve.planner.spec import DagConfig

ARTIFACTS = {"model.pt2": "torch_export", "model.pt": "torchscript"}
CONFIG_FILE = "config.yaml"
#: A folder with this file instead of `config.yaml` holds a DAG query (`adaserve.planner`), not a model.
DAG_FILE = "dag.yaml"
#: Written beside a model by each load (`adaserve.engine.footprint`): what it measured, not how the model is served,
#: so it is no part of the model's fingerprint (else a load, writing it, would have the poller load the model again).
FOOTPRINT_FILE = "footprint.json"
#: The longest name a model or DAG query can have: its folder's, which Linux file systems cap at 255 bytes.
MAX_NAME_BYTES = 255
#: (name, size, modification time) of each file of a folder, by name.
Files = tuple[tuple[str, int, int], ...]
#: A model's files that decide how it is served: those at the top of its folder, and each version folder's.
Fingerprint = tuple[Files, tuple[tuple[str, Files], ...]]


@dataclass(frozen=True)
class ModelSpec:
    """A servable model version: its validated config and the artifact the workers load."""

    config: ModelConfig
    version: int
    artifact: Path
    versions: tuple[int, ...]  # every version on disk
    served: tuple[int, ...] = ()  # the versions the config's version_policy serves, ascending
    labels: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # output → class names (label_filename)

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def platform(self) -> str:
        return self.config.platform or ARTIFACTS[self.artifact.name]

    @property
    def directory(self) -> Path:
        return self.artifact.parent.parent


class ModelRepository:
    """A folder of models; re-read on every call, so models added on disk can be loaded without a restart."""

    def __init__(self, root: Path) -> None:
        if not root.is_dir():
            raise ConfigError(f"{root}: model repository is not a directory")
        self.root = root

    def names(self) -> list[str]:
        """The models."""
        return self._holding(CONFIG_FILE)

    def dag_names(self) -> list[str]:
        """The DAG queries (a folder with both files is a model, and its dag.yaml an error when read)."""
        return self._holding(DAG_FILE)

    def _holding(self, file: str) -> list[str]:
        return sorted(p.name for p in self.root.iterdir() if (p / file).is_file())

    def holds(self, name: str) -> bool:
        """Whether `name` is a model of the repository: one stat, for the request path (`names` lists them all)."""
        try:
            self._folder(name, CONFIG_FILE, "model")
        except (ModelNotFoundError, InvalidInputError):
            return False
        return True

    def _folder(self, name: str, file: str, kind: str) -> Path:
        """`name`'s folder, when `name` is a folder of the repository (no path in it) that holds `file`."""
        check_name(name)
        directory = self.root / name
        if not _is_file(directory / file):
            raise ModelNotFoundError(f"no {kind} named '{name}' in repository {self.root}")
        return directory

    def read_dag(self, name: str) -> DagConfig:
        """Validate a DAG query's definition; what it needs of the models is checked when it loads."""
        directory = self._folder(name, DAG_FILE, "DAG query")
        if _is_file(directory / CONFIG_FILE):
            raise ConfigError(f"{directory}: holds both {CONFIG_FILE} (a model) and {DAG_FILE} (a DAG query)")
        return load_document(directory / DAG_FILE, DagConfig, name=name)

    def read(self, name: str, version: int | None = None) -> ModelSpec:
        """Validate one model's config and find `version` (default: the newest its version_policy serves);
        ConfigError names what is wrong."""
        directory, config, versions, served, labels = self._describe(name)
        version = served[-1] if version is None else version
        if version not in served:
            raise ConfigError(f"{directory}: version {version} is not one its version_policy serves ({list(served)})")
        return self._spec(directory, config, version, versions, served, labels)

    def read_served(self, name: str) -> list[ModelSpec]:
        """Every version the model's version_policy serves, oldest first, its config and labels read once."""
        directory, config, versions, served, labels = self._describe(name)
        return [self._spec(directory, config, version, versions, served, labels) for version in served]

    def _describe(
        self, name: str
    ) -> tuple[Path, ModelConfig, tuple[int, ...], tuple[int, ...], dict[str, tuple[str, ...]]]:
        """The model's folder, validated config, version folders, the versions its policy serves, and its outputs'
        class names (`label_filename`)."""
        directory = self._folder(name, CONFIG_FILE, "model")
        config = load_config(directory / CONFIG_FILE, name=name)
        _check_cpus(config, directory / CONFIG_FILE)
        versions = tuple(sorted(int(p.name) for p in directory.iterdir() if p.is_dir() and is_version(p.name)))
        if not versions:
            raise ConfigError(f"{directory}: no version folder (expected {directory}/1/model.pt2 or model.pt)")
        try:
            served = config.version_policy.pick(versions)
        except ValueError as exc:
            raise ConfigError(f"{directory / CONFIG_FILE}: field 'version_policy': {exc}") from None
        return directory, config, versions, served, _read_labels(directory, config)

    @staticmethod
    def _spec(
        directory: Path,
        config: ModelConfig,
        version: int,
        versions: tuple[int, ...],
        served: tuple[int, ...],
        labels: dict[str, tuple[str, ...]],
    ) -> ModelSpec:
        artifact = _find_artifact(directory / str(version), config)
        return ModelSpec(config, version, artifact, versions, served, labels)

    def fingerprint(self, name: str) -> Fingerprint | None:
        """What on disk decides how `name` is served: the files at the top of its folder (the config, and those it
        names beside it: label files, Packrat's profile.json; not the footprint a load records) and the files of its
        version folders (name, size and modification time of each), or a DAG query's. None when it is neither now.
        Cheap enough to take for every model every few seconds; the poller compares them (`engine/poller.py`)."""
        directory = self.root / name
        try:
            entries = list(directory.iterdir())  # one listing for the files at the top and the version folders
            top = _stats(p for p in entries if not p.name.lstrip(".").startswith(FOOTPRINT_FILE))
            if not any(file == CONFIG_FILE for file, _, _ in top):
                return (top, ()) if any(file == DAG_FILE for file, _, _ in top) else None
            folders = sorted((p for p in entries if p.is_dir() and is_version(p.name)), key=lambda p: int(p.name))
            versions = tuple((folder.name, _stats(folder.iterdir())) for folder in folders)
        except OSError:  # gone, or going, as it is read
            return None
        return top, versions


def check_name(name: str) -> None:
    """InvalidInputError (a 400) for a name that no model or DAG query can have, as a request gives it: one folder
    of the repository, so no '/', no leading '.', no control character (a NUL raised "embedded null byte" from the
    file system: a 500), at most `MAX_NAME_BYTES` bytes."""
    if not name:
        problem = "it is empty"
    elif "/" in name or name.startswith("."):
        problem = "a name is one folder of the repository: no '/' and no leading '.'"
    elif any(ord(c) < 32 or 127 <= ord(c) < 160 for c in name):
        problem = "it holds a control character"
    elif len(name.encode("utf-8", "surrogateescape")) > MAX_NAME_BYTES:
        problem = f"it is longer than {MAX_NAME_BYTES} bytes"
    else:
        return
    raise InvalidInputError(f"{name!r} is not a model name: {problem}")


def is_version(text: str) -> bool:
    """Whether `text` is a version number: ASCII digits only ('²' is a digit to `str.isdigit`, not to `int`)."""
    return text.isascii() and text.isdigit()


def check_version(version: str) -> None:
    """InvalidInputError (a 400) for a requested version that is neither empty (the newest) nor a number."""
    if version and not is_version(version):
        raise InvalidInputError(f"version {version!r} is not a version number (the digits 0-9)")


def version_source(fingerprint: Fingerprint, version: int) -> tuple[object, ...]:
    """What one version's engine was started from, out of the model's fingerprint: the files at the top of the
    model's folder and that version's folder. Equal before and after a change: the change did not touch that
    version."""
    config, folders = fingerprint
    return config, dict(folders).get(str(version), ())


def _read_labels(directory: Path, config: ModelConfig) -> dict[str, tuple[str, ...]]:
    """Each output's class names from its `label_filename` (one a line, as Triton reads them); ConfigError naming
    a file that cannot be read."""
    labels = {}
    for output in config.outputs:
        if output.label_filename is None:
            continue
        path = directory / output.label_filename
        where = f"{directory / CONFIG_FILE}: output '{output.name}'"
        if not path.resolve().is_relative_to(directory.parent.resolve()):
            # Class names go back to clients: a link to /etc/passwd answered its lines as labels.
            raise ConfigError(
                f"{where}: label_filename {output.label_filename} links to {path.resolve()}, outside the model "
                "repository; class names are read only from files in it"
            )
        try:
            labels[output.name] = tuple(path.read_text().splitlines())
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"{where}: label_filename {output.label_filename}: {exc}") from None
    return labels


def _stats(entries: Iterable[Path]) -> Files:
    """(name, size, modification time) of each file among a folder's `entries`, by name."""
    stats = ((f.name, f.stat()) for f in entries if f.is_file())
    return tuple(sorted((name, st.st_size, st.st_mtime_ns) for name, st in stats))


def _is_file(path: Path) -> bool:
    """`Path.is_file`, also False for a name the file system refuses (a request's model name of thousands of
    characters raised "File name too long", a 500)."""
    try:
        return path.is_file()
    except OSError:
        return False


def _check_cpus(config: ModelConfig, path: Path) -> None:
    """The CPUs a configured worker is pinned to must be ones this process may use: read here, on the machine that
    serves the model, rather than in its start, where a missing one failed with a bare "Invalid argument"."""
    usable = os.sched_getaffinity(0)
    for index, worker in enumerate(config.workers if isinstance(config.workers, tuple) else ()):
        missing = sorted(set(worker.cpus or ()) - usable)
        if missing:
            raise ConfigError(
                f"{path}: field 'workers.{index}.cpus': CPUs {missing} are not available to this server "
                f"(it may use {sorted(usable)})"
            )


def _find_artifact(folder: Path, config: ModelConfig) -> Path:
    wanted = [f for f, platform in ARTIFACTS.items() if config.platform in (None, platform)]
    for filename in wanted:
        if (folder / filename).is_file():
            return folder / filename
    raise ConfigError(f"{folder}: no model file; expected one of {', '.join(wanted)}")


def read_artifact(path: Path, max_batch_size: int) -> Any:
    """The artifact as stored: a `torch.export.ExportedProgram` (batch dimension checked) or a TorchScript module.
    ConfigError naming the path on a corrupt or unfit file. GATI splits this object into blocks; `load_artifact`
    makes it callable whole."""
    import torch

    os.environ["TORCH_FORCE_WEIGHTS_ONLY_LOAD"] = "1"
    try:
        if path.suffix == ".pt2":
            program = torch.export.load(str(path))
            _check_batch_dimension(path, program, max_batch_size)
            return program
        return torch.jit.load(str(path), map_location="cpu").eval()
    except ConfigError:
        raise
    except Exception as exc:
        raise ConfigError(f"{path}: cannot load model: {type(exc).__name__}: {exc}") from exc


def load_artifact(path: Path, max_batch_size: int) -> Callable[..., Any]:
    """Load a model for execution (worker side). Raises ConfigError naming the path on a corrupt or unfit file."""
    return executable(read_artifact(path, max_batch_size))


def executable(artifact: Any) -> Callable[..., Any]:
    """The callable model of an artifact `read_artifact` returned."""
    import torch

    if not isinstance(artifact, torch.export.ExportedProgram):
        return artifact
    # The engine validates every input against the config before it reaches a worker, so the program's own per-call
    # input checks (about 100 µs a call on an MLP) are switched off.
    module: Any = artifact.module(check_guards=False)
    module.validate_inputs = False
    return module


def weight_bytes(module: Any) -> int:
    """Bytes held by a loaded model's parameters, buffers and constants (each storage counted once)."""
    import torch

    tensors = list(module.state_dict(keep_vars=True).values())
    tensors += [value for value in vars(module).values() if isinstance(value, torch.Tensor)]  # lifted constants
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors if t.numel()}
    return sum(storages.values())


def _check_batch_dimension(path: Path, program: Any, max_batch_size: int) -> None:
    """Every input must have been exported with a dynamic batch dimension that reaches `max_batch_size`."""
    placeholders = {node.name: node for node in program.graph.nodes if node.op == "placeholder"}
    for index, name in enumerate(program.graph_signature.user_inputs):
        batch = placeholders[name].meta["val"].shape[0]
        if isinstance(batch, int):
            raise ConfigError(
                f"{path}: input {index} was exported with a fixed batch size {batch}; export it with a dynamic "
                f"batch dimension (torch.export.Dim) up to max_batch_size {max_batch_size}"
            )
        upper = program.range_constraints[batch.node.expr].upper
        if upper < max_batch_size:
            raise ConfigError(
                f"{path}: input {index} was exported for batches up to {upper}, below max_batch_size {max_batch_size}"
            )


def append_config_block(directory: Path, key: str, block: str) -> None:
    """Append the top-level field `key: block` (YAML flow text) to the model's config.yaml, whose config has no
    `key` yet. Appended as text, so the file's comments and layout stay as written; ConfigError (and the file as it
    was) if the result would not read as the model's config."""
    path = directory / CONFIG_FILE
    text = path.read_text()
    ending = "" if text.endswith("\n") or not text else "\n"
    path.write_text(f"{text}{ending}{key}: {block}\n")
    try:
        load_config(path, name=directory.name)
    except ConfigError:
        path.write_text(text)
        raise
