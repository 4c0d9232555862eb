"""Ray Serve serving a model the way Ray Serve's guides batch a PyTorch model (`@serve.batch` in a FastAPI ingress),
with enough of the Open Inference Protocol's REST routes for perf_analyzer to drive it: the baseline that
`benchmarks/versus_ray.py` starts (in its own network namespace: Ray binds every interface) with `.venv-ray`'s
Python, which `benchmarks/foreign_env.sh ray` makes.

    .venv-ray/bin/python -m benchmarks.ray_app --artifact models/mlp/1/model.pt2 --metadata M.json --config C.json \\
        --port 8500 --replicas 1 --max-batch 16 --wait-ms 0

With `--models FILE` the same deployment serves several models the way Ray Serve's guides serve many models from
one pool of replicas: model multiplexing (`@serve.multiplexed`, each replica loading a model on its first request
and keeping the last MODELS_PER_REPLICA it used). A request names its model in the `serve_multiplexed_model_id`
header, by which Ray's proxy routes it to a replica that holds the model, and `@serve.batch` batches requests of
one model together (Ray splits a batch by model). With `--nodes N` Ray is a local cluster of N nodes on this machine,
made as `adaserve cluster up` makes its own (`ray.cluster_utils.Cluster`, the machine's cores shared equally), with
Serve's HTTP proxy on the head: `benchmarks/cluster/versus_ray_serve.py` starts it so, with `.venv-ray-cluster`'s
Python (`benchmarks/foreign_env.sh ray-cluster`).

The model's metadata and config are adaserve's answers for the same model (perf_analyzer reads both), so the two
servers describe the model alike; inputs come as JSON or as the binary tensor data extension (perf_analyzer's
default), answers as JSON. Stops on SIGTERM.
"""

# No `from __future__ import annotations`: FastAPI 0.165 under Ray Serve 2.60 then reads the routes' `Request`
# parameter as a required query field (every request a 422).
import argparse
import json
import os
import signal
import threading
from typing import Any

import numpy as np
import ray
import torch
from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse
from ray import serve

app = FastAPI()
#: The header a request names its model in, for a multiplexed deployment (Ray routes by it).
MODEL_HEADER = "serve_multiplexed_model_id"
#: Models a replica of a multiplexed deployment keeps loaded (Ray's default): every model of the benchmark fits on
#: every replica, as every model fits on every adaserve node there.
MODELS_PER_REPLICA = 3


@serve.deployment(ray_actor_options={"num_cpus": 1}, max_ongoing_requests=64)
@serve.ingress(app)
class Model:
    """`models`: each model's artifact path and adaserve's metadata and config for it. One model is loaded here;
    several (`multiplexed`) each on its first request to a replica."""

    def __init__(self, models: dict[str, dict[str, Any]], max_batch: int, wait_s: float, multiplexed: bool) -> None:
        torch.set_num_threads(1)  # one core a replica, as adaserve's default workers
        self.models = models
        self.multiplexed = multiplexed
        self.model = None if multiplexed else self.load_artifact(next(iter(models.values()))["artifact"])
        self.row_shapes = {name: list(m["metadata"]["inputs"][0]["shape"][1:]) for name, m in models.items()}
        self.outputs = {name: m["metadata"]["outputs"][0]["name"] for name, m in models.items()}
        self.compute.set_max_batch_size(max_batch)  # type: ignore[attr-defined]  # serve.batch adds them
        self.compute.set_batch_wait_timeout_s(wait_s)  # type: ignore[attr-defined]

    @app.get("/v2/health/live")
    @app.get("/v2/health/ready")
    def healthy(self) -> Response:
        return Response(status_code=200)

    @app.get("/v2")
    def server_metadata(self) -> dict[str, Any]:
        return {"name": "ray-serve", "version": ray.__version__, "extensions": []}

    @app.get("/v2/models/{name}")
    def model_metadata(self, name: str) -> Any:
        return self.models[name]["metadata"] if name in self.models else _unknown(name)

    @app.get("/v2/models/{name}/ready")
    def model_ready(self, name: str) -> Response:
        return Response(status_code=200 if name in self.models else 404)

    @app.get("/v2/models/{name}/config")
    def model_config(self, name: str) -> Any:
        return self.models[name]["config"] if name in self.models else _unknown(name)

    @app.post("/v2/models/{name}/infer")
    async def infer(self, name: str, request: Request) -> Any:
        if name not in self.models:
            return _unknown(name)
        if self.multiplexed and serve.get_multiplexed_model_id() != name:
            return JSONResponse({"error": f"name the model in the {MODEL_HEADER} header"}, status_code=400)
        body = await request.body()
        length = request.headers.get("inference-header-content-length")
        if length is None:
            header = json.loads(body)
            rows = np.asarray(header["inputs"][0]["data"], np.float32)
        else:
            header = json.loads(body[: int(length)])
            rows = np.frombuffer(body[int(length) :], np.float32)
        logits = await self.compute(rows.reshape(-1, *self.row_shapes[name]))
        return {
            "model_name": name,
            "outputs": [
                {
                    "name": self.outputs[name],
                    "datatype": "FP32",
                    "shape": list(logits.shape),
                    "data": logits.ravel().tolist(),
                }
            ],
        }

    @serve.batch(max_batch_size=16, batch_wait_timeout_s=0.0)
    async def compute(self, requests: list[np.ndarray]) -> list[np.ndarray]:
        # a batch holds one model's requests: Ray splits batches by the multiplexed model ID
        model = self.model if self.model is not None else await self.load(serve.get_multiplexed_model_id())
        with torch.inference_mode():
            logits = model(torch.from_numpy(np.concatenate(requests))).numpy()
        return np.split(logits, np.cumsum([len(r) for r in requests])[:-1])

    @serve.multiplexed(max_num_models_per_replica=MODELS_PER_REPLICA)
    async def load(self, name: str) -> Any:
        return self.load_artifact(self.models[name]["artifact"])

    @staticmethod
    def load_artifact(path: str) -> Any:
        """The module an artifact holds: torch.export's (.pt2) or TorchScript's (.pt). A method: the replicas get
        this class by value, and a module-level function it calls was missing there (NameError)."""
        if path.endswith(".pt2"):
            return torch.export.load(path).module()
        return torch.jit.load(path).eval()


def _unknown(name: str) -> JSONResponse:
    return JSONResponse({"error": f"unknown model '{name}'"}, status_code=404)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--artifact", help="one model: its artifact")
    parser.add_argument("--metadata", help="one model: adaserve's metadata for it (JSON)")
    parser.add_argument("--config", help="one model: adaserve's config for it (JSON)")
    parser.add_argument(
        "--models", help='several models, multiplexed: a JSON file {name: {"artifact", "metadata", "config"}} of paths'
    )
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--replicas", type=int, default=1)
    parser.add_argument("--max-batch", type=int, default=16)
    parser.add_argument("--wait-ms", type=float, default=0.0)
    parser.add_argument("--nodes", type=int, default=0, help="a local Ray cluster of this many nodes (0: one node)")
    parser.add_argument("--object-store-mib", type=int, default=256, help="each Ray node's object store")
    args = parser.parse_args()
    if args.models:
        with open(args.models) as stream:
            paths = json.load(stream)
    elif args.artifact and args.metadata and args.config:
        paths = {"": {"artifact": args.artifact, "metadata": args.metadata, "config": args.config}}
    else:
        parser.error("give --models, or --artifact, --metadata and --config")
    models = {}
    for name, files in paths.items():
        with open(files["metadata"]) as stream:
            metadata = json.load(stream)
        with open(files["config"]) as stream:
            config = json.load(stream)
        models[name or metadata["name"]] = {"artifact": files["artifact"], "metadata": metadata, "config": config}
    cluster = _start_ray(args.nodes, args.object_store_mib * 2**20)
    serve.start(
        proxy_location="HeadOnly",  # one proxy: the nodes of a local cluster share this machine's ports
        http_options={"host": "127.0.0.1", "port": args.port},
        logging_config={"enable_access_log": False, "log_level": "WARNING"},
    )
    deployment = Model.options(num_replicas=args.replicas)  # type: ignore[attr-defined]  # serve.deployment adds it
    app = deployment.bind(models, args.max_batch, args.wait_ms / 1000, bool(args.models))
    serve.run(app, route_prefix="/")
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    while not stop.wait(1.0):
        pass
    serve.shutdown()
    ray.shutdown()
    if cluster is not None:
        cluster.shutdown()


def _start_ray(nodes: int, object_store_bytes: int) -> Any:
    """Ray on this machine: one node of two CPUs, or (`nodes` > 0) a local cluster of that many nodes sharing the
    machine's cores, as `adaserve cluster up` makes its own; the cluster, to shut down at the end, or None.

    Quiet as a tuned deployment would run: no dashboard, no per-request access log, workers' logs not copied to
    this driver (each costs CPU on every request on two cores)."""
    if nodes <= 0:
        ray.init(
            num_cpus=2,
            include_dashboard=False,
            log_to_driver=False,
            object_store_memory=object_store_bytes,
            _node_ip_address="127.0.0.1",
        )
        return None
    from ray.cluster_utils import Cluster

    node_args: dict[str, Any] = {
        "num_cpus": max(1, len(os.sched_getaffinity(0)) // nodes),
        "object_store_memory": object_store_bytes,
    }
    cluster = Cluster(initialize_head=True, head_node_args={**node_args, "include_dashboard": False})
    for _ in range(nodes - 1):
        cluster.add_node(**node_args)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, log_to_driver=False)
    return cluster


if __name__ == "__main__":
    main()
