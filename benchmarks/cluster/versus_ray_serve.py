"""adaserve's cluster against Ray Serve on the same kind of cluster: several models on a local 3-node Ray cluster.

adaserve runs as `adaserve cluster up --nodes 3` (a node server on each Ray node; a model is placed on a node on its
first request, and a request to another node is forwarded there). Ray Serve serves the same artifacts the way its
guides serve many models from one pool of replicas: model multiplexing (`@serve.multiplexed`,
`serve.get_multiplexed_model_id`), a request naming its model in the `serve_multiplexed_model_id` header, by which
Serve's proxy routes it to a replica that holds it; one replica on each node (one CPU each), `@serve.batch` as in
`benchmarks/versus_ray.py` (max_batch_size 16, batch_wait_timeout_s 0), on a local cluster made alike
(`ray.cluster_utils.Cluster`, the machine's cores shared equally, the same object store; `benchmarks/ray_app.py
--models --nodes`, the deployment versus_ray runs, with its Open Inference Protocol ingress). Both systems run
Ray 2.60.

The load is Triton's C++ perf_analyzer for both: closed loop at `--concurrency` (default 8), batch-1 requests over
HTTP (binary tensor data), one model per run, then every model at once (the mixed load, below), every request
carrying the multiplexing header (adaserve ignores it).
A Python load generator would take CPU from the servers on two cores and add its own time to every request; the
ingress lets the same C++ client drive both. Every request enters the cluster at one address, as a client that
knows nothing of placement sends it: Serve's one HTTP proxy (on the head node) and the first adaserve node server
(node 0's ports), which forwards requests for models placed on other nodes. Each model is asked once first, so
its first load is outside the measurement.

Then the mixed load: every model at once, a perf_analyzer per model started together, each at its share of
`--concurrency` (8 on three models: 3, 3, 2), the same entry and header. Each measures in time windows (5 s; 2 s
with --quick) rather than request counts, so that the models' measurements overlap instead of the fastest model's
ending early. The mix is recorded per model (`mixed:MODEL`: its req/s and p50) and in all (`mixed:all`: the req/s
summed, the p50 and p99 the models' own weighted by their req/s, the server cores over the whole mix), beside the
one-model cases in the same JSON and PNG.

Each round starts adaserve's cluster, measures every model, stops it, then does the same with Ray Serve's
(`--repeats` rounds; the figures are medians over the rounds). Ray binds every interface whatever it is told, so
the whole benchmark runs in a network namespace of its own (`unshare -rn`), clients included: nothing outside can
reach either cluster. "server cores" is each system's whole process tree (Ray's processes included) under load,
and, before the runs, over five idle seconds. On two cores the client, the proxy or entry node and the replicas
share the cores: the figures compare the two systems on one small machine, not a cluster's capacity.

    benchmarks/perf_analyzer_env.sh                              # once: Triton's perf_analyzer in .venv-perf
    benchmarks/foreign_env.sh ray-cluster                        # once: Ray Serve 2.60 in .venv-ray-cluster
    .venv/bin/python -m benchmarks.cluster.versus_ray_serve      # ~19 minutes; --quick for one short round

Writes `benchmarks/results/cluster_versus_ray_serve.json` and `.png` (with --quick: under `benchmarks/results/tmp/`).
"""

from __future__ import annotations

import contextlib
import json
import shutil
import statistics
import sys
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from adaserve.distributed.launch import OBJECT_STORE_BYTES
from adaserve.distributed.trace_settings import split
from benchmarks.common import (
    RESULTS,
    ROOT,
    SCRATCH,
    finish_report,
    load_average,
    load_window,
    process_command,
    report_head,
    rerun_in_own_network_namespace,
    tree_cpu_s,
    wait_for_quiet,
)
from benchmarks.foreign import example_artifact, foreign_server, idle_cores, print_pair, venv_python, version_of
from benchmarks.perf_load import PerfAnalyzer
from benchmarks.serving_overhead import QUIET_WAIT_S, paired_case, paired_cases, paired_plot, perf_parser, perf_run
from tests.server_utils import EXAMPLES, ServerHandle, link_example

SERVERS = ("ray", "adaserve")
MODELS = ("mlp", "cnn", "mlp_torchscript")
#: The header Ray Serve's proxy routes a multiplexed request by (`benchmarks/ray_app.py`'s MODEL_HEADER).
MODEL_HEADER = "serve_multiplexed_model_id"
#: How long a cluster may take to come up with every node server (Ray's nodes, then the servers).
UP_TIMEOUT_S = 300.0
#: The ports each system listens on, in this benchmark's own network namespace: adaserve's node 0 (node i adds
#: 2i) and Serve's proxy. Not ports the OS picks free: Ray's own servers take ports from the same ephemeral range
#: after they were picked, and one did (a node server then never came up: "address already in use").
ADASERVE_HTTP_PORT = 8000
RAY_SERVE_PORT = 8500
#: The mixed load's perf_analyzer time window, in ms: full runs, and --quick's.
MIXED_WINDOW_MS = {False: 5000, True: 2000}


def main() -> int:
    parser = perf_parser(__doc__, request_count=2000)
    parser.add_argument("--models", default="mlp,cnn,mlp_torchscript", help="example models, comma-separated")
    parser.add_argument("--nodes", type=int, default=3, help="Ray nodes of each cluster (default 3)")
    parser.add_argument("--concurrency", type=int, default=8, help="perf_analyzer's concurrency (default 8)")
    parser.add_argument("--ray-venv", type=Path, default=ROOT / ".venv-ray-cluster", help="venv holding Ray Serve")
    args = parser.parse_args()
    models = tuple(args.models.split(","))
    if unknown := set(models) - set(MODELS):
        parser.error(f"no example model {sorted(unknown)}; choose from {', '.join(MODELS)}")
    if args.concurrency < len(models):
        parser.error(f"--concurrency {args.concurrency} cannot be shared among {len(models)} models in the mix")
    outer = rerun_in_own_network_namespace("benchmarks.cluster.versus_ray_serve")
    if outer is not None:
        return outer
    args.repeats = args.repeats or (1 if args.quick else 3)
    args.request_count = args.request_count or (500 if args.quick else 2000)
    stem = "cluster_versus_ray_serve"
    output: Path = args.output or (SCRATCH / f"{stem}-quick.json" if args.quick else RESULTS / f"{stem}.json")
    perf = PerfAnalyzer.find(args.perf_venv, judge_stability=not args.quick)
    python = venv_python(args.ray_venv, "benchmarks/foreign_env.sh ray-cluster")
    work = SCRATCH / stem
    shutil.rmtree(work, ignore_errors=True)
    for model in models:
        link_example(work / "repo", model)
    settings = {
        "models": list(models),
        "nodes": args.nodes,
        "concurrency": args.concurrency,
        "repeats": args.repeats,
        "measurement_request_count": args.request_count,
        "ray_batch": {"max_batch_size": 16, "batch_wait_timeout_s": 0.0},
        "object_store_bytes": OBJECT_STORE_BYTES,
        "entry": "Ray Serve: its HTTP proxy (head node only); adaserve: node 0's server",
        "mixed_concurrency": dict(zip(models, split(args.concurrency, len(models)), strict=True)),
        "mixed_window_ms": MIXED_WINDOW_MS[args.quick],
    }
    report = report_head("cluster_versus_ray_serve", settings)
    report["ray_version"] = version_of(python, "ray")
    report["rounds"], report["runs"], report["mixed_runs"] = [], [], []
    for repeat in range(args.repeats):
        with _adaserve_cluster(work, args.nodes) as (adaserve, nodes):
            entry = nodes[0]
            round_: dict[str, Any] = {"repeat": repeat, "adaserve_nodes": nodes}
            warmed = {model: _warm(entry["http"], model) for model in models}
            shapes = {model: shape for model, (shape, _) in warmed.items()}
            if repeat == 0:
                _describe(entry["http"], models, work)
            round_["adaserve"] = _measured(
                perf, "adaserve", adaserve, entry["http"], models, shapes, args, repeat, report
            )
            round_["adaserve"]["resident"] = [_resident(node) for node in nodes]  # by node, node 0 first
        with _ray_serve(python, work, models, args.nodes) as ray:
            round_["same_answers"] = {
                model: bool(np.allclose(_warm(ray.http_url, model)[1], warmed[model][1], rtol=1e-4, atol=1e-5))
                for model in models
            }
            round_["ray"] = _measured(perf, "ray", ray, ray.http_url, models, shapes, args, repeat, report)
        report["rounds"].append(round_)
        print(f"round {repeat}: adaserve's models by node: {_placed(round_)}", flush=True)
    report["load_end"] = load_average()
    report["idle_server_cores"] = {
        name: statistics.median(r[name]["idle_cores"] for r in report["rounds"]) for name in SERVERS
    }
    report["cases"] = {
        model: paired_cases([r for r in report["runs"] if r["model"] == model], SERVERS, (args.concurrency,))[
            f"c{args.concurrency}"
        ]
        for model in models
    }
    report["cases"].update(_mixed_cases(report["mixed_runs"], models))
    return finish_report(report, output, _plot, _print)


def _measured(
    perf: PerfAnalyzer,
    name: str,
    server: ServerHandle,
    entry: str,
    models: tuple[str, ...],
    shapes: dict[str, str],
    args: Any,
    repeat: int,
    report: dict[str, Any],
) -> dict[str, Any]:
    """One system's round: its idle cores, a perf_analyzer run for each model sent to `entry` (added to
    `report["runs"]`), then every model at once (`_mixed`, added to `report["mixed_runs"]`); what the round records
    about it."""
    record: dict[str, Any] = {"command": process_command(server.pid), "idle_cores": idle_cores(server.pid)}
    at = ServerHandle(entry, "", server.pid, server.log)  # requests go to `entry`, CPU is the whole tree's
    for model in models:
        run = perf_run(
            perf,
            at,
            "http",
            args.concurrency,
            repeat,
            args.request_count,
            name,
            model=model,
            shape=shapes[model],
            extra=("-H", f"{MODEL_HEADER}:{model}"),
        )
        run["model"] = model
        report["runs"].append(run)
    report["mixed_runs"].append(_mixed(perf, name, server, at, models, shapes, args, repeat))
    return record


def _mixed(
    perf: PerfAnalyzer,
    name: str,
    server: ServerHandle,
    at: ServerHandle,
    models: tuple[str, ...],
    shapes: dict[str, str],
    args: Any,
    repeat: int,
) -> dict[str, Any]:
    """Every model at once: a perf_analyzer per model, started together after one wait for a quiet machine, each at
    its share of the concurrency and measuring in time windows; each model's run, and the mix's server cores."""
    shares = split(args.concurrency, len(models))
    window = ("--measurement-mode", "time_windows", "--measurement-interval", str(MIXED_WINDOW_MS[args.quick]))
    record: dict[str, Any] = {"server": name, "repeat": repeat}
    record["quiet"] = wait_for_quiet(QUIET_WAIT_S if perf.judge_stability else 0.0)
    cpu_before = tree_cpu_s(server.pid)
    with load_window(record), ThreadPoolExecutor(len(models)) as pool:
        running = [
            pool.submit(
                perf_run, perf, at, "http", share, repeat, args.request_count, f"{name}-mixed", model=model,
                shape=shapes[model], extra=("-H", f"{MODEL_HEADER}:{model}", *window), quiet_wait_s=0.0,
            )
            for model, share in zip(models, shares, strict=True)
        ]  # fmt: skip
        runs = [future.result() for future in running]
    record["server_cores"] = (tree_cpu_s(server.pid) - cpu_before) / record["wall_s"]
    kept = ("concurrency", "command", "returncode", "wall_s", "throughput_rps", "p50_ms", "p99_ms", "stdout_tail")
    record["models"] = {model: {k: run[k] for k in kept if k in run} for model, run in zip(models, runs, strict=True)}
    return record


def _mixed_cases(mixed_runs: list[dict[str, Any]], models: tuple[str, ...]) -> dict[str, Any]:
    """The mixed load side by side (`paired_case`): each model's req/s and p50 within it (`mixed:MODEL`), and the
    whole mix's (`mixed:all`): req/s summed, p50 and p99 the models' weighted by their req/s."""
    per_model: dict[str, list[dict[str, Any]]] = {model: [] for model in models}
    whole = []
    for mix in mixed_runs:
        answered = {model: run for model, run in mix["models"].items() if "throughput_rps" in run}
        for model, run in answered.items():
            per_model[model].append({**run, "server": mix["server"], "server_cores": mix["server_cores"]})
        if len(answered) == len(models):
            total = sum(run["throughput_rps"] for run in answered.values())
            weighted = {
                key: sum(run[key] * run["throughput_rps"] for run in answered.values()) / total
                for key in ("p50_ms", "p99_ms")
            }
            whole.append(
                {"server": mix["server"], "throughput_rps": total, **weighted, "server_cores": mix["server_cores"]}
            )
    cases = {f"mixed:{model}": paired_case(runs, SERVERS) for model, runs in per_model.items()}
    cases["mixed:all"] = paired_case(whole, SERVERS)
    return cases


@contextlib.contextmanager
def _adaserve_cluster(work: Path, nodes: int) -> Iterator[tuple[ServerHandle, list[dict[str, Any]]]]:
    """`adaserve cluster up --nodes N` until the block ends: its handle, and each node server as it announced itself
    (node, http, grpc, pid), node 0's first."""
    port = ADASERVE_HTTP_PORT
    command = [
        sys.executable, "-m", "adaserve", "cluster", "up", "--nodes", str(nodes), "--model-repository",
        str(work / "repo"), "--http-port", str(port), "--grpc-port", str(port + 1), "--log-level", "warning",
    ]  # fmt: skip
    log = work / "adaserve-cluster.log"
    began = time.monotonic()
    with foreign_server(command, log, port, "adaserve's cluster") as handle:
        announced = _announced(log, time.monotonic() + UP_TIMEOUT_S)
        print(f"adaserve's cluster up in {time.monotonic() - began:.1f} s", flush=True)
        yield handle, sorted(announced, key=lambda node: int(node["http"].rsplit(":", 1)[1]))


def _announced(log: Path, deadline: float) -> list[dict[str, Any]]:
    """The node servers `cluster up` printed, once it printed that all are ready."""
    while time.monotonic() < deadline:
        lines = [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]
        if any("ready" in line for line in lines):
            return [line for line in lines if "node" in line and "http" in line]
        time.sleep(0.5)
    raise TimeoutError(f"adaserve's cluster did not come up within {UP_TIMEOUT_S:g} s; see {log}")


@contextlib.contextmanager
def _ray_serve(python: Path, work: Path, models: tuple[str, ...], nodes: int) -> Iterator[ServerHandle]:
    """Ray Serve on a local cluster of `nodes` nodes, the models multiplexed, one replica on each node."""
    files = {
        model: {
            "artifact": str(_artifact(model)),
            "metadata": str(work / f"{model}.metadata.json"),
            "config": str(work / f"{model}.config.json"),
        }
        for model in models
    }
    (work / "ray_models.json").write_text(json.dumps(files, indent=2))
    port = RAY_SERVE_PORT
    command = [
        str(python), "-m", "benchmarks.ray_app", "--models", str(work / "ray_models.json"), "--port", str(port),
        "--replicas", str(nodes), "--nodes", str(nodes), "--object-store-mib", str(OBJECT_STORE_BYTES // 2**20),
    ]  # fmt: skip
    began = time.monotonic()
    with foreign_server(command, work / "ray.log", port, "Ray Serve") as handle:
        print(f"Ray Serve's cluster up in {time.monotonic() - began:.1f} s", flush=True)
        yield handle


def _artifact(model: str) -> Path:
    """The artifact adaserve serves for an example model (TorchScript's is `model.pt`)."""
    artifact = example_artifact(model)
    return artifact if artifact.is_file() else EXAMPLES / model / "1" / "model.pt"


def _request(url: str, path: str, body: dict[str, Any] | None = None, model: str | None = None) -> Any:
    headers = {"content-type": "application/json", **({MODEL_HEADER: model} if model else {})}
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(f"http://{url}{path}", data=data, headers=headers)
    with urllib.request.urlopen(request, timeout=UP_TIMEOUT_S) as answer:
        return json.load(answer)


def _warm(url: str, model: str) -> tuple[str, list[float]]:
    """Ask for `model` once (where it is held nowhere yet, this loads it): perf_analyzer's `--shape` for its input,
    and the answer to an image of 0.5s (both systems must give the same)."""
    metadata = _request(url, f"/v2/models/{model}", model=model)
    row = [int(n) for n in metadata["inputs"][0]["shape"][1:]]
    image = {"name": "image", "shape": [1, *row], "datatype": "FP32", "data": [0.5] * int(np.prod(row))}
    answer = _request(url, f"/v2/models/{model}/infer", {"inputs": [image]}, model=model)
    return "image:" + ",".join(map(str, row)), [float(x) for x in answer["outputs"][0]["data"]]


def _describe(url: str, models: tuple[str, ...], work: Path) -> None:
    """adaserve's metadata and config of each model, for Ray Serve's ingress to answer alike."""
    for model in models:
        for route, suffix in (("", "metadata"), ("/config", "config")):
            description = _request(url, f"/v2/models/{model}{route}", model=model)
            (work / f"{model}.{suffix}.json").write_text(json.dumps(description))


def _resident(node: dict[str, Any]) -> list[str]:
    """The models a node server holds itself (its index speaks for the cluster: one another node holds is READY
    with a reason naming where)."""
    index = _request(node["http"], "/v2/repository/index", {})
    return sorted(row["name"] for row in index if row.get("state") == "READY" and not row.get("reason"))


def _plot(report: dict[str, Any], path: Path) -> None:
    settings = report["settings"]
    title = (
        f"adaserve's cluster vs Ray Serve multiplexed, {settings['nodes']} Ray nodes, batch 1, "
        f"concurrency {settings['concurrency']}"
    )
    paired_plot(report, path, SERVERS, title)


def _print(report: dict[str, Any], output: Path) -> None:
    print_pair(report, output, SERVERS, ("Ray Serve", "adaserve"))
    settings = report["settings"]
    others = {
        name: statistics.median(r["other_cores"] for r in report["runs"] if r["server"] == name) for name in SERVERS
    }
    print(
        f"cores other work took during the runs (median): adaserve {others['adaserve']:.2f}, "
        f"Ray Serve {others['ray']:.2f}"
    )
    print(
        f"concurrency {settings['concurrency']}, {settings['nodes']} Ray nodes, Ray {report['ray_version']}; "
        f"medians of {settings['repeats']} rounds; entry: {settings['entry']}"
    )
    for round_ in report["rounds"]:
        same = all(round_["same_answers"].values())
        print(f"round {round_['repeat']}: adaserve's models by node: {_placed(round_)}; same answers: {same}")


def _placed(round_: dict[str, Any]) -> str:
    """Where adaserve held each model in a round, node 0 (where every request entered) first."""
    return ", ".join(
        f"node {index}: {' '.join(models) or '-'}" for index, models in enumerate(round_["adaserve"]["resident"])
    )


if __name__ == "__main__":
    raise SystemExit(main())
