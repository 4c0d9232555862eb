"""Serve a TorchScript file you already have: copy it into the repository's layout and write its config by hand:
`python torchscript_model.py models`."""

import sys
from pathlib import Path

import torch
from torch import nn

CONFIG = """\
name: ranker
max_batch_size: 16
inputs:
  - {name: query, datatype: FP32, shape: [-1, 8]}
outputs:
  - {name: score, datatype: FP32, shape: [-1, 1]}
"""


class Ranker(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(8, 1)

    def forward(self, query: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(self.layer(query))


def build() -> torch.jit.ScriptModule:
    torch.manual_seed(0)
    return torch.jit.script(Ranker().eval())  # stands for the file you have: torch.jit.load("ranker.pt")


if __name__ == "__main__":
    model_dir = Path(sys.argv[1] if len(sys.argv) > 1 else "models") / "ranker"
    (model_dir / "1").mkdir(parents=True, exist_ok=True)
    build().save(str(model_dir / "1" / "model.pt"))  # model.pt: TorchScript; model.pt2 would be torch.export
    (model_dir / "config.yaml").write_text(CONFIG)
    print(f"wrote {model_dir}")
