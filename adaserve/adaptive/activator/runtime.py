"""The activator inside a worker: the strategy `BatchRunner` delegates the rows of targeted requests to.

A request whose parameters carry `accuracy` (ACLO) or `latency_ms` (LCAO) is computed row by row by the sparse
kernel at the k its target asks for; its response parameters say `mode` (aclo, lcao, or dense on fallback), `k`
(the grid value used: at least the top k of every hidden layer's nodes are computed, averaged over the request's
rows), `layers` (per layer of the head, `sparse` or `dense` as the build's measured gate has it at that k, `mixed`
where the request's rows differ) and, for LCAO, `interference` (the β it used). An accuracy target above what the
calibration reached, or one so tight that the build timed ACLO slower there than k = 100% (`gate`), runs at
k = 100% without hashing the input first. Requests without a target never reach this class.

A model with an MLP head runs its prefix first, in torch, on all the request's rows at once (with the worker's
intra-op threads, as the model itself would), then the head through the kernel. LCAO measures each row's t0 after
that, so the prefix's time counts as time already spent, and the profile's T(k, β), which is the head's alone,
only has to cover what k changes.

The host loads it once (weights read from the model it already loaded, tables from the model's directory, kernel
compiled) before forking workers, which share it copy-on-write; `warm_up` runs in each worker and starts its
interference probe there.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from adaserve.adaptive.activator.artifact import Activator, ActivatorMismatchError, load_activator
from adaserve.adaptive.activator.kernel import Kernel, PackedNetwork
from adaserve.adaptive.activator.latency import InterferenceProbe
from adaserve.adaptive.activator.layers import NO_PREFIX, Prefix, extract_head
from adaserve.adaptive.activator.select import ARRIVED_NS, aclo_threshold, lcao_index
from adaserve.config import ModelConfig
from adaserve.errors import ConfigError

__all__ = ["ActivatorRuntime"]

log = logging.getLogger("adaserve.activator")

#: Accuracy targets whose threshold a runtime remembers before it starts over.
_REMEMBERED_TARGETS = 1024


class ActivatorRuntime:
    """Runs targeted rows through the kernel; without an `activator` (it did not fit the model: the stated
    fallback) they run at k = 100%, exactly, and report mode `dense`."""

    def __init__(self, kernel: Kernel, activator: Activator | None, prefix: Prefix = NO_PREFIX) -> None:
        self.kernel = kernel
        self.activator = activator
        self.prefix = prefix
        self.k_grid = activator.k_grid if activator is not None else np.ones(1)
        self._grid: list[float] = self.k_grid.tolist()
        # Plain lists and strings: this runs once per request, where numpy's per-call overhead would show.
        self._dense: list[list[bool]] = kernel.dense_at.tolist()
        self._layers = [",".join("dense" if dense else "sparse" for dense in row) for row in self._dense]
        self._thresholds: dict[float, float] = {}
        self._whole_rows: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self.probe = InterferenceProbe()

    @classmethod
    def load(cls, config: ModelConfig, artifact: Path, model: Callable[..., Any]) -> ActivatorRuntime:
        """Bind the model's activator to the loaded model; ConfigError (the model does not load) for a model the
        activator cannot serve, or for a mismatched activator when `on_mismatch: error`."""
        spec = config.activator
        assert spec is not None
        if len(config.inputs) != 1 or len(config.outputs) != 1:
            raise ConfigError(f"model '{config.name}': an activator serves models with one input and one output")
        if config.inputs[0].datatype != "FP32" or config.outputs[0].datatype != "FP32":
            raise ConfigError(f"model '{config.name}': an activator serves FP32 inputs and outputs")
        head = extract_head(model, config.inputs[0].row_shape, config.name)
        width = head.layers.sizes[-1]
        if config.outputs[0].row_shape != (width,):
            raise ConfigError(f"model '{config.name}': output rows must be ({width},) for an activator")
        network = PackedNetwork.from_layers(head.layers)
        model_version = int(artifact.parent.name)
        try:
            activator = load_activator(artifact.parent.parent, spec.version)
            activator.check(model_version, head.layers.digest(), head.prefix.digest())
        except ActivatorMismatchError as exc:
            if spec.on_mismatch == "error":
                raise ConfigError(f"model '{config.name}': {exc}") from None
            log.warning("activator does not fit the model; targeted requests run dense: %s", exc)
            runtime = cls(Kernel.dense(network), None, head.prefix)
        else:
            runtime = cls(Kernel.build(network, activator), activator, head.prefix)
        runtime.compile()
        return runtime

    def compile(self) -> None:
        """One call of each kind, so compilation (or loading it from numba's cache) happens before workers fork."""
        rows = np.zeros((1, int(self.kernel.network.sizes[0])), np.float32)
        out = np.empty((1, int(self.kernel.network.sizes[-1])), np.float32)
        for index in range(len(self.k_grid)):
            self.kernel.run(rows, out, np.full(1, index, np.int64), np.full(1, -1.0))
        self.kernel.run(rows, out, np.zeros(1, np.int64), np.zeros(1))

    def warm_up(self) -> None:
        """In the worker: start measuring interference."""
        self.probe.start()

    def takes(self, values: Mapping[str, Any]) -> bool:
        """Rows of a request with a target run here. The engine validated the target before queueing it
        (`prepare_parameters`), so here its presence is enough: on a small model, parsing it again per request
        cost a tenth of the forward."""
        return values.get("accuracy") is not None or values.get("latency_ms") is not None

    def run(self, inputs: list[np.ndarray], outputs: list[np.ndarray], values: Mapping[str, Any]) -> dict[str, Any]:
        """One request's rows, in place (its single input and output); returns its response parameters. Its
        target was validated before it was queued (`takes`)."""
        rows = len(inputs[0])
        x, out = self.prefix(inputs[0]), outputs[0]
        if self.activator is None:
            self.kernel.run(x, out, np.zeros(rows, np.int64), np.full(rows, -1.0))
            return {"mode": "dense", "k": 1.0}
        accuracy = values.get("accuracy")
        if accuracy is not None:  # ACLO, also when the request sets a latency too (`select`)
            threshold = self._aclo_threshold(accuracy)
            if threshold < 0:
                self.kernel.run(x, out, *self._whole(rows))
                return {"mode": "aclo", "k": 1.0, "layers": self._layers[-1]}
            k_index = np.zeros(rows, np.int64)
            self.kernel.run(x, out, k_index, np.array([threshold] * rows))
            return {"mode": "aclo", **self._chosen(k_index.tolist())}
        budget_ms = float(values["latency_ms"])
        beta = self.probe.busy
        latency = self.activator.latency.at(beta)
        arrived = values.get(ARRIVED_NS)
        chosen = []
        k_index, no_threshold = np.zeros(1, np.int64), np.full(1, -1.0)
        for row in range(rows):  # each row's t0 includes the prefix and the rows before it
            waited_ms = (time.monotonic_ns() - arrived) / 1e6 if isinstance(arrived, int) else 0.0
            k_index[0] = lcao_index(latency, budget_ms - waited_ms)
            self.kernel.run(x[row : row + 1], out[row : row + 1], k_index, no_threshold)
            chosen.append(int(k_index[0]))
        return {"mode": "lcao", **self._chosen(chosen), "interference": round(beta, 2)}

    def _aclo_threshold(self, accuracy: float) -> float:
        """δ for an accuracy target, or -1 where it runs at k = 100% (the target asks for it, or ACLO was timed
        slower there: `aclo_from`). Remembered per target as the request sent it (an int or a float): clients repeat
        theirs, and on a small model the lookup would be a tenth of the request's compute."""
        threshold = self._thresholds.get(accuracy)
        if threshold is None:
            assert self.activator is not None
            calibration = self.activator.calibration
            found = aclo_threshold(calibration.thresholds, calibration.accuracy, float(accuracy))
            threshold = found if found > 0 and found >= self.activator.aclo_from else -1.0
            if len(self._thresholds) >= _REMEMBERED_TARGETS:
                self._thresholds.clear()
            self._thresholds[accuracy] = threshold
        return threshold

    def _whole(self, rows: int) -> tuple[np.ndarray, np.ndarray]:
        """The kernel's arguments for `rows` rows at k = 100% (the last grid index, no threshold), made once per
        row count: with no threshold the kernel writes back the index it was given, so they never change, and making
        them anew costs a small MLP a tenth of its forward."""
        arguments = self._whole_rows.get(rows)
        if arguments is None:
            arguments = np.full(rows, len(self._grid) - 1, np.int64), np.full(rows, -1.0)
            if len(self._whole_rows) < _REMEMBERED_TARGETS:
                self._whole_rows[rows] = arguments
        return arguments

    def _chosen(self, indexes: list[int]) -> dict[str, Any]:
        """`k` (mean over the rows) and `layers` for rows run at these grid indexes."""
        distinct = set(indexes)
        if len(distinct) == 1:  # every row at one k (a single row among them)
            return {"k": round(self._grid[indexes[0]], 4), "layers": self._layers[indexes[0]]}
        k = round(sum(self._grid[i] for i in indexes) / len(indexes), 4)
        per_layer = zip(*(self._dense[i] for i in distinct), strict=True)
        plans = ("dense" if all(rows) else "mixed" if any(rows) else "sparse" for rows in per_layer)
        return {"k": k, "layers": ",".join(plans)}
