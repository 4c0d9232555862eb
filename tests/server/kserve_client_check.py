"""Run by `test_kserve_client.py` in KServe's own venv (`benchmarks/foreign_env.sh kserve-client`): KServe 0.14's
Python clients, unmodified, against a running adaserve. Prints one JSON object of what each call returned.

    kserve_client_check.py HTTP_URL GRPC_URL MODEL INPUT.npy
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

import numpy as np
from kserve import InferenceGRPCClient, InferenceRESTClient, InferInput, InferRequest, RESTConfig
from kserve.protocol.infer_type import RequestedOutput


def request(model: str, rows: np.ndarray, request_id: str, binary: bool = False) -> InferRequest:
    """JSON tensors, or with `binary` the binary tensor data extension both ways."""
    tensor = InferInput(name="image", shape=list(rows.shape), datatype="FP32")
    tensor.set_data_from_numpy(rows, binary_data=binary)
    outputs = [RequestedOutput("logits", {"binary_data": True})] if binary else None
    return InferRequest(model_name=model, infer_inputs=[tensor], request_id=request_id, request_outputs=outputs)


async def main(http_url: str, grpc_url: str, model: str, rows: np.ndarray) -> dict[str, Any]:
    base = f"http://{http_url}"
    found: dict[str, Any] = {}
    async with InferenceRESTClient(RESTConfig(protocol="v2")) as rest:
        found["rest_v2_live"] = await rest.is_server_live(base)
        found["rest_v2_ready"] = await rest.is_server_ready(base)
        found["rest_v2_model_ready"] = await rest.is_model_ready(base, model)
        answer = await rest.infer(base, request(model, rows, "rest"), model_name=model)
        found["rest_v2_id"] = answer.id
        found["rest_v2"] = answer.outputs[0].as_numpy().tolist()
        answer = await rest.infer(base, request(model, rows, "binary", binary=True), model_name=model)
        found["rest_v2_binary"] = answer.outputs[0].as_numpy().tolist()
    async with InferenceRESTClient(RESTConfig(protocol="v1")) as rest_v1:
        found["rest_v1_live"] = await rest_v1.is_server_live(base)
        found["rest_v1_model_ready"] = await rest_v1.is_model_ready(base, model)
        predicted = await rest_v1.infer(base, {"instances": rows.tolist()}, model_name=model)
        found["rest_v1"] = predicted["predictions"]
    grpc = InferenceGRPCClient(grpc_url)
    try:
        found["grpc_live"] = await grpc.is_server_live()
        found["grpc_ready"] = await grpc.is_server_ready()
        found["grpc_model_ready"] = await grpc.is_model_ready(model)
        answer = await grpc.infer(request(model, rows, "grpc"))
        found["grpc_id"] = answer.id
        found["grpc"] = answer.outputs[0].as_numpy().tolist()
    finally:
        await grpc.close()
    return found


if __name__ == "__main__":
    http_url, grpc_url, model, path = sys.argv[1:5]
    print(json.dumps(asyncio.run(main(http_url, grpc_url, model, np.load(path)))))
