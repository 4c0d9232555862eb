"""Predictors and selectors: shapes per variant and block shape, the two losses by hand, threshold choice."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from adaserve.adaptive.gati.predictors import (
    DEFAULT_VARIANTS,
    TrainSettings,
    VariantSpec,
    build_predictor,
    distillation_loss,
    train_predictor,
)
from adaserve.adaptive.gati.selectors import HitRates, Selector, choose_threshold, selector_loss, train_selector


def architecture(name: str, shape: tuple[int, ...]) -> str | None:
    """The predictor's layers as text, e.g. 'AdaptiveAvgPool2d((4, 4)) Flatten Linear(512→512) ...'."""
    module = build_predictor(VariantSpec.parse(name), shape, 10)
    if module is None:
        return None
    parts = []
    for layer in module.modules():
        if isinstance(layer, torch.nn.Linear):
            parts.append(f"Linear({layer.in_features}→{layer.out_features})")
        elif isinstance(layer, torch.nn.Conv2d):
            parts.append(f"Conv({layer.in_channels}→{layer.out_channels}, k{layer.kernel_size[0]} s{layer.stride[0]})")
        elif isinstance(layer, torch.nn.AdaptiveAvgPool2d | torch.nn.AdaptiveAvgPool1d):
            parts.append(f"Pool{layer.output_size}")
    return " ".join(parts)


@pytest.mark.parametrize(
    ("shape", "expected"),
    [
        (
            (16, 14, 14),  # the example CNN's stage1: both Pool sizes halve the grid, so they coincide
            {
                "FC(1024)": "Linear(3136→1024) Linear(1024→10)",
                "FC(512)": "Linear(3136→512) Linear(512→10)",
                "Pool(8192)": "Pool(7, 7) Linear(784→512) Linear(512→10)",
                "Pool(4096)": "Pool(7, 7) Linear(784→512) Linear(512→10)",
                "Conv(3,1)": "Conv(16→4, k3 s1) Linear(784→10)",
                "Conv(5,2)": "Conv(16→4, k5 s2) Linear(196→10)",
            },
        ),
        (
            (128, 16, 16),  # ResNet-18's block 3 on CIFAR: the paper's Table 4 shapes
            {
                "FC(1024)": "Linear(32768→1024) Linear(1024→10)",
                "Pool(8192)": "Pool(8, 8) Linear(8192→512) Linear(512→10)",
                "Pool(4096)": "Pool(5, 5) Linear(3200→512) Linear(512→10)",
                "Conv(5,2)": "Conv(128→32, k5 s2) Linear(2048→10)",
            },
        ),
        (
            (256,),  # flat: no Conv, and Pool only where it pools
            {"FC(512)": "Linear(256→512) Linear(512→10)", "Pool(8192)": None, "Conv(3,1)": None},
        ),
        ((10000,), {"Pool(4096)": "Pool4096 Linear(4096→512) Linear(512→10)"}),
    ],
)
def test_predictor_shapes_follow_the_block(shape: tuple[int, ...], expected: dict[str, str | None]) -> None:
    for name, layers in expected.items():
        assert architecture(name, shape) == layers, name
        module = build_predictor(VariantSpec.parse(name), shape, 10)
        if module is not None:
            assert module(torch.rand(2, *shape)).shape == (2, 10)


def test_variant_names_parse_and_print() -> None:
    assert [v.name for v in DEFAULT_VARIANTS] == [
        "FC(1024)",
        "FC(512)",
        "Pool(8192)",
        "Pool(4096)",
        "Conv(3,1)",
        "Conv(5,2)",
    ]
    assert VariantSpec.parse(" conv( 3 , 1 ) ") == VariantSpec("Conv", 3, 1)
    for bad in ("FC(0)", "Conv(3)", "FC(3,1)", "MLP(5)"):
        with pytest.raises(ValueError, match="predictor variant"):
            VariantSpec.parse(bad)


def test_distillation_loss_by_hand() -> None:
    teacher = torch.tensor([[0.7, 0.2, 0.1]])
    labels = torch.tensor([0])
    # Logits equal to the teacher's log-probabilities: the soft term vanishes, the hard term is −log 0.7.
    logits = teacher.log()
    hard = distillation_loss(logits, teacher, labels, temperature=1.0, soft_weight=0.0)
    soft = distillation_loss(logits, teacher, labels, temperature=1.0, soft_weight=1.0)
    assert hard.item() == pytest.approx(-math.log(0.7))
    assert soft.item() == pytest.approx(0.0, abs=1e-6)
    # Uniform logits against the teacher at T = 2: w·T²·KL(softmax(log Y / 2) ‖ uniform) + (1 − w)·log 3.
    soft_targets = torch.softmax(teacher.log() / 2, 1)[0]
    kl = float((soft_targets * (soft_targets / (1 / 3)).log()).sum())
    mixed = distillation_loss(torch.zeros(1, 3), teacher, labels, temperature=2.0, soft_weight=0.7)
    assert mixed.item() == pytest.approx(0.7 * 4 * kl + 0.3 * math.log(3), rel=1e-5)


def test_selector_loss_charges_false_positives_more() -> None:
    zero = torch.zeros(2, 1)  # σ(0) = 0.5 for both rows
    assert selector_loss(zero, torch.tensor([1, 1]), 4.0).item() == pytest.approx(math.log(2))
    assert selector_loss(zero, torch.tensor([0, 0]), 4.0).item() == pytest.approx(4 * math.log(2))
    assert selector_loss(zero, torch.tensor([1, 0]), 4.0).item() == pytest.approx(2.5 * math.log(2))
    sure_hit = torch.tensor([[3.0]])  # a confident hit that is wrong costs w_FP · softplus(3)
    assert selector_loss(sure_hit, torch.tensor([0]), 4.0).item() == pytest.approx(4 * math.log1p(math.exp(3)))


def test_choose_threshold_takes_the_most_hits_that_reach_the_target() -> None:
    scores = np.array([0.9, 0.8, 0.8, 0.7, 0.6, 0.5, 0.4])
    agrees = np.array([1, 1, 0, 1, 1, 0, 1], dtype=bool)
    # Prefixes: 1/1, (tie at 0.8) 2/3, 3/4, 4/5, 4/6, 5/7 agree.
    assert choose_threshold(scores, agrees, 0.8) == 0.6
    assert choose_threshold(scores, agrees, 0.7) == 0.4  # 5/7 = 0.714
    assert choose_threshold(scores, agrees, 0.9) == 0.9
    assert choose_threshold(scores, ~agrees, 0.5) == math.inf  # the surest hit already disagrees
    rates = HitRates.at(scores, agrees, 0.6)
    assert (rates.hit_rate, rates.agreement, rates.overall) == pytest.approx((5 / 7, 4 / 5, 6 / 7))
    assert HitRates.at(scores, agrees, math.inf) == HitRates(0.0, 1.0, 1.0)


def test_threshold_from_one_split_holds_on_another() -> None:
    """A toy predictor whose confidence tracks correctness: a threshold set on calibration rows reaches the target
    on fresh rows of the same distribution (within sampling noise)."""
    rng = np.random.default_rng(0)

    def split(rows: int) -> tuple[np.ndarray, np.ndarray]:
        scores = rng.random(rows)
        return scores, rng.random(rows) < 0.5 + 0.5 * scores  # P(agree | score) = 0.5 + score / 2

    scores, agrees = split(20000)
    threshold = choose_threshold(scores, agrees, 0.9)
    fresh = HitRates.at(*split(20000), threshold)
    assert threshold == pytest.approx(0.6, abs=0.05)  # hits agree 0.5 + (1 + τ)/4 on average: 0.9 at τ = 0.6
    assert fresh.agreement == pytest.approx(0.9, abs=0.01) and fresh.hit_rate == pytest.approx(0.4, abs=0.05)


def test_training_fits_predictor_and_selector() -> None:
    torch.manual_seed(0)
    activations = torch.randn(512, 6)
    teacher = torch.softmax(activations[:, :3] * 3, 1)
    labels = teacher.argmax(1)
    predictor = build_predictor(VariantSpec.parse("FC(16)"), (6,), 3)
    assert predictor is not None
    train_predictor(predictor, activations, teacher, labels, TrainSettings(epochs=60))
    with torch.no_grad():
        probs = torch.softmax(predictor(activations), 1)
    agrees = probs.argmax(1) == labels
    assert agrees.float().mean() > 0.9
    selector = train_selector(Selector(3), probs, agrees, TrainSettings(), steps=300)
    with torch.no_grad():
        scores = torch.sigmoid(selector(probs)).squeeze(1)
    assert scores[agrees].mean() > scores[~agrees].mean()
