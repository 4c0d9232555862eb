"""The paper's baselines for early exit (§2.1.1, §7.1.1), built from the trained base network.

- quantization: `torch.ao` dynamic int8 reaches only a CNN's Linear layers, so FX static post-training int8
  (x86 / fbgemm, calibrated on train images) is measured beside it for the convs;
- structured pruning: whole channels with the least L1 norm removed and the network rebuilt physically smaller
  (a mask alone saves no time), then briefly fine-tuned;
- a cascade: the distilled student answers when its max-softmax clears a threshold set on held-out rows for the
  agreement target, else the base model runs; the threshold is certified as GATI's thresholds are (`certify`).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable

import numpy as np
import torch
from torch import nn
from torch.ao.quantization import get_default_qconfig_mapping, quantize_dynamic
from torch.ao.quantization.quantize_fx import convert_fx, prepare_fx

from adaserve.adaptive.gati import certify
from adaserve.zoo import BasicBlock

Model = Callable[[torch.Tensor], torch.Tensor]


def dynamic_int8(model: nn.Module) -> nn.Module:
    """Linear layers with int8 weights and activations quantized on the fly (the convs stay FP32)."""
    return quantize_dynamic(copy.deepcopy(model).eval(), {nn.Linear}, dtype=torch.qint8)


def static_int8(model: nn.Module, calibration: np.ndarray, batch_size: int = 100) -> nn.Module:
    """FX graph-mode post-training int8 of every conv and Linear (BN folded, x86 backend), calibrated on
    `calibration` rows."""
    torch.backends.quantized.engine = "x86"
    example = (torch.from_numpy(calibration[:1]),)
    prepared = prepare_fx(copy.deepcopy(model).eval(), get_default_qconfig_mapping("x86"), example)
    with torch.inference_mode():
        for start in range(0, len(calibration), batch_size):
            prepared(torch.from_numpy(calibration[start : start + batch_size]))
    return convert_fx(prepared)


def prune_channels(model: nn.Module, fraction: float) -> nn.Module:
    """A copy with `fraction` of the prunable channels removed by L1 norm: inside every ResNet basic block the
    channels between its two convs (the residual width stays); in a plain conv chain (VGG) every conv's outputs,
    the next conv's and the head's inputs with them."""
    pruned = copy.deepcopy(model).eval()
    blocks = [m for m in pruned.modules() if isinstance(m, BasicBlock)]
    if blocks:
        for block in blocks:
            _prune_block(block, fraction)
    else:
        _prune_chain(pruned, fraction)
    return pruned


def _keep(weight: torch.Tensor, fraction: float) -> torch.Tensor:
    """Output channels with the largest L1 norm, in their order."""
    count = max(1, round(weight.shape[0] * (1 - fraction)))
    norms = weight.detach().abs().flatten(1).sum(1)
    return norms.topk(count).indices.sort().values


def _prune_block(block: BasicBlock, fraction: float) -> None:
    keep = _keep(block.conv1.weight, fraction)
    conv1, conv2, bn1 = block.conv1, block.conv2, block.bn1
    block.conv1 = _conv(conv1, conv1.weight[keep], None, conv1.in_channels, len(keep))
    block.conv2 = _conv(conv2, conv2.weight[:, keep], None, len(keep), conv2.out_channels)
    block.bn1 = nn.BatchNorm2d(len(keep))
    state = {name: value[keep] for name, value in bn1.state_dict().items() if value.ndim}
    block.bn1.load_state_dict(state | {"num_batches_tracked": bn1.num_batches_tracked})
    block.eval()


def _prune_chain(model: nn.Module, fraction: float) -> None:
    convs: list[tuple[nn.Module, str, nn.Conv2d]] = [
        (parent, name, child)
        for parent in model.modules()
        for name, child in parent.named_children()
        if isinstance(child, nn.Conv2d)
    ]
    previous: torch.Tensor | None = None
    for parent, name, conv in convs:
        keep = _keep(conv.weight, fraction)
        weight = conv.weight[keep] if previous is None else conv.weight[keep][:, previous]
        bias = conv.bias[keep] if conv.bias is not None else None
        in_channels = conv.in_channels if previous is None else len(previous)
        setattr(parent, name, _conv(conv, weight, bias, in_channels, len(keep)))
        previous = keep
    assert previous is not None
    head = model.get_submodule("head")
    assert isinstance(head, nn.Sequential)
    index, linear = next((i, m) for i, m in enumerate(head) if isinstance(m, nn.Linear))
    spatial = linear.in_features // convs[-1][2].out_channels  # the head flattens channel by channel
    columns = (previous[:, None] * spatial + torch.arange(spatial)).flatten()
    smaller = nn.Linear(len(columns), linear.out_features)
    smaller.load_state_dict({"weight": linear.weight[:, columns], "bias": linear.bias})
    head[index] = smaller


def _conv(
    like: nn.Conv2d, weight: torch.Tensor, bias: torch.Tensor | None, in_channels: int, out_channels: int
) -> nn.Conv2d:
    conv = nn.Conv2d(
        in_channels,
        out_channels,
        like.kernel_size,  # type: ignore[arg-type]
        stride=like.stride,  # type: ignore[arg-type]
        padding=like.padding,  # type: ignore[arg-type]
        bias=bias is not None,
    )
    state = {"weight": weight.detach().clone()} | ({"bias": bias.detach().clone()} if bias is not None else {})
    conv.load_state_dict(state)
    return conv


def cascade_threshold(confidence: np.ndarray, agrees: np.ndarray, target: float) -> float:
    """The cascade's threshold for `target`, set on held-out rows as GATI's composition sets its own: tuned on half
    the rows at each of `certify.levels`, the lowest the other half's fixed-sequence test accepts (+inf: none, so the
    base model answers every row)."""
    tune, check = certify.split(len(confidence))
    thresholds = [_tuned_threshold(confidence[tune], agrees[tune], level) for level in certify.levels(target)]
    wrong = [int(np.count_nonzero((confidence[check] >= t) & ~agrees[check])) for t in thresholds]
    count = certify.accepted(wrong, len(check), target)
    return min(thresholds[:count], default=math.inf)


def _tuned_threshold(confidence: np.ndarray, agrees: np.ndarray, required: float) -> float:
    """The lowest max-softmax threshold at which the cascade's overall agreement on these rows (the student's
    answer above it, the base model's below) is at least `required`; +inf when no threshold is."""
    order = np.argsort(-confidence, kind="stable")
    ranked = confidence[order]
    overall = 1 - np.cumsum(~agrees[order]) / len(confidence)
    holds = overall >= required
    holds[:-1] &= ranked[:-1] > ranked[1:]  # cut only where the confidence drops
    return float(ranked[np.flatnonzero(holds)[-1]]) if holds.any() else math.inf


class Cascade:
    """The student first; rows whose max-softmax clears `threshold` are answered by it, the rest by `base`."""

    def __init__(self, student: Model, base: Model, threshold: float) -> None:
        self.student = student
        self.base = base
        self.threshold = threshold

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        logits = self.student(x)
        confident = torch.softmax(logits, 1).amax(1) >= self.threshold
        if bool(confident.all()):
            return logits
        out = logits.clone()
        rest = ~confident
        out[rest] = self.base(x[rest])
        return out
