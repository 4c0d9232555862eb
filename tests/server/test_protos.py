"""The vendored protocol (adaserve/server/protos): its modules are what its .proto files compile to, and the
protocol is the one tritonclient 2.48 speaks, descriptor for descriptor, so both load in one process."""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any

import pytest
from grpc_tools import protoc
from tritonclient.grpc import model_config_pb2, service_pb2

PROTOS = Path(__file__).resolve().parents[2] / "adaserve" / "server" / "protos"


def serialized_descriptor(module: Path) -> bytes:
    """The file descriptor a generated module adds to the pool, read from its source."""
    found = re.search(r"AddSerializedFile\((b'.*?')\)\n", module.read_text(), re.DOTALL)
    assert found is not None, f"{module}: no serialized descriptor"
    return ast.literal_eval(found.group(1))


@pytest.mark.parametrize(("proto", "theirs"), [("grpc_service", service_pb2), ("model_config", model_config_pb2)])
def test_the_modules_are_the_protos_compiled_and_tritonclients_protocol(
    proto: str, theirs: Any, tmp_path: Path
) -> None:
    args = ["protoc", f"-I{PROTOS}", f"--python_out={tmp_path}", str(PROTOS / f"{proto}.proto")]
    assert protoc.main(args) == 0
    committed = serialized_descriptor(PROTOS / f"{proto}_pb2.py")
    assert serialized_descriptor(tmp_path / f"{proto}_pb2.py") == committed, "run `make protos`"
    assert committed == theirs.DESCRIPTOR.serialized_pb
