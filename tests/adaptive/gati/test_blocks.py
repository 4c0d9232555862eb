"""Blocks: any valid cut runs block by block to exactly the whole model, for .pt2, .pt and nn.Module."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch

from adaserve.adaptive.gati.blocks import BlocksError, load_chain, split_model
from adaserve.repository import ModelRepository, load_artifact
from adaserve.zoo import resnet
from tests.adaptive.gati.conftest import write_tiny_mlp, write_zoo_model
from tests.server_utils import EXAMPLES

RESNET_BLOCKS = (
    "stem",
    "layer1.0",
    "layer1.1",
    "layer2.0",
    "layer2.1",
    "layer3.0",
    "layer3.1",
    "layer4.0",
    "layer4.1",
    "head",
)


def small_resnet() -> torch.nn.Module:
    torch.manual_seed(0)
    return resnet((2, 2, 2, 2), width=8, in_channels=1, num_classes=10).eval()


def whole(path: Path) -> torch.nn.Module:
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=DeprecationWarning)
        return load_artifact(path, 4)  # type: ignore[return-value]


@pytest.mark.parametrize(
    ("name", "row_shape", "names", "exits"),
    [
        ("cnn", (1, 28, 28), ("stage1", "stage2", "head"), (0, 1)),
        ("mlp", (784,), ("0", "1", "2", "3", "4"), (1, 3)),  # no exit before a ReLU
        ("mlp_torchscript", (784,), ("0", "1", "2", "3", "4"), (1, 3)),
    ],
)
def test_example_models_run_block_by_block_to_the_whole_model(
    name: str, row_shape: tuple[int, ...], names: tuple[str, ...], exits: tuple[int, ...]
) -> None:
    spec = ModelRepository(EXAMPLES).read(name)
    chain = load_chain(spec)
    assert (chain.names, chain.exits) == (names, exits)
    x = torch.rand(5, *row_shape)
    with torch.no_grad():
        assert torch.equal(chain.run(x), whole(spec.artifact)(x))
        assert torch.equal(chain.run(chain.run(x, 0, 2), 2), chain.run(x))


def test_exported_blocks_share_the_programs_weights() -> None:
    program = torch.export.load(str(EXAMPLES / "cnn" / "1" / "model.pt2"))
    chain = split_model(program)
    storages = {t.untyped_storage().data_ptr() for t in program.state_dict.values()}
    block_tensors = [t for block in chain.blocks for t in block.parameters()]  # type: ignore[attr-defined]
    assert len(block_tensors) == len(storages)
    assert {t.untyped_storage().data_ptr() for t in block_tensors} == storages


@pytest.mark.parametrize("fmt", ["module", "torch_export", "torchscript"])
def test_a_resnet_splits_into_its_basic_blocks(tmp_path: Path, fmt: str) -> None:
    model = small_resnet()
    loaded: object = model
    if fmt != "module":
        spec = write_zoo_model(tmp_path, "resnet", model, (1, 32, 32), fmt)  # type: ignore[arg-type]
        loaded = torch.export.load(str(spec.artifact)) if fmt == "torch_export" else whole(spec.artifact)
    x = torch.rand(3, 1, 32, 32)
    auto = split_model(loaded)
    coarse = split_model(
        loaded, ["stem", "layer1", "layer2.0", "layer2.1", "layer3", "layer4", "head.0", "head.1", "head.2"]
    )
    assert auto.names == RESNET_BLOCKS
    with torch.no_grad():
        expected = model(x)
        torch.testing.assert_close(auto.run(x), expected)
        torch.testing.assert_close(coarse.run(x), expected)
    assert auto.weight_bytes[-1] > 0 and coarse.weight_bytes[6:8] == (0, 0)  # pooling and flatten hold nothing
    if fmt == "torch_export":  # each block is inlined into one graph of operations: no module call per layer
        calls = [n.target for block in auto.blocks for n in block.graph.nodes if n.op == "call_module"]  # type: ignore[attr-defined]
        assert calls == []


@pytest.mark.parametrize(
    ("blocks", "problem"),
    [
        (["stem", "nope"], "block 'nope' does not exist; the model's top-level modules are: stem, layer1, layer2"),
        (["layer1", "stem"], "block 'layer1' is out of order: 'stem' runs next"),
        (["stem", "layer1.0.conv1"], "block 'layer1.0.conv1' is inside 'layer1.0', whose forward is not a sequential"),
        (
            ["stem", "layer1", "layer2", "layer3", "layer4"],
            "the blocks end before the model does: head would never run",
        ),
        (["stem", "layer1", "layer2", "layer3", "layer4", "head", "head.0"], "block 'head.0' is out of order: the"),
    ],
)
def test_blocks_that_do_not_cut_the_model_are_named(blocks: list[str], problem: str) -> None:
    with pytest.raises(BlocksError, match=problem.replace(".", r"\.")):
        split_model(small_resnet(), blocks)


def test_a_model_that_is_not_a_chain_needs_named_blocks() -> None:
    with pytest.raises(BlocksError, match=r"no sequential chain at the top level.*caches\.blocks"):
        split_model(small_resnet().layer1[0])


def test_load_chain_follows_the_config_and_names_the_model(tmp_path: Path) -> None:
    spec = write_tiny_mlp(tmp_path, caches={"blocks": ["0", "1", "2", "3", "4"]})
    assert load_chain(spec).names == ("0", "1", "2", "3", "4")
    spec = write_tiny_mlp(tmp_path, "bad", caches={"blocks": ["0", "2"]})
    with pytest.raises(BlocksError, match=r"^model 'bad' \(.*model\.pt2\): block '2' is out of order: '1' runs next"):
        load_chain(spec)
