"""Part 4 of the GATI benchmark: the model with its cache set served by `adaserve serve`, measured from a client.

One worker of batch 1 with one intra-op thread (the model's config) and the default `lookup: auto` (inline on CPU),
as in-process. Requests go one at a time over HTTP with binary tensors (tritonclient.http); every image is sent twice,
with early exit and with `early_exit: false` (the same model, the same weights, all blocks, no lookup), the two in a
random order per image. Latency is the client's, from the call to the decoded response.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import tritonclient.http as httpclient

from adaserve.repository import ModelSpec
from benchmarks.common import wait_for_quiet
from benchmarks.gati.runs import Samples, cpu_window, summary
from tests.server_utils import running_server

WARM_UP = 20
QUIET_WAIT_S = 5.0


def measure_server(spec: ModelSpec, images: np.ndarray) -> dict[str, Any]:
    """Early exit on vs off through a fresh server on `spec`'s repository; summaries, exits and the CPU record."""
    samples = {"on": Samples(), "off": Samples()}
    with (
        running_server(spec.directory.parent, f"--model={spec.name}") as server,
        httpclient.InferenceServerClient(server.http_url) as client,
    ):
        for image in images[:WARM_UP]:
            for parameters in (None, {"early_exit": False}):
                infer_row(client, spec.name, image, parameters)
        shuffle = np.random.default_rng(0)
        with cpu_window(window := {"quiet_wait": wait_for_quiet(QUIET_WAIT_S)}, server.pid):
            for image in images:
                for side in shuffle.permutation(["on", "off"]):
                    parameters = None if side == "on" else {"early_exit": False}
                    latency, label, answer = infer_row(client, spec.name, image, parameters)
                    block = answer.get("exit_block")
                    samples[side].add([(latency, label, block)], latency)
    reference = np.array(samples["off"].label)
    base_mean = float(np.mean(samples["off"].latency_s))
    return {
        "window": window,
        "rows": len(images),
        "config": {"workers": [{"batch": 1, "threads": 1}], "verify_fraction": 0.0},
        "on": summary(samples["on"], reference, base_mean),
        "off": summary(samples["off"], reference, base_mean),
    }


def infer_row(
    client: httpclient.InferenceServerClient, model: str, image: np.ndarray, parameters: dict[str, Any] | None
) -> tuple[float, int, dict[str, Any]]:
    """One request of one image, binary tensors both ways: (latency s, class, the response's parameters)."""
    tensor = httpclient.InferInput("image", [1, *image.shape], "FP32")
    tensor.set_data_from_numpy(image[None], binary_data=True)
    output = httpclient.InferRequestedOutput("logits", binary_data=True)
    began = time.perf_counter()
    result = client.infer(model, [tensor], outputs=[output], parameters=parameters)
    logits = result.as_numpy("logits")
    latency = time.perf_counter() - began
    return latency, int(np.argmax(logits)), result.get_response().get("parameters") or {}
