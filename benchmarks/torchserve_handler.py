"""TorchServe's handler for `benchmarks/versus_torchserve.py`: the example artifact adaserve serves (torch.export),
run the way TorchServe's guides write a custom handler (`initialize` loads the model once per worker process,
`handle` gets the requests TorchServe batched and answers one item per request).

torch-model-archiver packs this file beside the artifact; TorchServe imports it in each of its Python workers, from
`.venv-torchserve` (`benchmarks/foreign_env.sh torchserve`). A request's body is one row of the model's input as raw
float32 bytes in C order, the file perf_analyzer's `--service-kind torchserve` uploads; the answer is the row's
outputs as a JSON list.
"""

from __future__ import annotations

import json
import os
from typing import Any

import numpy as np
import torch


class ExportedModel:
    def __init__(self) -> None:
        self.module: Any = None
        self.row_shape: tuple[int, ...] = ()

    def initialize(self, context: Any) -> None:
        torch.set_num_threads(1)  # one core a worker, as adaserve's default workers
        model_dir = context.system_properties["model_dir"]
        self.module = torch.export.load(os.path.join(model_dir, "model.pt2")).module()
        with open(os.path.join(model_dir, "row_shape.json")) as stream:
            self.row_shape = tuple(json.load(stream))

    def handle(self, data: list[dict[str, Any]], context: Any) -> list[list[float]]:
        rows = [np.frombuffer(item.get("data") or item.get("body"), np.float32) for item in data]
        batch = torch.from_numpy(np.stack(rows).reshape(len(rows), *self.row_shape))
        with torch.inference_mode():
            outputs = self.module(batch).numpy()
        return outputs.tolist()
