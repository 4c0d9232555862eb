"""Write a torch module into a model repository as `model.pt2` (torch.export): `python torch_module.py models`."""

import sys
from pathlib import Path

import torch
from torch import nn

from adaserve.export import write_model

CONFIG = {  # what config.yaml holds; write_model also takes keyword arguments, or an adaserve.config.ModelConfig
    "max_batch_size": 8,  # the exported program takes batches of 1 to 8 rows
    "inputs": [{"name": "features", "datatype": "FP32", "shape": [-1, 4]}],
    "outputs": [{"name": "scores", "datatype": "FP32", "shape": [-1, 3]}],
}


def build() -> nn.Module:
    torch.manual_seed(0)  # the same weights each time, so a test can run the model beside the server
    return nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 3))


if __name__ == "__main__":
    repository = Path(sys.argv[1] if len(sys.argv) > 1 else "models")
    artifact = write_model(repository, CONFIG, build(), torch.randn(2, 4), name="scorer")
    print(f"wrote {artifact}")
