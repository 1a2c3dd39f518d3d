"""Records: one per (item, ordering), the unit every method and metric is computed from.

The format is the contract of DESIGN.md; see `Record` for each field.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Record:
    """The model's evidence for one item shown in one ordering.

    item:      the benchmark item's id.
    ordering:  which ordering of the item (shuffle index t, or cyclic shift s for calibration and
               permutation-averaging records).
    order:     (N,) order[p] is the index into the item's images shown at position p.
    answer:    position (0-based) of the correct image in this ordering.
    logprobs:  (N,) logprobs[p] = log P(c_{p+1} | x), exact over the label set (sums to 1 in prob).
    attention: (L, N) attention[l][p] = a^(l)_p(x), Eq. 6: the last prompt token's head-averaged
               attention mass on image p's tokens in decoder layer l.
    extra:     anything else (generated replies, token counts); kept, ignored by methods.
    """

    item: str
    ordering: int
    order: list[int]
    answer: int
    logprobs: list[float]
    attention: list[list[float]]
    extra: dict[str, Any] = field(default_factory=dict)
