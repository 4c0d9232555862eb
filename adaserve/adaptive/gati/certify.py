"""Which tuned early-exit settings hold an agreement target: Learn then Test (Angelopoulos et al., 2021).

Tuning thresholds for the lowest latency whose agreement on some rows reaches a target overfits those rows: the
tuner lowers each threshold row by row until the agreement sits exactly at the target there. On the benchmark
ResNet's build, thresholds tuned to .99 on 1,500 calibrate rows agreed .983 on the other 1,500, and a margin of two
standard errors above the target still ended at .9888 on held-out rows.

So the calibrate rows are split in two. Settings are tuned on one half (`tune`) at a sequence of agreement levels,
strictest first (`levels`). On the other half (`check`) each setting in turn is tested against the null hypothesis
"its agreement is below the target" with an exact binomial test, and testing stops at the first setting it cannot
reject (`accepted`). The order was fixed before the check rows were seen, so this fixed-sequence test needs no
correction for testing many settings: with probability at least 1 − `risk`, every accepted setting holds the target
on the distribution the rows came from, and any of them may be deployed. When none is accepted the model runs
whole, which holds any target.

The test stops at the first failure, so the sequence should run from safe to risky. Composition keeps one set of
exits and varies only their thresholds: when each level chose its own fastest set, the strictest level's (tuned to
agree on every tune row, the most overfit setting of all) picked odd exits, disagreed on 13 of 1,500 check rows,
and ended the test before the settings that would pass.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from scipy.stats import binom

__all__ = ["DEFAULT_RISK", "accepted", "levels", "p_value", "split"]

#: The chance, at most, that a deployed composition's agreement is below its target.
DEFAULT_RISK = 0.05
#: The agreement levels settings are tuned for, as multiples of the error the target allows: from no error at all
#: to half as much again as the target allows (the tune rows are a sample too, and may be the harder half).
ERROR_MULTIPLES = tuple(float(m) for m in np.linspace(0.0, 1.5, 13))


def split(rows: int) -> tuple[np.ndarray, np.ndarray]:
    """Indices of the tune rows and of the check rows among `rows`: alternate rows, so two halves of one random
    sample stay alike even where the rows came in an order (adaptation appends its window's rows)."""
    index = np.arange(rows)
    return index[0::2], index[1::2]


def levels(target: float, floor: float = 0.0) -> list[float]:
    """The agreements to tune for, strictest first; none below `floor`."""
    return [level for m in ERROR_MULTIPLES if (level := 1.0 - (1.0 - target) * m) >= floor]


def p_value(disagreements: int, rows: int, target: float) -> float:
    """The chance of at most `disagreements` among `rows` if the agreement were only `target` (exact binomial)."""
    return float(binom.cdf(disagreements, rows, 1.0 - target))


def accepted(disagreements: Sequence[int], rows: int, target: float, risk: float = DEFAULT_RISK) -> int:
    """How many of the settings, in the order given (strictest first), the fixed-sequence test accepts: each
    setting's disagreements on the same `rows` check rows, tested at level `risk` until the first that fails."""
    if not 0.0 < risk < 1.0:
        raise ValueError(f"risk must be in (0, 1), got {risk}")
    count = 0
    for wrong in disagreements:
        if p_value(wrong, rows, target) > risk:
            break
        count += 1
    return count
