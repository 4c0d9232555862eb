"""KServe's Python model server serving a model the way KServe's guides write a custom predictor (a `kserve.Model`
whose `predict` runs it, served by `ModelServer` over the Open Inference Protocol's REST routes): the baseline that
`benchmarks/versus_kserve.py` starts (in its own network namespace: KServe listens on every interface) with
`.venv-kserve`'s Python, which `benchmarks/foreign_env.sh kserve` makes.

    .venv-kserve/bin/python -m benchmarks.kserve_app --artifact models/mlp/1/model.pt2 --metadata M.json --port 8600

The inputs and outputs it declares are adaserve's metadata for the same model. KServe's server has no batching of
its own (in a cluster its batcher is a sidecar in front of the pod): each request runs the model on its own rows.
It runs in one process: KServe 0.14 hands `workers` to uvicorn but starts it with `serve()`, which does not fork
(with `workers=2` a quick run still measured one busy core).
Its per-request access log and latency log are off, as a tuned deployment would run.
"""

from __future__ import annotations

import argparse
import json
import logging
from typing import Any

import numpy as np
import torch
from kserve import InferOutput, InferRequest, InferResponse, Model, ModelServer


class Predictor(Model):
    def __init__(self, name: str, artifact: str, metadata: dict[str, Any]) -> None:
        super().__init__(name)
        torch.set_num_threads(1)  # one core, as adaserve's default workers
        self.model = torch.export.load(artifact).module()
        self.metadata = metadata
        self.ready = True

    def get_input_types(self) -> list[dict[str, Any]]:
        return list(self.metadata["inputs"])

    def get_output_types(self) -> list[dict[str, Any]]:
        return list(self.metadata["outputs"])

    async def predict(
        self, payload: InferRequest, headers: dict[str, str] | None = None, response_headers: Any = None
    ) -> InferResponse:
        rows = np.ascontiguousarray(payload.inputs[0].as_numpy(), np.float32)
        with torch.inference_mode():
            logits = self.model(torch.from_numpy(rows)).numpy()
        output = InferOutput(name=self.metadata["outputs"][0]["name"], shape=list(logits.shape), datatype="FP32")
        output.set_data_from_numpy(logits, binary_data=False)
        return InferResponse(model_name=self.name, infer_outputs=[output], response_id=payload.id or "")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--artifact", required=True)
    parser.add_argument("--metadata", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--grpc-port", type=int, help="also serve the Open Inference Protocol's gRPC API here")
    args = parser.parse_args()
    with open(args.metadata) as stream:
        metadata = json.load(stream)
    grpc = {"enable_grpc": False} if args.grpc_port is None else {"grpc_port": args.grpc_port}
    server = ModelServer(http_port=args.port, enable_latency_logging=False, **grpc)
    logging.getLogger("uvicorn.access").setLevel(logging.WARNING)
    server.start([Predictor(metadata["name"], args.artifact, metadata)])


if __name__ == "__main__":
    main()
