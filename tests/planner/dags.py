"""DAG query definitions the planner tests share."""

from __future__ import annotations

from typing import Any

from adaserve.planner.spec import DagConfig

ROW = {"datatype": "FP32", "shape": [-1, 4]}


def chain(**overrides: Any) -> DagConfig:
    """classify → refine (only on rows whose class is 0), the answer refine's where it ran, else classify's."""
    document: dict[str, Any] = {
        "name": "chain",
        "max_batch_size": 4,
        "inputs": [{"name": "x", **ROW}],
        "outputs": [{"name": "y", **ROW}],
        "nodes": [
            {"name": "classify", "options": [{"model": "base", "accuracy": 0.9}], "inputs": {"x": "x"}},
            {
                "name": "refine",
                "when": {"source": "classify.y", "argmax_in": [0]},
                "options": [{"model": "small", "accuracy": 0.8}, {"model": "large", "accuracy": 0.95}],
                "inputs": {"x": "classify.y"},
            },
        ],
        "results": {"y": ["refine.y", "classify.y"]},
    }
    document.update(overrides)
    return DagConfig.model_validate(document)


def fork(**overrides: Any) -> DagConfig:
    """a → (b, c) → d: a fork and its join."""
    node = {"options": [{"model": "m", "accuracy": 0.9}]}
    document: dict[str, Any] = {
        "name": "fork",
        "inputs": [{"name": "x", **ROW}],
        "outputs": [{"name": "y", **ROW}],
        "nodes": [
            {"name": "a", **node, "inputs": {"x": "x"}},
            {"name": "b", **node, "inputs": {"x": "a.y"}},
            {"name": "c", **node, "inputs": {"x": "a.y"}},
            {"name": "d", "options": [{"model": "join", "accuracy": 0.9}], "inputs": {"p": "b.y", "q": "c.y"}},
        ],
        "results": {"y": ["d.y"]},
    }
    document.update(overrides)
    return DagConfig.model_validate(document)
