"""GATI's selector networks (§3.1): decide from a predictor's class distribution whether its prediction is a hit,
trained with a loss that charges false positives more than false negatives; and the hit threshold for a target.

A false positive (a hit whose prediction differs from the base model's) costs agreement; a false negative only
costs the latency the base model then spends. The threshold on the selector's score is what turns a trained
selector into a cache with a known agreement: the lowest score whose hits still agree with the base model often
enough, found on data neither network was trained on.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, replace

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from adaserve.adaptive.gati.predictors import TrainSettings, minibatches

__all__ = ["HitRates", "Selector", "choose_threshold", "selector_loss", "train_selector"]

#: The selector's hidden width: "a simple neural network with one hidden layer" (§3.1).
SELECTOR_HIDDEN = 32
#: How much more a false positive costs than a false negative in the selector's loss.
FALSE_POSITIVE_WEIGHT = 4.0
#: Optimizer steps for a selector: it is tiny, and with a few epochs over a thousand rows it stays undertrained
#: (on the example CNN it then hit less often than a plain max-softmax threshold).
SELECTOR_STEPS = 2000


class Selector(nn.Module):
    """Predictor's class distribution PR → one hidden layer → the logit of "this prediction is a hit".

    It reads PR and PR sorted in descending order: the sorted copy shows how peaked the distribution is whatever
    the class, which a network this small otherwise learns class by class from a thousand rows (with PR alone the
    example CNN's Pool(4096) selector hit less often than the max-softmax threshold)."""

    def __init__(self, num_classes: int) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(2 * num_classes, SELECTOR_HIDDEN), nn.ReLU(), nn.Linear(SELECTOR_HIDDEN, 1))

    def forward(self, probs: torch.Tensor) -> torch.Tensor:
        return self.net(torch.cat([probs, probs.sort(1, descending=True).values], 1))


def selector_loss(
    logits: torch.Tensor, agrees: torch.Tensor, false_positive_weight: float = FALSE_POSITIVE_WEIGHT
) -> torch.Tensor:
    """The paper's "custom cross-entropy loss function that levies a higher loss penalty for FPs in comparison for
    FNs" (§3.1), as a weighted binary cross-entropy over the ground truth G (1 when the predictor's argmax equals the
    base model's):

        L = −mean[ G · log σ(t) + w_FP · (1 − G) · log(1 − σ(t)) ]

    t: the selector's logit. With w_FP > 1, scoring a disagreeing prediction as a hit costs w_FP times more than
    scoring an agreeing one as a miss."""
    weights = torch.where(agrees > 0.5, 1.0, false_positive_weight)
    return F.binary_cross_entropy_with_logits(logits.squeeze(1), agrees.float(), weight=weights)


def train_selector(
    selector: Selector,
    predictor_probs: torch.Tensor,
    agrees: torch.Tensor,
    settings: TrainSettings,
    steps: int = SELECTOR_STEPS,
) -> Selector:
    """Fit `selector` on a predictor's class distributions and whether each agreed, for `steps` minibatches;
    returns it in eval mode."""
    optimizer = torch.optim.Adam(selector.parameters(), lr=settings.lr)
    epochs = -(-steps * settings.batch_size // len(predictor_probs))
    selector.train()
    batches = minibatches(len(predictor_probs), replace(settings, epochs=epochs))
    for batch in itertools.islice(batches, steps):
        loss = selector_loss(selector(predictor_probs[batch]), agrees[batch])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return selector.eval()


def choose_threshold(scores: np.ndarray, agrees: np.ndarray, target: float) -> float:
    """The lowest threshold τ whose hits (score ≥ τ) agree with the base model on at least `target` of them, so
    the hit rate is the largest the target allows on this data; +inf when not even the surest hit reaches it."""
    order = np.argsort(-scores, kind="stable")
    ranked = scores[order]
    precision = np.cumsum(agrees[order]) / np.arange(1, len(scores) + 1)
    # A threshold can only fall between distinct scores: the prefix of the k best must end where the score drops.
    cut = np.append(ranked[:-1] > ranked[1:], True)
    valid = np.flatnonzero((precision >= target) & cut)
    return float(ranked[valid[-1]]) if len(valid) else float("inf")


@dataclass(frozen=True)
class HitRates:
    """One cache alone at one threshold: how often it hits, how often its hits agree, and the agreement of the model
    with this cache in front (misses run the base model and agree)."""

    hit_rate: float
    agreement: float  # among hits; 1.0 when there are none
    overall: float

    @classmethod
    def at(cls, scores: np.ndarray, agrees: np.ndarray, threshold: float) -> HitRates:
        hits = scores >= threshold
        wrong = float(np.count_nonzero(hits & ~agrees.astype(bool)))
        count = float(np.count_nonzero(hits))
        return cls(
            hit_rate=count / len(scores),
            agreement=1.0 - wrong / count if count else 1.0,
            overall=1.0 - wrong / len(scores),
        )
