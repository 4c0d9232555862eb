"""Loading a DAG query checks its wiring against the models' configs, and names what does not fit."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from adaserve.config import ModelConfig
from adaserve.errors import ConfigError, ModelNotFoundError
from adaserve.planner.catalog import DagCatalog
from adaserve.planner.planner import ModelAnswer
from adaserve.planner.spec import DagConfig
from tests.planner.dags import chain


class Repository:
    def __init__(self, dag: DagConfig) -> None:
        self.dag = dag

    def dag_names(self) -> list[str]:
        return [self.dag.name]

    def read_dag(self, name: str) -> DagConfig:
        return self.dag


class Router:
    """The router's view a catalog needs: the repository and each model's spec."""

    def __init__(self, dag: DagConfig, models: dict[str, ModelConfig]) -> None:
        self.repository = Repository(dag)
        self.models = models

    def start_delay_s(self, name: str) -> float | None:
        return 0.0

    def spec(self, name: str) -> SimpleNamespace:
        if name not in self.models:
            raise ModelNotFoundError(f"unknown model '{name}'")
        return SimpleNamespace(config=self.models[name])


def model(name: str, *, datatype: str = "FP32", width: int = 4, output: str = "y", batch: int = 4) -> ModelConfig:
    return ModelConfig(
        name=name,
        max_batch_size=batch,
        inputs=({"name": "x", "datatype": datatype, "shape": (-1, width)},),  # type: ignore[arg-type]
        outputs=({"name": output, "datatype": datatype, "shape": (-1, width)},),  # type: ignore[arg-type]
    )


async def answer(name: str, inputs: dict[str, np.ndarray], rows: int, parameters: dict[str, Any]) -> ModelAnswer:
    return ModelAnswer({"y": np.zeros((rows, 4), np.float32)}, {})


def load(models: dict[str, ModelConfig]) -> DagCatalog:
    catalog = DagCatalog(Router(chain(), models), answer)  # type: ignore[arg-type]
    asyncio.run(catalog.load("chain"))
    return catalog


GOOD = {"base": model("base"), "small": model("small"), "large": model("large")}


def test_a_well_wired_query_loads_and_its_options_are_timed() -> None:
    catalog = load(GOOD)
    planner = catalog.planner("chain")
    assert all(planner.book.estimate_ms(m, 1) is not None for m in GOOD)
    assert catalog.index()[0].state == "READY"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"large": model("large", datatype="FP16")}, "input 'x' of 'large': gets FP32 rows of \\[4\\], takes FP16"),
        (
            {"large": model("large", width=5)},
            "input 'x' of 'large': gets FP32 rows of \\[4\\], takes FP32 rows of \\[5\\]",
        ),
        ({"base": model("base", output="z")}, "model 'base' has no output 'y' \\(it has z\\)"),
        ({"small": model("small", batch=2)}, "model 'small' takes batches of at most 2, the query 4"),
        ({"large": None}, "node 'refine': unknown model 'large'"),
    ],
)
def test_a_query_that_does_not_fit_its_models_is_refused_with_the_reason(
    change: dict[str, ModelConfig | None], message: str
) -> None:
    models = {name: config for name, config in {**GOOD, **change}.items() if config is not None}
    with pytest.raises(ConfigError, match=f"DAG query 'chain': .*{message}"):
        load(models)
