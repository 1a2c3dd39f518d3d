"""How much of a score is position bias: flip rate, CircularEval accuracy, bootstrap intervals,
a permutation test of position dependence, errors due to order and the noise floor.

Pure functions of records and one method's chosen positions (R,) (-1: unparseable, never right,
never agreeing with another choice); percentages as in lad.core.metrics. docs/metrics.md defines
each number with its formula and a worked example (tests/test_audit.py checks it).

    audit = audit_method(records, chosen, Bootstrap(resamples=1000, seed=0, level=95.0))
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from lad.core.records import RecordSet
from lad.errors import LadError
from lad.io import limits

POSITION_TEST = "permutation of answer positions within questions"


@dataclass(frozen=True)
class Bootstrap:
    """Resampling of questions (items) with replacement; B = `resamples` draws from
    numpy.random.default_rng(seed) (the permutation test draws from default_rng(seed + 1)),
    percentile intervals at `level` percent."""

    resamples: int = 1000
    seed: int = 0
    level: float = 95.0

    def __post_init__(self) -> None:
        if not (isinstance(self.resamples, int) and self.resamples >= 1):
            raise LadError(f"bootstrap resamples must be an integer >= 1, got {self.resamples!r}")
        limits.BOOTSTRAP.check(self.resamples, f"--bootstrap {self.resamples}")
        if not (isinstance(self.seed, int) and self.seed >= 0):
            raise LadError(f"bootstrap seed must be an integer >= 0, got {self.seed!r}")
        if not 0 < self.level < 100:
            raise LadError(f"bootstrap level must be a percentage in (0, 100), got {self.level!r}")

    def to_dict(self) -> dict[str, Any]:
        return {"B": self.resamples, "seed": self.seed, "level": float(self.level)}


DEFAULT_BOOTSTRAP = Bootstrap()


@dataclass(frozen=True)
class Questions:
    """Per-question sufficient statistics of one method (Q questions, S shuffles, N positions).

    right_by_shuffle, shown_by_shuffle: (Q, S) right / asked records per shuffle index.
    right_at, shown_at: (Q, N) right / asked records whose answer sits at each position.
    flip_share: (Q,) share of the question's ordering pairs that flip (nan: one ordering).
    """

    right_by_shuffle: np.ndarray
    shown_by_shuffle: np.ndarray
    right_at: np.ndarray
    shown_at: np.ndarray
    flip_share: np.ndarray


def question_index(records: RecordSet) -> tuple[np.ndarray, np.ndarray]:
    """Sorted question ids and each record's index among them (independent of record order)."""
    return np.unique(records.items, return_inverse=True)


def chosen_candidates(records: RecordSet, pred: np.ndarray) -> np.ndarray:
    """(R,) the chosen candidate as content (index into the item's images), -1 when none."""
    safe = np.maximum(pred, 0)[:, None]
    return np.where(pred >= 0, np.take_along_axis(records.order, safe, 1)[:, 0], -1)


def flip_share_by_question(question: np.ndarray, chosen: np.ndarray, n: int) -> np.ndarray:
    """(Q,) 1 − Σ_c C(k_c, 2) / C(m, 2): the share of a question's pairs of orderings whose
    chosen candidates differ, k_c of its m orderings choosing candidate c (an unparseable choice
    agrees with none)."""
    q = int(question.max()) + 1
    parsed = chosen >= 0
    k = np.bincount(question[parsed] * n + chosen[parsed], minlength=q * n).reshape(q, n)
    m = np.bincount(question, minlength=q).astype(float)
    pairs = m * (m - 1) / 2
    agree = (k * (k - 1) / 2).sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(pairs > 0, 1.0 - agree / pairs, np.nan)


def questions(records: RecordSet, pred: np.ndarray, question: np.ndarray) -> Questions:
    n = records.num_candidates
    q = int(question.max()) + 1
    right = (pred == records.answer).astype(float)
    shuffles, shuffle = np.unique(records.ordering, return_inverse=True)
    s = len(shuffles)

    def table(column: np.ndarray, width: int, weights: np.ndarray | None) -> np.ndarray:
        cells = np.bincount(question * width + column, weights=weights, minlength=q * width)
        return cells.reshape(q, width).astype(float)

    return Questions(
        right_by_shuffle=table(shuffle, s, right),
        shown_by_shuffle=table(shuffle, s, None),
        right_at=table(records.answer, n, right),
        shown_at=table(records.answer, n, None),
        flip_share=flip_share_by_question(question, chosen_candidates(records, pred), n),
    )


def _ratio(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(den > 0, 100.0 * num / np.where(den > 0, den, 1), np.nan)


def recall_std(recall: np.ndarray) -> np.ndarray:
    """RStd (recall standard deviation) over the last axis: the sample std of the recall at the
    positions that have answers (0 with fewer than two)."""
    present = ~np.isnan(recall)
    count = present.sum(axis=-1)
    mean = np.where(present, recall, 0).sum(axis=-1) / np.maximum(count, 1)
    sq = np.where(present, (recall - mean[..., None]) ** 2, 0).sum(axis=-1)
    return np.where(count > 1, np.sqrt(sq / np.maximum(count - 1, 1)), 0.0)


def weighted_statistics(table: Questions, weights: np.ndarray) -> dict[str, np.ndarray]:
    """Acc, RStd, flip rate and recall by position of questions counted `weights` (B, Q) times
    each; each row is one bootstrap resample (a row of ones: the metrics themselves)."""
    acc_t = _ratio(weights @ table.right_by_shuffle, weights @ table.shown_by_shuffle)
    recall = _ratio(weights @ table.right_at, weights @ table.shown_at)
    has_pairs = ~np.isnan(table.flip_share)
    flips = weights[:, has_pairs] @ table.flip_share[has_pairs]
    flip = _ratio(flips, weights[:, has_pairs].sum(axis=1))
    # A shuffle no drawn question was asked under has no accuracy; every row draws some.
    acc = np.nanmean(acc_t, axis=1)
    return {"acc": acc, "rstd": recall_std(recall), "flip_rate": flip, "recall": recall}


def bootstrap_weights(num_questions: int, boot: Bootstrap) -> np.ndarray:
    """(B, Q) how often each question is drawn in each resample: resample b draws the
    questions rng.integers(0, Q, size=(B, Q))[b], rng = default_rng(seed)."""
    rng = np.random.default_rng(boot.seed)
    drawn = rng.integers(0, num_questions, size=(boot.resamples, num_questions))
    rows = np.arange(boot.resamples)[:, None] * num_questions
    counts = np.bincount((rows + drawn).ravel(), minlength=boot.resamples * num_questions)
    return counts.reshape(boot.resamples, num_questions).astype(float)


def percentile_interval(samples: np.ndarray, level: float) -> list[float] | None:
    """[lo, hi]: the (100 − level)/2 and (100 + level)/2 percentiles (numpy's linear rule) of
    the resamples where the statistic is defined; None where it never is."""
    finite = samples[~np.isnan(samples)]
    if not len(finite):
        return None
    tail = (100.0 - level) / 2
    lo, hi = np.percentile(finite, [tail, 100.0 - tail])
    return [float(lo), float(hi)]


def permuted_right_at(table: Questions, draws: int, rng: np.random.Generator) -> np.ndarray:
    """(draws, N) right records at each answer position after permuting, within each question,
    the answer positions among its records: its k right records then fall on a uniformly random
    k of its m records, so their count at each position is multivariate hypergeometric (k draws
    from its records' positions). Questions right under all or none of their orderings are fixed."""
    right = table.right_at.sum(axis=1).astype(np.int64)
    shown = table.shown_at.astype(np.int64)
    asked = shown.sum(axis=1)
    right_at = np.tile(shown[right == asked].sum(axis=0), (draws, 1))
    mixed = (right > 0) & (right < asked)
    kinds, counts = np.unique(
        np.column_stack([shown[mixed], right[mixed]]), axis=0, return_counts=True
    )
    for kind, count in zip(kinds, counts, strict=True):  # questions alike, drawn together
        drawn = rng.multivariate_hypergeometric(kind[:-1], kind[-1], size=(draws, count))
        right_at += drawn.sum(axis=1)
    return right_at


def position_test(table: Questions, boot: Bootstrap) -> dict[str, Any]:
    """Permutation test of H0 "within a question, being right does not depend on where the
    answer sits": statistic RStd; each of B draws permutes the answer positions among each
    question's records (`permuted_right_at`). p = (1 + #{RStd_perm ≥ RStd_obs}) / (B + 1);
    None when every question was asked once (nothing to permute: the test cannot tell)."""
    shown = table.shown_at.sum(axis=0)
    observed = recall_std(_ratio(table.right_at.sum(axis=0), shown))
    p_value = None
    if table.shown_at.sum(axis=1).max() > 1:
        right_at = permuted_right_at(table, boot.resamples, np.random.default_rng(boot.seed + 1))
        permuted = recall_std(_ratio(right_at, shown[None, :]))
        p_value = (1 + int((permuted >= observed - 1e-9).sum())) / (boot.resamples + 1)
    return {
        "method": POSITION_TEST,
        "statistic": "rstd",
        "observed": float(observed),
        "p_value": p_value,
        "permutations": boot.resamples,
    }


def noise_floor(records: RecordSet, first: np.ndarray, again: np.ndarray) -> dict[str, Any]:
    """The same orderings asked twice: share of records whose chosen candidate differs between
    the two askings (an unparseable choice agrees with none)."""
    a, b = chosen_candidates(records, first), chosen_candidates(records, again)
    flips = (a != b) | (a < 0) | (b < 0)
    return {"flip_rate": float(100.0 * flips.mean()), "records": len(records)}


def audit_method(records: RecordSet, pred: np.ndarray, boot: Bootstrap) -> dict[str, Any]:
    """metrics.json's audit keys of one method (docs/metrics.md)."""
    _, question = question_index(records)
    table = questions(records, pred, question)
    per_question_all, per_question_n = table.right_at.sum(axis=1), table.shown_at.sum(axis=1)
    flip = weighted_statistics(table, np.ones((1, len(per_question_n))))["flip_rate"][0]
    # Errors due to order: the wrong records whose question is right under some other ordering
    # ("knows it, says it wrong"); None without errors.
    known = (per_question_all > 0)[question[pred != records.answer]]
    drawn = weighted_statistics(table, bootstrap_weights(len(per_question_n), boot))
    ci = {k: percentile_interval(drawn[k], boot.level) for k in ("acc", "rstd", "flip_rate")}
    ci["recall_by_position"] = [percentile_interval(r, boot.level) for r in drawn["recall"].T]
    return {
        "flip_rate": None if np.isnan(flip) else float(flip),
        "circular_acc": float(100.0 * np.mean(per_question_all == per_question_n)),
        "any_order_acc": float(100.0 * np.mean(per_question_all > 0)),
        "errors_due_to_order": float(100.0 * known.mean()) if len(known) else None,
        "ci": ci,
        "position_test": position_test(table, boot),
    }


def order_gaps(methods: dict[str, dict[str, Any]]) -> dict[str, float]:
    """Accuracy gaps vanilla → perm-avg → LAD (points) among the methods present."""
    pairs = (("lad", "vanilla"), ("perm-avg", "vanilla"), ("perm-avg", "lad"))
    return {
        f"{a}_minus_{b}".replace("-", "_"): float(methods[a]["acc"] - methods[b]["acc"])
        for a, b in pairs
        if a in methods and b in methods
    }
