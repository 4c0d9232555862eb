"""The example models computed directly in torch, in the test process: what the server must answer."""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable

import numpy as np
import torch

from tests.server_utils import EXAMPLES

MODEL_INPUT_SHAPES = {"mlp": (784,), "cnn": (1, 28, 28), "mlp_torchscript": (784,)}


_loading = threading.Lock()  # torch.export.load is not thread-safe, and tests call this from many threads


@functools.cache
def _load(model: str) -> Callable[[torch.Tensor], torch.Tensor]:
    if model == "mlp_torchscript":
        return torch.jit.load(str(EXAMPLES / model / "1" / "model.pt")).eval()  # type: ignore[no-any-return]
    return torch.export.load(str(EXAMPLES / model / "1" / "model.pt2")).module()  # type: ignore[no-any-return]


def _module(model: str) -> Callable[[torch.Tensor], torch.Tensor]:
    with _loading:
        return _load(model)


def reference_outputs(model: str, array: np.ndarray) -> np.ndarray:
    """Computed in chunks of 16 rows, the example models' max_batch_size."""
    module = _module(model)
    with torch.inference_mode():
        chunks = [module(torch.from_numpy(np.ascontiguousarray(array[i : i + 16]))) for i in range(0, len(array), 16)]
    return torch.cat(chunks).numpy()
