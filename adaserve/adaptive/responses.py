"""One request's response parameters when its rows ran in several batches.

Ebird's scheduler gives a request's contiguous slots to whichever workers are idle, so a request of 7 rows may run
as 4 + 2 + 1 rows on three workers. Each batch reports the parameters of its part; they are combined here by each
technique's rule. (Before, the last part's values stood for the whole request: a request whose first rows a learned
cache answered reported `exited_rows: 0`.) No torch here: the server imports it.

- GATI (`exit_block`, `exited_rows`): the rows the caches answered add up; the block is the last one when any row
  ran to the end, else the deepest exit any part took (as the runtime reports a request wholly in one batch).
- SLO-NNs (`k`, `interference`): means over the rows, as the runtime reports them for one batch's rows.
- Any other key: the last part's value.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["Part", "combine"]

#: A part of a request: its rows and the parameters its batch reported for them.
Part = tuple[int, Mapping[str, Any]]

#: Keys reported as a mean over the rows, and the digits they are rounded to.
ROW_MEANS = {"k": 4, "interference": 2}


def combine(parts: Sequence[Part], blocks: Sequence[str]) -> dict[str, Any]:
    """The request's parameters from its parts in row order; `blocks`: the model's block chain in order (for GATI's
    deepest exit; empty for a model without learned caches)."""
    if len(parts) == 1:
        return dict(parts[0][1])
    combined: dict[str, Any] = {}
    for _, values in parts:
        combined.update(values)
    if "exited_rows" in combined:
        combined.update(_exits(parts, blocks))
    for key, digits in ROW_MEANS.items():
        weighted = [(rows, values[key]) for rows, values in parts if key in values]
        if weighted:
            total = sum(rows for rows, _ in weighted)
            combined[key] = round(sum(rows * value for rows, value in weighted) / total, digits)
    return combined


def _exits(parts: Sequence[Part], blocks: Sequence[str]) -> dict[str, Any]:
    exiting = [(rows, values) for rows, values in parts if "exited_rows" in values]
    exited = sum(int(values["exited_rows"]) for _, values in exiting)
    whole = [values["exit_block"] for rows, values in exiting if values["exited_rows"] < rows]
    if whole:  # a part with rows that ran to the end reports the last block
        return {"exited_rows": exited, "exit_block": whole[0]}
    taken = [values["exit_block"] for _, values in exiting]
    deepest = max(taken, key=lambda block: blocks.index(block) if block in blocks else -1)
    return {"exited_rows": exited, "exit_block": deepest}
