"""Workload files and the request variants built from them."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from adaserve.bench.codec import ModelInfo, TensorMeta
from adaserve.bench.schedules import SequenceSpec, TraceSpec
from adaserve.bench.workload import RequestSpec, WorkloadError, load_workload, make_variants, parse_workload

MLP = ModelInfo("mlp", (TensorMeta("image", "FP32", (-1, 784)),), (TensorMeta("logits", "FP32", (-1, 10)),))


def test_workload_file_with_two_models_parameters_and_relative_paths(tmp_path: Path) -> None:
    np.save(tmp_path / "images.npy", np.zeros((10, 784), np.float32))
    (tmp_path / "trace.csv").write_text("0\n1\n")
    (tmp_path / "w.yaml").write_text(
        "requests:\n"
        "  - {model: mlp, weight: 3, parameters: {latency_ms: 20, accuracy: 0.9, fast: true}}\n"
        "  - {model: cnn, inputs: [{name: image, npy: images.npy, rows: 2}]}\n"
        "load: {kind: trace, path: trace.csv, rate: 5}\n"
        "duration_s: 30\n"
    )
    workload = load_workload(tmp_path / "w.yaml")
    assert [r.model for r in workload.requests] == ["mlp", "cnn"]
    assert workload.requests[0].parameters == {"latency_ms": 20, "accuracy": 0.9, "fast": True}
    assert workload.requests[1].inputs[0].npy == tmp_path / "images.npy"
    assert isinstance(workload.load, TraceSpec) and workload.load.path == tmp_path / "trace.csv"


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"requests": [{"model": "m"}], "load": {"kind": "poisson", "rate": 1}}, "needs a bound"),
        ({"requests": [], "load": {"kind": "closed", "concurrency": 1}, "duration_s": 1}, "requests"),
        ({"requests": [{"model": "m"}], "load": {"kind": "warp"}, "duration_s": 1}, "load"),
        (
            {"requests": [{"model": "m", "colour": 1}], "load": {"kind": "closed", "concurrency": 1}, "duration_s": 1},
            "requests.0.colour: Extra inputs are not permitted",
        ),
        (
            {
                "requests": [{"model": "m", "inputs": [{"name": "x"}]}],
                "load": {"kind": "closed", "concurrency": 1},
                "duration_s": 1,
            },
            "give either npy or shape",
        ),
    ],
)
def test_bad_workloads_name_the_field(data: dict[str, object], message: str) -> None:
    with pytest.raises(WorkloadError, match=message):
        parse_workload(data, source="w.yaml")


def test_unreadable_workload_file(tmp_path: Path) -> None:
    (tmp_path / "w.yaml").write_text("requests: [\n")
    with pytest.raises(WorkloadError, match="not valid YAML"):
        load_workload(tmp_path / "w.yaml")
    with pytest.raises(WorkloadError, match="cannot read"):
        load_workload(tmp_path / "absent.yaml")


def test_inputs_from_metadata_are_random_of_the_batch_asked() -> None:
    variants = make_variants(RequestSpec(model="mlp", batch=4), MLP, np.random.default_rng(0))
    [[tensor]] = variants
    assert (tensor.name, tensor.datatype, tensor.shape, tensor.data.dtype) == ("image", "FP32", (4, 784), np.float32)


def test_npy_rows_make_one_variant_per_chunk(tmp_path: Path) -> None:
    data = np.arange(7 * 784, dtype=np.float32).reshape(7, 784)
    np.save(tmp_path / "x.npy", data)
    spec = parse_workload(
        {
            "requests": [{"model": "mlp", "inputs": [{"name": "image", "npy": "x.npy", "rows": 3}]}],
            "load": {"kind": "closed", "concurrency": 1},
            "max_requests": 1,
        },
        base=tmp_path,
    ).requests[0]
    variants = make_variants(spec, MLP, np.random.default_rng(0))
    assert len(variants) == 2
    np.testing.assert_array_equal(variants[1][0].data, data[3:6])


def test_shape_without_datatype_takes_the_models() -> None:
    spec = RequestSpec.model_validate({"model": "mlp", "inputs": [{"name": "image", "shape": [2, 784]}]})
    [[tensor]] = make_variants(spec, MLP, np.random.default_rng(0))
    assert tensor.datatype == "FP32" and tensor.shape == (2, 784)


def test_unknown_input_names_are_listed() -> None:
    spec = RequestSpec.model_validate({"model": "mlp", "inputs": [{"name": "pixels", "shape": [1, 784]}]})
    with pytest.raises(WorkloadError, match="has no input\\(s\\) pixels; it has image"):
        make_variants(spec, MLP, np.random.default_rng(0))


def test_npy_datatype_mismatch(tmp_path: Path) -> None:
    np.save(tmp_path / "x.npy", np.zeros((1, 784), np.float64))
    spec = RequestSpec.model_validate(
        {"model": "mlp", "inputs": [{"name": "image", "npy": str(tmp_path / "x.npy"), "datatype": "FP32"}]}
    )
    with pytest.raises(WorkloadError, match="holds FP64 but the workload says FP32"):
        make_variants(spec, MLP, np.random.default_rng(0))


def test_a_sequence_workload_needs_no_mix_and_no_bound(tmp_path: Path) -> None:
    (tmp_path / "w.yaml").write_text("sequence: requests.csv\nload: {kind: sequence, speedup: 60}\n")
    workload = load_workload(tmp_path / "w.yaml")
    assert workload.sequence == tmp_path / "requests.csv" and workload.requests == ()
    assert isinstance(workload.load, SequenceSpec) and workload.load.speedup == 60


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"requests": [{"model": "m"}], "load": {"kind": "sequence"}, "max_requests": 1}, "needs a sequence file"),
        (
            {"requests": [{"model": "m"}, {"model": "m"}], "load": {"kind": "sequence"}, "sequence": "s.csv"},
            "one request kind per model; m has several",
        ),
        ({"sequence": "s.csv", "load": {"kind": "sequence", "speedup": 0}}, "load.sequence.speedup"),
    ],
)
def test_bad_sequence_workloads_say_why(data: dict[str, object], message: str) -> None:
    with pytest.raises(WorkloadError, match=message):
        parse_workload(data)
