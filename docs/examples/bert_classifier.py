"""A BERT sentence classifier from `transformers`, built from a config with random weights (nothing is downloaded),
written with its labels by `write_sequence_classifier`: `HF_HUB_OFFLINE=1 python bert_classifier.py models`.
`tokenize` is the client's side: it pads every text to `SEQUENCE` tokens and saves the two inputs as .npy files."""

import sys
from pathlib import Path

import numpy as np
import torch
from transformers import BertConfig, BertForSequenceClassification, BertTokenizer

from adaserve.export import write_sequence_classifier

WORDS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "film", "was", "good", "bad", "not", "at", "all"]
SEQUENCE = 12  # every request carries this many token ids a row: the tokenizer pads to it


def build() -> BertForSequenceClassification:
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=len(WORDS),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=SEQUENCE,
        id2label={0: "negative", 1: "positive"},
    )
    # With trained weights: BertForSequenceClassification.from_pretrained(a local folder) instead.
    return BertForSequenceClassification(config).eval()


def tokenize(texts: list[str], folder: Path) -> dict[str, np.ndarray]:
    """The client's side: token ids and attention mask, padded to SEQUENCE, saved as input_ids.npy and
    attention_mask.npy in `folder`."""
    tokenizer = BertTokenizer(vocab={word: index for index, word in enumerate(WORDS)})
    batch = tokenizer(texts, padding="max_length", truncation=True, max_length=SEQUENCE, return_tensors="np")
    for name in ("input_ids", "attention_mask"):
        np.save(folder / f"{name}.npy", batch[name])
    return {name: batch[name] for name in ("input_ids", "attention_mask")}


if __name__ == "__main__":
    repository = Path(sys.argv[1] if len(sys.argv) > 1 else "models")
    artifact = write_sequence_classifier(repository, build(), name="sentiment", sequence_length=SEQUENCE)
    print(f"wrote {artifact}")
    tokenize(["the film was good", "not good at all", "bad"], Path("."))
