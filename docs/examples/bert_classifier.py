"""A BERT sentence classifier from `transformers`, built from a config with random weights (no download), written
as `model.pt2`: `HF_HUB_OFFLINE=1 python bert_classifier.py models`."""

import sys
from pathlib import Path

import torch
from torch import nn
from transformers import BertConfig, BertForSequenceClassification

from adaserve.config import ModelConfig
from adaserve.export import write_model

TOKENS = 32  # every request carries this many token ids a row (pad shorter sentences)

CONFIG = ModelConfig.model_validate(
    {
        "name": "sentiment",
        "max_batch_size": 4,
        "inputs": [{"name": "input_ids", "datatype": "INT64", "shape": [-1, TOKENS]}],
        "outputs": [{"name": "logits", "datatype": "FP32", "shape": [-1, 2]}],
    }
)


class Logits(nn.Module):
    """input_ids in, logits out: one tensor each way, as the server and torch.export want."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=input_ids).logits


def build() -> nn.Module:
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=1000, hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128
    )
    config.num_labels = 2
    # With trained weights: BertForSequenceClassification.from_pretrained(a local folder) instead.
    return Logits(BertForSequenceClassification(config).eval())


if __name__ == "__main__":
    repository = Path(sys.argv[1] if len(sys.argv) > 1 else "models")
    example = torch.randint(0, 1000, (2, TOKENS))
    artifact = write_model(repository, CONFIG, build(), (example,))
    print(f"wrote {artifact}")
