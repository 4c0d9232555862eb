"""Ray Serve serving a model the way Ray Serve's guides batch a PyTorch model (`@serve.batch` in a FastAPI ingress),
with enough of the Open Inference Protocol's REST routes for perf_analyzer to drive it: the baseline that
`benchmarks/versus_ray.py` starts (in its own network namespace: Ray binds every interface) with `.venv-ray`'s
Python, which `benchmarks/foreign_env.sh ray` makes.

    .venv-ray/bin/python -m benchmarks.ray_app --artifact models/mlp/1/model.pt2 --metadata M.json --config C.json \\
        --port 8500 --replicas 1 --max-batch 16 --wait-ms 0

The model's metadata and config are adaserve's answers for the same model (perf_analyzer reads both), so the two
servers describe the model alike; inputs come as JSON or as the binary tensor data extension (perf_analyzer's
default), answers as JSON. Stops on SIGTERM.
"""

from __future__ import annotations

import argparse
import json
import signal
import threading
from typing import Any

import numpy as np
import ray
import torch
from fastapi import FastAPI, Request, Response
from ray import serve

app = FastAPI()


@serve.deployment(ray_actor_options={"num_cpus": 1}, max_ongoing_requests=64)
@serve.ingress(app)
class Model:
    def __init__(
        self, artifact: str, metadata: dict[str, Any], config: dict[str, Any], max_batch: int, wait_s: float
    ) -> None:
        torch.set_num_threads(1)  # one core a replica, as adaserve's default workers
        self.model = torch.export.load(artifact).module()
        self.metadata, self.config = metadata, config
        self.input = metadata["inputs"][0]
        self.row_shape = [d for d in self.input["shape"][1:]]
        self.output = metadata["outputs"][0]["name"]
        self.compute.set_max_batch_size(max_batch)
        self.compute.set_batch_wait_timeout_s(wait_s)

    @app.get("/v2/health/live")
    @app.get("/v2/health/ready")
    def healthy(self) -> Response:
        return Response(status_code=200)

    @app.get("/v2")
    def server_metadata(self) -> dict[str, Any]:
        return {"name": "ray-serve", "version": ray.__version__, "extensions": []}

    @app.get("/v2/models/{name}")
    def model_metadata(self, name: str) -> dict[str, Any]:
        return self.metadata

    @app.get("/v2/models/{name}/ready")
    def model_ready(self, name: str) -> Response:
        return Response(status_code=200)

    @app.get("/v2/models/{name}/config")
    def model_config(self, name: str) -> dict[str, Any]:
        return self.config

    @app.post("/v2/models/{name}/infer")
    async def infer(self, name: str, request: Request) -> dict[str, Any]:
        body = await request.body()
        length = request.headers.get("inference-header-content-length")
        if length is None:
            header = json.loads(body)
            rows = np.asarray(header["inputs"][0]["data"], np.float32)
        else:
            header = json.loads(body[: int(length)])
            rows = np.frombuffer(body[int(length) :], np.float32)
        logits = await self.compute(rows.reshape(-1, *self.row_shape))
        return {
            "model_name": name,
            "outputs": [
                {"name": self.output, "datatype": "FP32", "shape": list(logits.shape), "data": logits.ravel().tolist()}
            ],
        }

    @serve.batch(max_batch_size=16, batch_wait_timeout_s=0.0)
    async def compute(self, requests: list[np.ndarray]) -> list[np.ndarray]:
        with torch.inference_mode():
            logits = self.model(torch.from_numpy(np.concatenate(requests))).numpy()
        return np.split(logits, np.cumsum([len(r) for r in requests])[:-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--artifact", required=True)
    parser.add_argument("--metadata", required=True)
    parser.add_argument("--config", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--replicas", type=int, default=1)
    parser.add_argument("--max-batch", type=int, default=16)
    parser.add_argument("--wait-ms", type=float, default=0.0)
    args = parser.parse_args()
    with open(args.metadata) as stream:
        metadata = json.load(stream)
    with open(args.config) as stream:
        config = json.load(stream)
    # Quiet as a tuned deployment would run: no dashboard, no per-request access log, workers' logs not copied to
    # this driver (each costs CPU on every request on two cores).
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        object_store_memory=256 * 2**20,
        _node_ip_address="127.0.0.1",
    )
    serve.start(
        http_options={"host": "127.0.0.1", "port": args.port},
        logging_config={"enable_access_log": False, "log_level": "WARNING"},
    )
    deployment = Model.options(num_replicas=args.replicas)
    serve.run(deployment.bind(args.artifact, metadata, config, args.max_batch, args.wait_ms / 1000), route_prefix="/")
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    while not stop.wait(1.0):
        pass
    serve.shutdown()
    ray.shutdown()


if __name__ == "__main__":
    main()
