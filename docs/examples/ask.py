"""Send a model on a running server one random batch and print what it answers: `python ask.py MODEL`."""

import sys

import numpy as np
import tritonclient.http as httpclient


def ask(model: str, url: str = "127.0.0.1:8000", rows: int = 2) -> tuple[list[np.ndarray], dict[str, np.ndarray]]:
    """The inputs sent (random floats, or integers below 100) and the outputs received, by name."""
    rng = np.random.default_rng(0)
    with httpclient.InferenceServerClient(url) as client:
        metadata = client.get_model_metadata(model)
        arrays, tensors = [], []
        for spec in metadata["inputs"]:
            shape = [rows, *spec["shape"][1:]]
            dtype = httpclient.triton_to_np_dtype(spec["datatype"])
            array = rng.integers(0, 100, shape) if np.issubdtype(dtype, np.integer) else rng.random(shape)
            arrays.append(array.astype(dtype))
            tensors.append(httpclient.InferInput(spec["name"], shape, spec["datatype"]))
            tensors[-1].set_data_from_numpy(arrays[-1])
        result = client.infer(model, tensors)
        return arrays, {spec["name"]: result.as_numpy(spec["name"]) for spec in metadata["outputs"]}


if __name__ == "__main__":
    inputs, outputs = ask(sys.argv[1])
    for name, values in outputs.items():
        print(name, values.tolist())
