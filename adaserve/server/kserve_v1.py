"""KServe's V1 protocol, TensorFlow Serving's REST predict API: its bodies, read into and written from the same
requests and responses as the Open Inference Protocol's.

`POST /v1/models/{model}:predict` takes one of TensorFlow Serving's two forms:

- row ("instances"): a list with one entry per batch row. A model with one input takes each row as it is, or as
  `{"<input>": row}`; a model with several takes `{"<input>": row, ...}` for each. Answered as `{"predictions":
  [...]}`, a row per instance: the output's row, or `{"<output>": row, ...}` for a model with several outputs.
- columnar ("inputs"): the whole batch, `{"inputs": tensor}` for one input or `{"inputs": {"<input>": tensor, ...}}`.
  Answered as `{"outputs": tensor}` or `{"outputs": {"<output>": tensor, ...}}`.

Values are checked as the V2 JSON form checks them (a string, a fraction for an integer type, a number out of range:
refused by name). `parameters` (an adaserve extension, as in V2: `latency_ms`, `accuracy`, `priority`, ...) passes
down, and the response's parameters, where a model sets them (a GATI exit, an SLO-NNs setting), come back beside
the predictions. `signature_name` may only name the one signature there is, `serving_default`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from adaserve.errors import InvalidInputError
from adaserve.server.protocol import (
    InferenceRequest,
    InferenceResponse,
    Tensor,
    array_from_values,
    refuse_shared_memory,
)
from adaserve.server.rest_codec import BOOLEAN_PARAMETERS, checked_parameters

__all__ = ["decode_predict", "encode_predict"]

#: The keys a predict body may have.
_KEYS = frozenset({"instances", "inputs", "signature_name", "parameters"})
#: TensorFlow Serving's name of a model's default signature, the only one a model has here.
DEFAULT_SIGNATURE = "serving_default"


def decode_predict(name: str, version: str, document: Any, metadata: dict[str, Any]) -> tuple[InferenceRequest, bool]:
    """The request a predict body asks for, given the model's metadata (its inputs' names and datatypes), and
    whether it came in the columnar form (which is answered in that form)."""
    if not isinstance(document, dict):
        raise InvalidInputError("a predict body must be a JSON object with 'instances' or 'inputs'")
    unknown = sorted(document.keys() - _KEYS)
    if unknown:
        raise InvalidInputError(f"predict body: unknown key(s) {unknown}; it takes {sorted(_KEYS)}")
    if ("instances" in document) == ("inputs" in document):
        raise InvalidInputError("a predict body needs exactly one of 'instances' (rows) and 'inputs' (columns)")
    signature = document.get("signature_name", DEFAULT_SIGNATURE)
    if signature != DEFAULT_SIGNATURE:
        raise InvalidInputError(f"signature_name {signature!r}: a model here has one signature, '{DEFAULT_SIGNATURE}'")
    names = [entry["name"] for entry in metadata["inputs"]]
    datatypes = {entry["name"]: entry["datatype"] for entry in metadata["inputs"]}
    columnar = "inputs" in document
    values = _columns(document["inputs"], names) if columnar else _rows(document["instances"], names)
    tensors = [_tensor(input_name, datatypes[input_name], values[input_name]) for input_name in names]
    parameters = checked_parameters(document.get("parameters"), "request")
    refuse_shared_memory("request", parameters)
    binary = sorted(BOOLEAN_PARAMETERS & parameters.keys())
    if binary:
        raise InvalidInputError(f"request: parameters {binary} ask for binary data; the V1 protocol answers in JSON")
    return InferenceRequest(model_name=name, model_version=version, inputs=tensors, parameters=parameters), columnar


def encode_predict(response: InferenceResponse, columnar: bool) -> dict[str, Any]:
    """`{"predictions": rows}` or, for the columnar form, `{"outputs": tensors}`; with the response's parameters."""
    tensors = {tensor.name: _values(tensor) for tensor in response.outputs}
    document: dict[str, Any]
    if columnar:
        document = {"outputs": next(iter(tensors.values())) if len(tensors) == 1 else tensors}
    elif len(tensors) == 1:
        document = {"predictions": next(iter(tensors.values()))}
    else:
        rows = len(response.outputs[0].data)
        document = {"predictions": [{name: values[row] for name, values in tensors.items()} for row in range(rows)]}
    if response.parameters:
        document["parameters"] = response.parameters
    return document


def _rows(instances: Any, names: list[str]) -> dict[str, list[Any]]:
    """Each input's rows out of the row form."""
    if not isinstance(instances, list) or not instances:
        raise InvalidInputError("'instances' must be a non-empty list, one entry per row")
    named = [isinstance(instance, dict) for instance in instances]
    if len(names) == 1 and not any(named):
        return {names[0]: instances}
    if not all(named):
        wanted = f"an object naming its inputs {names}" if len(names) > 1 else "the same form (a value or an object)"
        raise InvalidInputError(f"'instances': every instance must be {wanted}")
    for index, instance in enumerate(instances):
        if set(instance) != set(names):
            raise InvalidInputError(f"'instances'[{index}] names inputs {sorted(instance)}; the model takes {names}")
    return {name: [instance[name] for instance in instances] for name in names}


def _columns(inputs: Any, names: list[str]) -> dict[str, Any]:
    """Each input's whole tensor out of the columnar form."""
    if len(names) == 1 and not isinstance(inputs, dict):
        return {names[0]: inputs}
    if not isinstance(inputs, dict):
        raise InvalidInputError(f"'inputs' must be an object naming the model's inputs {names}")
    if set(inputs) != set(names):
        raise InvalidInputError(f"'inputs' names {sorted(inputs)}; the model takes {names}")
    return inputs


def _tensor(name: str, datatype: str, values: Any) -> Tensor:
    """A tensor whose shape is the nesting of its values (the model's config checks it, as for any request)."""
    try:
        shape = np.shape(values)
    except ValueError:  # numpy refuses lists whose rows differ in length
        raise InvalidInputError(f"input '{name}': its rows are not all the same shape") from None
    if not shape:
        raise InvalidInputError(f"input '{name}': a single value, not a batch of rows")
    return Tensor(name, datatype, shape, array_from_values(name, datatype, shape, values))


def _values(tensor: Tensor) -> Any:
    """An output as nested JSON lists (BYTES as strings: JSON has no bytes)."""
    if tensor.datatype == "BYTES":
        return np.vectorize(lambda item: item.decode(errors="replace"), otypes=[object])(tensor.data).tolist()
    return tensor.data.tolist()
