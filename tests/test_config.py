"""Model configs: defaults, and errors that name the file, the field and the problem."""

from __future__ import annotations

import re
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import pytest
import yaml

from adaserve.config import ModelConfig, WorkerSpec, load_config
from adaserve.errors import ConfigError


def tensor(name: str, *row_shape: int, datatype: str = "FP32") -> dict[str, Any]:
    return {"name": name, "datatype": datatype, "shape": [-1, *row_shape]}


def minimal(**overrides: Any) -> dict[str, Any]:
    """The smallest valid config, with fields replaced or added."""
    return {"inputs": [tensor("x", 4)], "outputs": [tensor("y", 2)], **overrides}


def write(tmp_path: Path, content: dict[str, Any] | str, name: str = "mlp") -> Path:
    """`<tmp>/<name>/config.yaml` holding `content` (a mapping, dumped as YAML, or the file's text)."""
    path = tmp_path / name / "config.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(content if isinstance(content, str) else yaml.safe_dump(content))
    return path


def load(tmp_path: Path, content: dict[str, Any] | str) -> ModelConfig:
    return load_config(write(tmp_path, content), name="mlp")


def config_error(path: Path, problem: str) -> AbstractContextManager[pytest.ExceptionInfo[ConfigError]]:
    """Expect a ConfigError whose message is `<path>: ` and then matches `problem` (a regex)."""
    return pytest.raises(ConfigError, match=rf"^{re.escape(str(path))}: {problem}")


def batches(config: ModelConfig) -> list[int]:
    return [w.batch for w in config.worker_set]


# -- defaults --------------------------------------------------------------------------------------------------


@pytest.fixture
def sixteen_cpus(monkeypatch: pytest.MonkeyPatch) -> None:
    """A 16-CPU affinity: the busy-thread limit's default (15) leaves Ebird's six default workers whole."""
    monkeypatch.setattr("adaserve.config.os.sched_getaffinity", lambda _pid: set(range(16)))


def test_defaults(tmp_path: Path, sixteen_cpus: None) -> None:
    config = load(tmp_path, minimal())
    assert config.name == "mlp"  # from the directory
    assert (config.platform, config.max_batch_size, config.max_queue_size) == (None, 16, 1024)
    assert (config.batching.policy, config.batching.max_queue_delay_us) == ("elastic", 1000)
    assert config.batching.idle_spin_us == 5000
    assert config.batching.max_busy_threads_saturated is None  # off
    assert config.batching.share_cores is True
    assert config.workers is None and config.parameters == {}
    assert batches(config) == [1, 1, 2, 4, 8, 16]
    assert all(w.threads == 1 and w.cpus is None for w in config.worker_set)
    assert config.inflight_limit == 32


@pytest.mark.parametrize(
    ("max_batch_size", "expected"),
    [
        (1, [1, 1]),
        (2, [1, 1, 2]),
        (4, [1, 1, 2, 4]),
        (16, [1, 1, 2, 4, 8, 16]),
        (32, [1, 1, 2, 4, 8, 16]),  # Ebird §VI-C: s = 32 keeps (1, 1, 2, 4, 8, 16)
        (64, [1, 1, 2, 4, 8, 16]),
    ],
)
def test_default_workers_are_ebirds_granularities_capped(
    max_batch_size: int, expected: list[int], sixteen_cpus: None
) -> None:
    config = ModelConfig.model_validate(minimal(name="m", max_batch_size=max_batch_size))
    assert batches(config) == expected
    assert config.inflight_limit == sum(expected)


@pytest.mark.parametrize(
    ("cpus", "batching", "device", "expected"),
    [
        (2, {}, "cpu", [16]),  # one CPU for the frontend, one busy worker: the one that takes any batch
        (4, {}, "cpu", [4, 8, 16]),
        (2, {"max_busy_threads": 2}, "cpu", [8, 16]),
        (2, {"max_busy_threads": 0}, "cpu", [1, 1, 2, 4, 8, 16]),  # no limit: all may compute at once
        (2, {}, "cuda", [1, 1, 2, 4, 8, 16]),  # a stream each, no busy-thread limit by default
    ],
)
def test_default_workers_are_as_many_as_may_compute_at_once(
    cpus: int, batching: dict[str, int], device: str, expected: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("adaserve.config.os.sched_getaffinity", lambda _pid: set(range(cpus)))
    config = ModelConfig.model_validate(minimal(name="m", batching=batching, device=device))
    assert batches(config) == expected
    assert config.inflight_limit == sum(expected)


def test_configured_workers_replace_the_default(tmp_path: Path) -> None:
    config = load(
        tmp_path, minimal(max_batch_size=8, workers=[{"batch": 8, "threads": 2, "cpus": [0, 1]}, {"batch": 2}])
    )
    assert config.worker_set == (WorkerSpec(batch=8, threads=2, cpus=(0, 1)), WorkerSpec(batch=2))
    assert config.inflight_limit == 10


def test_max_inflight_overrides_the_sum(tmp_path: Path) -> None:
    assert load(tmp_path, minimal(max_inflight=5)).inflight_limit == 5


def test_tensor_sizes() -> None:
    config = ModelConfig.model_validate(
        minimal(name="m", inputs=[tensor("ids", 2, 3, datatype="INT64"), tensor("flag", datatype="BOOL")])
    )
    ids, flag = config.inputs
    assert (ids.row_shape, ids.row_bytes) == ((2, 3), 48)
    assert (flag.row_shape, flag.row_bytes) == ((), 1)


def test_config_name_matching_its_directory_is_accepted(tmp_path: Path) -> None:
    assert load(tmp_path, minimal(name="mlp")).name == "mlp"


def test_without_a_directory_name_the_file_must_name_the_model(tmp_path: Path) -> None:
    path = write(tmp_path, minimal())
    with pytest.raises(ConfigError, match=r"field 'name': Field required"):
        load_config(path)
    assert load_config(write(tmp_path, minimal(name="other"))).name == "other"


# -- errors ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("content", "field", "problem"),
    [
        (minimal(max_batch_sise=8), "max_batch_sise", "unknown field"),
        (minimal(batching={"policy": "elastic", "delay": 3}), "batching.delay", "unknown field"),
        (minimal(inputs=[tensor("x", 4, datatype="FP8")]), "inputs.0.datatype", "unknown datatype 'FP8'"),
        (minimal(outputs=[{"name": "y", "datatype": "FP32", "shape": [2, -1]}]), "outputs.0.shape", "must be -1"),
        (minimal(inputs=[{"name": "x", "datatype": "FP32", "shape": []}]), "inputs.0.shape", "must be -1"),
        (minimal(inputs=[tensor("x", 3, -1)]), "inputs.0.shape", "fixed positive sizes"),
        (minimal(inputs=[tensor("x", 0)]), "inputs.0.shape", "fixed positive sizes"),
        (minimal(max_batch_size=4, workers=[{"batch": 1}, {"batch": 8}]), "workers", "exceeds max_batch_size 4"),
        (minimal(workers=[{"batch": 0}]), "workers.0.batch", "greater than or equal to 1"),
        (minimal(batching={"policy": "dynamic"}), "batching.policy", "'elastic', 'fixed-timeout' or 'none'"),
        (minimal(inputs=[]), "inputs", "at least 1 item"),
        ({"outputs": [tensor("y", 2)]}, "inputs", "Field required"),
        (minimal(max_inflight=0), "max_inflight", "greater than or equal to 1"),
        (minimal(device="gpu"), "device", "'cpu' or 'cuda'"),
        (minimal(device="cuda", workers="auto"), "device", "cuda does not serve workers: auto (Packrat"),
        (minimal(device="cuda", caches={"lookup": "process"}), "device", "process is the CPU's"),
        (minimal(caches={"lookup": "stream"}), "device", "lookup: stream runs lookups on a CUDA side stream; it needs"),
        (minimal(max_batch_size=8, max_queue_size=4), "max_queue_size", "4 is below max_batch_size 8: a request of"),
        (minimal(workers=[{"batch": 1, "cpus": []}]), "workers.0.cpus", "name at least one CPU, or leave cpus out"),
        (
            minimal(batching={"priority_levels": 2, "default_priority_level": 3}),
            "batching.default_priority_level",
            "default_priority_level 3 is not one of the 2 priority_levels",
        ),
        (
            minimal(batching={"priority_levels": 2, "priority_queue_policy": {3: {"max_queue_size": 4}}}),
            "batching.priority_queue_policy",
            "level 3 is not one of the 2 priority_levels",
        ),
        (
            minimal(batching={"priority_queue_policy": {1: {}}}),
            "batching.priority_queue_policy",
            "level 1 is not one of the 0 priority_levels",
        ),
        (minimal(batching={"idle_spin_us": -1}), "batching.idle_spin_us", "greater than or equal to 0"),
        (
            minimal(batching={"max_busy_threads_saturated": 0}),
            "batching.max_busy_threads_saturated",
            "greater than or equal to 1",
        ),
        (
            minimal(batching={"default_queue_policy": {"timeout_action": "drop"}}),
            "batching.default_queue_policy.timeout_action",
            "'reject' or 'delay'",
        ),
        (minimal(version_policy={"latest": 2, "all": True}), "version_policy", "name one of latest, all and specific"),
        (minimal(version_policy={"latest": 0}), "version_policy.latest", "greater than or equal to 1"),
        (
            minimal(version_policy={"all": True}, caches={}),
            "version_policy",
            "learned caches and node activators are built for one version of a model",
        ),
    ],
    ids=[
        "unknown-field",
        "unknown-nested-field",
        "datatype",
        "batch-not-first",
        "no-dimensions",
        "variable-dimension",
        "zero-dimension",
        "worker-batch",
        "worker-batch-zero",
        "policy",
        "no-inputs",
        "missing-inputs",
        "max-inflight",
        "device",
        "cuda-packrat",
        "cuda-caches-thread",
        "cpu-caches-stream",
        "queue-below-a-batch",
        "no-cpus",
        "default-priority-above-levels",
        "queue-policy-of-an-unknown-level",
        "queue-policy-without-levels",
        "negative-idle-spin",
        "saturated-busy-threads-zero",
        "queue-policy-action",
        "version-policy-two-forms",
        "version-policy-latest-zero",
        "version-policy-with-caches",
    ],
)
def test_error_names_file_field_and_problem(tmp_path: Path, content: dict[str, Any], field: str, problem: str) -> None:
    path = write(tmp_path, content)
    with pytest.raises(ConfigError) as caught:
        load_config(path, name="mlp")
    message = str(caught.value)
    assert message.startswith(f"{path}: ")
    assert field in message
    assert problem in message


@pytest.mark.parametrize("graphs", [True, False])
@pytest.mark.parametrize(("asked", "where"), [({}, "inline"), ({"lookup": "stream"}, "stream")])
def test_learned_caches_on_cuda_look_up_inline_or_on_a_side_stream(
    tmp_path: Path, asked: dict[str, str], where: str, graphs: bool
) -> None:
    """With CUDA graphs or without: each segment between two exits is then a graph of its own."""
    config = load(tmp_path, minimal(device="cuda", cuda_graphs=graphs, caches=asked))
    assert config.caches is not None and config.caches.lookup_at == where and config.cuda_graphs == graphs


@pytest.mark.parametrize("twice", ["x", "y"])
def test_duplicate_tensor_names(tmp_path: Path, twice: str) -> None:
    path = write(tmp_path, minimal(outputs=[tensor("y", 2), tensor(twice, 4)]))
    with config_error(path, rf".*tensor names must be unique; repeated: {twice}$"):
        load_config(path, name="mlp")


def test_every_problem_is_reported_at_once(tmp_path: Path) -> None:
    path = write(tmp_path, minimal(inputs=[tensor("x", 4, datatype="FP8")], colour="red"))
    with pytest.raises(ConfigError) as caught:
        load_config(path, name="mlp")
    assert "field 'inputs.0.datatype'" in str(caught.value)
    assert "field 'colour': unknown field" in str(caught.value)


def test_name_mismatching_its_directory(tmp_path: Path) -> None:
    path = write(tmp_path, minimal(name="resnet"))
    with config_error(path, r"field 'name': 'resnet' does not match its directory 'mlp'$"):
        load_config(path, name="mlp")


@pytest.mark.parametrize(("text", "kind"), [("- a\n- b\n", "list"), ("just a string\n", "str"), ("42\n", "int")])
def test_yaml_that_is_not_a_mapping(tmp_path: Path, text: str, kind: str) -> None:
    path = write(tmp_path, text)
    with config_error(path, rf"expected a mapping at the top level, got {kind}$"):
        load_config(path, name="mlp")


def test_invalid_yaml(tmp_path: Path) -> None:
    path = write(tmp_path, "inputs: [unclosed\n")
    with config_error(path, r"not valid YAML"):
        load_config(path, name="mlp")


def test_empty_file_reports_the_missing_fields(tmp_path: Path) -> None:
    path = write(tmp_path, "")
    with config_error(path, r"field 'inputs': Field required; field 'outputs': Field required$"):
        load_config(path, name="mlp")


def test_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "absent" / "config.yaml"
    with config_error(path, r"cannot read"):
        load_config(path)


def test_config_is_frozen() -> None:
    config = ModelConfig.model_validate(minimal(name="m"))
    with pytest.raises(ValueError, match="frozen"):
        config.max_batch_size = 4
