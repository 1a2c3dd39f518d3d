"""The `blank` method: CapCal's content-agnostic calibration (Lv et al., ACL 2026,
arXiv 2604.10150), a pure function of two records per query.

The same prompt is asked twice: as it is (x) and with every candidate's content replaced by a
neutral placeholder (x_blank: a grey picture, an empty text; lad.data.blank makes it). What the
model still prefers among blank candidates is position, so CapCal subtracts its excess over
uniform:

    S_j = P(c_j|x) − α · (P(c_j|x_blank) − 1/N)

α = `blank_alpha`: a fixed number (default 1), or "entropy": α = H(P(·|x)) / log N, the
normalised entropy of the query's own distribution (an unsure model is corrected more, a sure
one less). One extra forward pass per query, no calibration set.
"""

from __future__ import annotations

import numpy as np

from lad.core.records import RecordSet
from lad.errors import RecordError

ENTROPY = "entropy"


def blank_alpha(records: RecordSet, alpha: float | str) -> np.ndarray:
    """(R, 1) α per record: the fixed number, or the normalised entropy of P(·|x)."""
    if alpha != ENTROPY:
        return np.full((len(records), 1), float(alpha))
    p = np.exp(records.logprobs)
    with np.errstate(divide="ignore", invalid="ignore"):
        h = -np.where(p > 0, p * records.logprobs, 0.0).sum(axis=1, keepdims=True)
    return np.clip(h / np.log(records.num_candidates), 0.0, 1.0)


def blank_scores(records: RecordSet, blank: RecordSet, alpha: float | str) -> np.ndarray:
    """(R, N) S_j of CapCal for each record, from its blank prompt's record in `blank` (the same
    item and ordering; lad.core.methods.choose checks they are given, of the same N)."""
    n = records.num_candidates
    index = {key: k for k, key in enumerate(blank.keys())}
    rows = [index.get(key, -1) for key in records.keys()]  # noqa: SIM118 (a RecordSet's keys)
    if -1 in rows:
        k = rows.index(-1)
        raise RecordError(
            f"blank records lack item {str(records.items[k])!r}, ordering "
            f"{int(records.ordering[k])} ({rows.count(-1)} records affected)"
        )
    rows_array = np.array(rows, dtype=np.int64)
    if not np.array_equal(blank.order[rows_array], records.order):
        raise RecordError("blank records show their items in other orders than the records")
    p_blank = np.exp(blank.logprobs[rows_array])
    return np.exp(records.logprobs) - blank_alpha(records, alpha) * (p_blank - 1.0 / n)
