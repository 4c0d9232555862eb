"""The workload: which requests a run sends (models, inputs, parameters, mix weights), when, and for how long.

A workload is a YAML or JSON file or the same thing built from command-line flags, so two runs of one workload can be
compared. Paths inside a file are relative to the file. Example:

    requests:
      - {model: mlp, weight: 3, parameters: {latency_ms: 20}}
      - model: cnn
        inputs: [{name: image, npy: images.npy, rows: 1}]
    load: {kind: poisson, rate: 50}
    duration_s: 30

With `sequence: FILE` (CSV rows `time_s,model`, see `adaserve.bench.traces`) the file, not the mix, picks each
request's model: request i goes to m_i, with the request kind listed for m_i (models not listed get the default
kind: random inputs from metadata, batch 1). `load: {kind: sequence, speedup: 10}` sends it at the file's times
ten times faster; `load: {kind: closed, concurrency: K}` sends it in order as fast as K clients allow. The sequence
is a bound: the run ends with its last row.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from adaserve.bench.codec import ModelInfo, Tensor
from adaserve.bench.schedules import ClosedSpec, LoadSpec, SequenceSpec, relative_to_file
from adaserve.config import DATATYPES

ParameterValue = bool | int | float | str


class WorkloadError(ValueError):
    """A workload that cannot be run; the message names the file or the request and what is wrong."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TensorInput(_Strict):
    """One input: random values of `shape`, or the array in an .npy file (`rows` at a time)."""

    name: str = Field(min_length=1)
    datatype: str | None = Field(default=None, description="datatype, e.g. FP32; default: the model's")
    shape: tuple[int, ...] | None = Field(default=None, description="full tensor shape, batch included")
    npy: Path | None = Field(default=None, description="a .npy file; its dtype gives the datatype")
    rows: int | None = Field(
        default=None, ge=1, description="with npy: send this many rows per request, cycling through the file"
    )

    _resolve_npy = field_validator("npy")(relative_to_file)

    @field_validator("datatype")
    @classmethod
    def _known_datatype(cls, value: str | None) -> str | None:
        if value is not None and value not in DATATYPES:
            raise ValueError(f"unknown datatype {value!r}; expected one of {', '.join(DATATYPES)}")
        return value

    @model_validator(mode="after")
    def _one_source(self) -> TensorInput:
        if (self.npy is None) == (self.shape is None):
            raise ValueError(f"input {self.name!r}: give either npy or shape")
        if self.shape is not None and any(d < 1 for d in self.shape):
            raise ValueError(f"input {self.name!r}: random data needs a shape of positive sizes")
        if self.rows is not None and self.npy is None:
            raise ValueError(f"input {self.name!r}: rows applies only to npy inputs")
        return self


class RequestSpec(_Strict):
    """One kind of request in the mix; the same model may appear twice with different parameters."""

    model: str = Field(min_length=1)
    version: str = ""
    weight: float = Field(default=1.0, gt=0, description="share of the requests, relative to the other kinds")
    inputs: tuple[TensorInput, ...] = Field(
        default=(), description="empty: random tensors shaped by the model's metadata, batch `batch`"
    )
    batch: int = Field(default=1, ge=1, description="batch size of the random inputs taken from metadata")
    outputs: tuple[str, ...] = Field(default=(), description="outputs to ask for; empty: all of them")
    parameters: dict[str, ParameterValue] = Field(default_factory=dict, description="per-request parameters")

    @property
    def label(self) -> str:
        """How the summary names this kind: its model, and what sets it apart (batch, parameters)."""
        batch = f" batch {self.batch}" if self.batch != 1 else ""
        parameters = " " + ", ".join(f"{k}={v}" for k, v in self.parameters.items()) if self.parameters else ""
        return f"{self.model}{batch}{parameters}"


class Workload(_Strict):
    """What to send, when, and the bound that ends the run."""

    requests: tuple[RequestSpec, ...] = Field(default=(), description="the mix; with a sequence, kinds by model")
    load: LoadSpec
    sequence: Path | None = Field(default=None, description="CSV of time_s,model rows: each request's model")
    duration_s: float | None = Field(default=None, gt=0, description="stop sending after this many seconds")
    max_requests: int | None = Field(default=None, ge=1, description="stop after sending this many requests")
    seed: int = Field(default=0, description="seeds the request mix and the random inputs")

    _resolve_sequence = field_validator("sequence")(relative_to_file)

    @model_validator(mode="after")
    def _bounded(self) -> Workload:
        if self.sequence is None:
            if not self.requests:
                raise ValueError("requests: give at least one request kind (or a sequence)")
            if isinstance(self.load, SequenceSpec):
                raise ValueError("load kind 'sequence' needs a sequence file")
            if self.duration_s is None and self.max_requests is None:
                raise ValueError("a run needs a bound: duration_s, max_requests or both")
        else:
            models = [spec.model for spec in self.requests]
            repeated = sorted({model for model in models if models.count(model) > 1})
            if repeated:
                raise ValueError(f"with a sequence, one request kind per model; {', '.join(repeated)} has several")
        return self

    @property
    def closed(self) -> bool:
        return isinstance(self.load, ClosedSpec)


def load_workload(path: Path) -> Workload:
    """Read and check a workload file (YAML or JSON)."""
    return parse_workload(read_workload_file(path), base=path.parent, source=str(path))


def read_workload_file(path: Path) -> dict[str, Any]:
    """The unchecked contents of a workload file, for callers that override some of it before checking."""
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise WorkloadError(f"{path}: cannot read workload: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        raise WorkloadError(f"{path}: not valid YAML or JSON: {exc}") from None
    if not isinstance(data, dict):
        raise WorkloadError(f"{path}: a workload is a mapping with requests, load and a bound")
    return data


def parse_workload(data: Any, *, base: Path | None = None, source: str = "workload") -> Workload:
    """Check a workload given as plain data; relative paths are taken from `base`."""
    try:
        return Workload.model_validate(data, context={"base": base})
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(map(str, error['loc'])) or 'workload'}: {error['msg']}" for error in exc.errors()
        )
        raise WorkloadError(f"{source}: {problems}") from None


def make_variants(spec: RequestSpec, info: ModelInfo, rng: np.random.Generator) -> list[list[Tensor]]:
    """The distinct input sets of one request kind; requests of that kind cycle through them."""
    known = {tensor.name: tensor for tensor in info.inputs}
    if not spec.inputs:
        return [[_random(meta.name, meta.datatype, (spec.batch, *meta.shape[1:]), rng) for meta in info.inputs]]
    unknown = [tensor.name for tensor in spec.inputs if tensor.name not in known]
    if unknown:
        raise WorkloadError(
            f"model {spec.model!r} has no input(s) {', '.join(unknown)}; it has {', '.join(known) or 'none'}"
        )
    columns = [_input_variants(tensor, known[tensor.name].datatype, rng) for tensor in spec.inputs]
    count = max(len(column) for column in columns)
    return [[column[i % len(column)] for column in columns] for i in range(count)]


def _input_variants(tensor: TensorInput, model_datatype: str, rng: np.random.Generator) -> list[Tensor]:
    if tensor.npy is None:
        assert tensor.shape is not None
        return [_random(tensor.name, tensor.datatype or model_datatype, tensor.shape, rng)]
    array = _read_npy(tensor.npy)
    datatype = next((name for name, dtype in DATATYPES.items() if dtype == array.dtype), None)
    if datatype is None:
        raise WorkloadError(f"{tensor.npy}: dtype {array.dtype} has no Open Inference Protocol datatype")
    if tensor.datatype is not None and tensor.datatype != datatype:
        raise WorkloadError(f"{tensor.npy}: holds {datatype} but the workload says {tensor.datatype}")
    if tensor.rows is None:
        return [Tensor(tensor.name, datatype, array.shape, array)]
    if array.ndim == 0 or len(array) < tensor.rows:
        raise WorkloadError(f"{tensor.npy}: has shape {array.shape}, fewer than rows={tensor.rows} rows")
    return [
        Tensor(tensor.name, datatype, chunk.shape, chunk)
        for start in range(0, len(array) - tensor.rows + 1, tensor.rows)
        for chunk in [np.ascontiguousarray(array[start : start + tensor.rows])]
    ]


def _read_npy(path: Path) -> np.ndarray:
    try:
        return np.asarray(np.load(path, allow_pickle=False))
    except (OSError, ValueError) as exc:
        raise WorkloadError(f"{path}: cannot read .npy input: {exc}") from None


def _random(name: str, datatype: str, shape: tuple[int, ...], rng: np.random.Generator) -> Tensor:
    if any(d < 1 for d in shape):
        raise WorkloadError(f"input {name!r}: cannot make random data of shape {list(shape)}; give --shape")
    if datatype not in DATATYPES:
        raise WorkloadError(f"input {name!r}: cannot make random {datatype} data; give it in an .npy file")
    dtype = DATATYPES[datatype]
    if dtype.kind == "f":
        values = rng.standard_normal(shape).astype(dtype)
    elif dtype.kind == "b":
        values = rng.integers(0, 2, shape).astype(dtype)
    else:
        values = rng.integers(0, 10, shape).astype(dtype)
    return Tensor(name, datatype, shape, values)
