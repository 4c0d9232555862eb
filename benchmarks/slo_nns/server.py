"""ACLO through a real `adaserve serve`: plain requests (the model's own dense path, torch) against requests with an
accuracy target, one at a time over HTTP with tritonclient, interleaved per input."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import tritonclient.http as httpclient

from benchmarks.common import load_window
from tests.server_utils import ServerHandle


def aclo_through_server(
    server: ServerHandle, model: str, x: np.ndarray, y: np.ndarray, targets: dict[str, float], repeats: int
) -> dict[str, Any]:
    """Per input: the median of `repeats` client-measured latencies of a plain request and of each target."""
    names = ["plain", *targets]
    times = np.zeros((len(names), len(x)))
    correct = np.zeros((len(names), len(x)), np.bool_)
    ks = {name: np.zeros(len(x)) for name in targets}
    record: dict[str, Any] = {}
    with httpclient.InferenceServerClient(server.http_url) as client:

        def infer(rows: np.ndarray, parameters: dict[str, Any] | None) -> tuple[float, np.ndarray, dict[str, Any]]:
            tensor = httpclient.InferInput("image", list(rows.shape), "FP32")
            tensor.set_data_from_numpy(rows)
            began = time.perf_counter_ns()
            result = client.infer(model, [tensor], parameters=parameters)
            elapsed = (time.perf_counter_ns() - began) / 1e6
            return elapsed, result.as_numpy("logits"), result.get_response().get("parameters", {})

        for _ in range(20):  # connection and worker warm-up
            infer(x[:1], None)
        with load_window(record):
            for row in range(len(x)):
                rows = x[row : row + 1]
                for index, name in enumerate(names):
                    parameters = None if name == "plain" else {"accuracy": targets[name]}
                    samples = []
                    for _ in range(repeats):
                        elapsed, logits, response = infer(rows, parameters)
                        samples.append(elapsed)
                    times[index, row] = np.median(samples)
                    correct[index, row] = int(np.argmax(logits)) == y[row]
                    if name in ks:
                        ks[name][row] = response["k"]
    plain_accuracy = float(correct[0].mean())
    rows_out = []
    for index, name in enumerate(names):
        ratio = times[0] / times[index]
        rows_out.append(
            {
                "method": name,
                "accuracy": float(correct[index].mean()),
                "loss": plain_accuracy - float(correct[index].mean()),
                "p50_ms": float(np.median(times[index])),
                "mean_ms": float(times[index].mean()),
                "speedup_vs_plain_mean": float(ratio.mean()),
                "speedup_vs_plain_min": float(ratio.min()),
                "speedup_vs_plain_max": float(ratio.max()),
                **({"target_accuracy": targets[name], "mean_k": float(ks[name].mean())} if name in ks else {}),
            }
        )
    return {"model": model, "inputs": len(x), "repeats": repeats, "rows": rows_out, **record}
