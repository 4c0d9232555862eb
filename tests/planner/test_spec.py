"""A DAG query's definition: what it must wire up, and the error that names what it does not."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from adaserve.errors import ConfigError
from adaserve.repository import ModelRepository
from tests.planner.dags import chain, fork


def test_parents_children_and_rows_every_node_runs_on() -> None:
    config = chain()
    assert config.node("refine").parents == ["classify"]
    assert config.children("classify") == ["refine"]
    assert config.runs_on_every_row("classify") and not config.runs_on_every_row("refine")
    assert fork().node("d").parents == ["b", "c"]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"results": {"y": ["refine.y"]}}, "may skip rows"),
        ({"results": {"y": ["classify.y"], "z": ["classify.y"]}}, "results must name each output once"),
        ({"results": {"y": ["nowhere.y"]}}, "'nowhere.y' is not `node.output`"),
        ({"results": {"y": []}}, "no source"),
    ],
)
def test_results_must_cover_every_output_on_every_row(change: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        chain(**change)


def test_a_node_reads_only_inputs_and_nodes_above_it() -> None:
    nodes = chain().model_dump()["nodes"]
    with pytest.raises(ValueError, match=r"'refine\.y' does not name a node above it"):
        chain(nodes=[{**nodes[0], "inputs": {"x": "refine.y"}}, nodes[1]])  # a cycle cannot be written
    with pytest.raises(ValueError, match=r"'image' is neither an input nor `node\.output`"):
        chain(nodes=[{**nodes[0], "inputs": {"x": "image"}}, nodes[1]])
    with pytest.raises(ValueError, match="the name is taken"):
        chain(nodes=[nodes[0], {**nodes[1], "name": "classify"}])
    with pytest.raises(ValueError, match="condition must read a node's output"):
        chain(nodes=[nodes[0], {**nodes[1], "when": {"source": "x", "argmax_in": [0]}}])
    with pytest.raises(ValueError, match="a model is listed twice"):
        chain(nodes=[{**nodes[0], "options": [{"model": "base", "accuracy": 0.9}] * 2}, nodes[1]])


def test_a_dag_file_is_read_and_its_errors_name_the_file_and_field(tmp_path: Path) -> None:
    (tmp_path / "pipe").mkdir()
    document = chain().model_dump(exclude={"name"})
    (tmp_path / "pipe" / "dag.yaml").write_text(yaml.safe_dump(document))
    repository = ModelRepository(tmp_path)
    assert repository.dag_names() == ["pipe"] and repository.names() == []
    assert repository.read_dag("pipe").name == "pipe"
    document["budget_policy"] = "greedy"
    (tmp_path / "pipe" / "dag.yaml").write_text(yaml.safe_dump(document))
    with pytest.raises(ConfigError, match=r"dag.yaml: field 'budget_policy': Input should be 'equal' or"):
        repository.read_dag("pipe")
    (tmp_path / "pipe" / "config.yaml").write_text("{}")
    with pytest.raises(ConfigError, match=r"holds both config\.yaml"):
        repository.read_dag("pipe")
