"""adaserve against TorchServe: the same model, the same images from the same load generator, on the same cores.

The example `mlp` (784-256-256-10, FP32, the artifact adaserve serves; `--model cnn` for the example CNN) takes
batch-1 requests of real Fashion-MNIST test images from Triton's C++ perf_analyzer over HTTP, closed loop at
concurrency 1 and 8, interleaved, `--repeats` times. perf_analyzer speaks each server's own API: the Open Inference
Protocol to adaserve (binary tensor data), and TorchServe's `POST /predictions/{model}` to TorchServe
(`--service-kind torchserve`: the image's float32 bytes uploaded as the request's `data`), the way Triton's own
TorchServe comparison drives it.

TorchServe 0.12 serves it the way its guides tune a CPU model: a custom handler (`benchmarks/torchserve_handler.py`,
one torch thread a worker) in `--torchserve-workers` worker processes, with TorchServe's batching (batchSize 16, the
model's, and maxBatchDelay 1 ms, the least it takes: it reads 0 as its default of 100 ms; `--torchserve-batch 1`
turns batching off), its logs at WARN (Triton's comparison turns them off) and its system metrics off. adaserve
serves the example config (elastic batching, its default worker set). TorchServe opens gRPC ports on every
interface, so the whole benchmark runs in a network namespace of its own (`unshare -rn`). "server cores" is each
server's process tree (TorchServe's: its Java frontend and its Python workers).

    benchmarks/perf_analyzer_env.sh                     # once: Triton's perf_analyzer in .venv-perf
    benchmarks/foreign_env.sh torchserve                # once: TorchServe in .venv-torchserve (needs Java 17)
    .venv/bin/python -m benchmarks.versus_torchserve    # ~4 minutes; --quick for one repeat

Writes `benchmarks/results/versus_torchserve.json` and `.png` (with --quick: under `benchmarks/results/tmp/`).
"""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import (
    RESULTS,
    ROOT,
    ROWS,
    SCRATCH,
    finish_report,
    load_average,
    process_command,
    real_images,
    report_head,
    rerun_in_own_network_namespace,
)
from benchmarks.foreign import (
    Speech,
    example_artifact,
    foreign_server,
    idle_cores,
    paired_perf_runs,
    perf_shape,
    print_pair,
    venv_python,
    version_of,
)
from benchmarks.perf_load import PerfAnalyzer
from benchmarks.serving_overhead import MODEL, paired_cases, paired_plot, perf_parser
from tests.server_utils import ServerHandle, free_ports, link_example, running_server

CONCURRENCIES = (1, 8)
SERVERS = ("torchserve", "adaserve")
#: Distinct test images each server is sent, round robin.
IMAGES = 64
#: Root level WARN: no access log line, model log or metrics line a request (TorchServe logs each at INFO).
LOG4J2 = """<Configuration status="WARN">
  <Appenders>
    <Console name="STDOUT" target="SYSTEM_OUT"><PatternLayout pattern="%d [%-5p] %c - %m%n"/></Console>
  </Appenders>
  <Loggers><Root level="warn"><AppenderRef ref="STDOUT"/></Root></Loggers>
</Configuration>
"""


def main() -> int:
    parser = perf_parser(__doc__, request_count=2000)
    parser.add_argument("--model", choices=sorted(ROWS), default=MODEL, help=f"example model (default {MODEL})")
    parser.add_argument("--torchserve-venv", type=Path, default=ROOT / ".venv-torchserve", help="venv of TorchServe")
    parser.add_argument("--torchserve-workers", type=int, default=2, help="TorchServe's workers (default 2)")
    parser.add_argument("--torchserve-batch", type=int, default=16, help="its batchSize (default 16, the model's)")
    parser.add_argument(
        "--torchserve-delay-ms", type=int, default=1, help="its maxBatchDelay (default 1, the least it takes)"
    )
    args = parser.parse_args()
    outer = rerun_in_own_network_namespace("benchmarks.versus_torchserve")
    if outer is not None:
        return outer
    args.repeats = args.repeats or (1 if args.quick else 3)
    args.request_count = args.request_count or (500 if args.quick else 2000)
    variant = [args.model] if args.model != MODEL else []
    if (args.torchserve_batch, args.torchserve_delay_ms) != (16, 1):
        delay = f"d{args.torchserve_delay_ms}" if args.torchserve_batch > 1 else ""  # no delay without batching
        variant.append(f"b{args.torchserve_batch}{delay}")
    stem = "-".join(["versus_torchserve", *variant])
    output: Path = args.output or (SCRATCH / f"{stem}-quick.json" if args.quick else RESULTS / f"{stem}.json")
    perf = PerfAnalyzer.find(args.perf_venv)
    python = venv_python(args.torchserve_venv, "benchmarks/foreign_env.sh torchserve")
    work = SCRATCH / "versus_torchserve"
    shutil.rmtree(work, ignore_errors=True)
    link_example(work / "repo", args.model)
    inputs = _write_inputs(work, args.model)
    settings = {
        "model": args.model,
        "repeats": args.repeats,
        "measurement_request_count": args.request_count,
        "images": IMAGES,
        "torchserve_workers": args.torchserve_workers,
        "torchserve_batching": {"batchSize": args.torchserve_batch, "maxBatchDelay": args.torchserve_delay_ms},
    }
    report = report_head("versus_torchserve", settings)
    report["torchserve_version"] = version_of(python, "torchserve")
    report["java"] = subprocess.run(["java", "-version"], capture_output=True, text=True).stderr.splitlines()[0]
    store = _archive(python, work, args.model)
    with running_server(work / "repo") as adaserve, _torchserve(python, work, store, args) as torchserve:
        report["server_commands"] = {
            "adaserve": process_command(adaserve.pid),
            "torchserve": process_command(torchserve.pid),
        }
        servers = {"adaserve": adaserve, "torchserve": torchserve}
        report["largest_answer_difference"] = _compare_answers(adaserve, torchserve, args.model, work)
        report["idle_server_cores"] = {name: idle_cores(server.pid) for name, server in servers.items()}
        # Each server's input shape for perf_analyzer (TorchServe's is a file) and the rest of its arguments.
        speech: dict[str, Speech] = {
            "adaserve": (perf_shape(args.model), ("--input-data", str(inputs["adaserve"]))),
            "torchserve": (None, ("--service-kind", "torchserve", "--input-data", str(inputs["torchserve"]))),
        }
        report["runs"] = paired_perf_runs(
            perf, servers, SERVERS, CONCURRENCIES, args.repeats, args.request_count, args.model, speech
        )
    report["load_end"] = load_average()
    report["cases"] = paired_cases(report["runs"], SERVERS, CONCURRENCIES)
    return finish_report(report, output, _plot, _print)


def _write_inputs(work: Path, model: str) -> dict[str, Path]:
    """The same `IMAGES` test images for both: perf_analyzer's input data for adaserve (the tensor's values), and for
    TorchServe one raw float32 file an image, named in its `TORCHSERVE_INPUT` form."""
    rows = real_images(IMAGES, model)
    files = work / "images"
    files.mkdir(parents=True)
    for index, row in enumerate(rows):
        (files / f"{index}.bin").write_bytes(np.ascontiguousarray(row).tobytes())
    adaserve = {"data": [{"image": {"content": row.ravel().tolist(), "shape": list(row.shape)}} for row in rows]}
    torchserve = {"data": [{"TORCHSERVE_INPUT": [str(files / f"{index}.bin")]} for index in range(IMAGES)]}
    paths = {"adaserve": work / "adaserve-input.json", "torchserve": work / "torchserve-input.json"}
    paths["adaserve"].write_text(json.dumps(adaserve))
    paths["torchserve"].write_text(json.dumps(torchserve))
    return paths


def _archive(python: Path, work: Path, model: str) -> Path:
    """The model store: the artifact, its row shape and the handler, packed by torch-model-archiver (unzipped)."""
    store = work / "store"
    store.mkdir()
    (work / "row_shape.json").write_text(json.dumps(list(ROWS[model])))
    archiver = python.parent / "torch-model-archiver"
    command = [
        str(archiver), "--model-name", model, "--version", "1.0", "--serialized-file", str(example_artifact(model)),
        "--handler", str(ROOT / "benchmarks" / "torchserve_handler.py"), "--extra-files", str(work / "row_shape.json"),
        "--export-path", str(store), "--archive-format", "no-archive",
    ]  # fmt: skip
    subprocess.run(command, check=True, capture_output=True, text=True)
    return store


@contextlib.contextmanager
def _torchserve(python: Path, work: Path, store: Path, args: Any) -> Iterator[ServerHandle]:
    """TorchServe serving the model from `store`, until the block ends; entered once the model answers (TorchServe
    forks its workers after its frontend is up)."""
    port, management, metrics, grpc, grpc_management = free_ports(5)
    (work / "log4j2.xml").write_text(LOG4J2)
    model = {"1.0": {"defaultVersion": True, "marName": args.model, "minWorkers": args.torchserve_workers}}
    model["1.0"].update(
        maxWorkers=args.torchserve_workers,
        responseTimeout=120,
        batchSize=args.torchserve_batch,
        maxBatchDelay=args.torchserve_delay_ms,
    )
    properties = {
        "inference_address": f"http://127.0.0.1:{port}",
        "management_address": f"http://127.0.0.1:{management}",
        "metrics_address": f"http://127.0.0.1:{metrics}",
        "grpc_inference_port": grpc,
        "grpc_management_port": grpc_management,
        "model_store": store,
        "load_models": args.model,
        "models": json.dumps({args.model: model}),
        "python": python,
        "disable_token_authorization": "true",
        "disable_system_metrics": "true",
        "metrics_mode": "prometheus",
        "vmargs": f"-Dlog4j.configurationFile=file://{work / 'log4j2.xml'}",
    }
    (work / "config.properties").write_text("".join(f"{key}={value}\n" for key, value in properties.items()))
    command = [
        str(python.parent / "torchserve"), "--start", "--foreground", "--ncs",
        "--ts-config", str(work / "config.properties"), "--model-store", str(store),
    ]  # fmt: skip
    with foreign_server(command, work / "torchserve.log", port, "TorchServe", ready_path="/ping") as handle:
        _wait_until_it_answers(handle, args.model)
        yield handle


def _wait_until_it_answers(server: ServerHandle, model: str, timeout_s: float = 120.0) -> None:
    """Send a zero row until TorchServe's workers answer it."""
    row = np.zeros(ROWS[model], np.float32).tobytes()
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            json.loads(_post(f"http://{server.http_url}/predictions/{model}", row))
            return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            if time.monotonic() > deadline:
                raise RuntimeError(f"TorchServe did not answer within {timeout_s:.0f} s; see {server.log}") from None
            time.sleep(1.0)


def _compare_answers(adaserve: ServerHandle, torchserve: ServerHandle, model: str, work: Path) -> float:
    """Both servers' outputs for every image sent, which must agree: the largest difference between them."""
    largest = 0.0
    for path in sorted((work / "images").glob("*.bin")):
        row = np.frombuffer(path.read_bytes(), np.float32).reshape(ROWS[model])
        body = {
            "inputs": [{"name": "image", "datatype": "FP32", "shape": [1, *row.shape], "data": row.ravel().tolist()}]
        }
        ours = json.loads(_post(f"http://{adaserve.http_url}/v2/models/{model}/infer", json.dumps(body).encode()))
        theirs = json.loads(_post(f"http://{torchserve.http_url}/predictions/{model}", path.read_bytes()))
        difference = np.abs(np.asarray(ours["outputs"][0]["data"]) - np.asarray(theirs).ravel()).max()
        largest = max(largest, float(difference))
    if largest > 1e-4:
        raise RuntimeError(f"adaserve and TorchServe answer differently (by up to {largest:.3g}): not the same model")
    return largest


def _post(url: str, body: bytes) -> bytes:
    """POST `body` as bytes (urllib's default content type, a form, is one TorchServe would try to decode)."""
    request = urllib.request.Request(url, data=body, headers={"content-type": "application/octet-stream"})
    with urllib.request.urlopen(request, timeout=30) as answer:
        return bytes(answer.read())


def _plot(report: dict[str, Any], path: Path) -> None:
    settings = report["settings"]
    batching = settings["torchserve_batching"]
    setup = f"{settings['torchserve_workers']} workers, batchSize {batching['batchSize']}"
    if batching["batchSize"] > 1:
        setup += f", maxBatchDelay {batching['maxBatchDelay']} ms"
    title = f"adaserve vs TorchServe ({setup}), the {settings['model']} at batch 1"
    paired_plot(report, path, SERVERS, title, tick=lambda name: f"concurrency {name[1:]}", log_p50=True)


def _print(report: dict[str, Any], output: Path) -> None:
    print_pair(report, output, SERVERS, ("TorchServe", "adaserve"))


if __name__ == "__main__":
    raise SystemExit(main())
