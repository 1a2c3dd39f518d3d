"""Metrics (paper §5.2) from records and each method's chosen positions, as percentages.

Acc is the accuracy per shuffle index (record `ordering`), reported as mean ± sample std over the
T shuffles; RStd is the sample std over the N positions of the recall at each position; Cons. is
the share of items for which the same *image* (via `order`) is chosen under all their orderings.
A prediction of -1 (an unparseable reply) counts as wrong and is reported as `parse_failure`.
When vanilla is among the methods, each method also gets `delta_rstd`, its RStd minus vanilla's
(Table 5's ΔRStd: negative is less position bias). Each method also gets lad.core.audit's numbers
(flip rate, CircularEval accuracy, bootstrap intervals, the position test, errors due to order;
docs/metrics.md), and `format_panel` prints them below the table.

    metrics = compute_metrics(records, {"vanilla": predict("vanilla", records)})
    print(format_table(metrics))
"""

from __future__ import annotations

from typing import Any

import numpy as np

from lad.core import audit
from lad.core.audit import DEFAULT_BOOTSTRAP, Bootstrap
from lad.core.methods import METHODS
from lad.core.records import RecordSet
from lad.errors import LadError


def _percent(x: float) -> float:
    return float(100.0 * x)


def _check_predictions(records: RecordSet, method: str, pred: Any) -> np.ndarray:
    arr = np.asarray(pred)
    n = records.num_candidates
    if arr.shape != (len(records),) or not np.issubdtype(arr.dtype, np.integer):
        raise LadError(
            f"predictions for '{method}' must be ({len(records)},) integer positions, "
            f"got shape {arr.shape} of {arr.dtype}"
        )
    bad = arr[(arr < -1) | (arr >= n)]
    if len(bad):
        raise LadError(f"'{method}' predicts position {bad[0]}; positions are 0..{n - 1} or -1")
    return arr.astype(np.int64)


def method_metrics(
    records: RecordSet, pred: np.ndarray, item_index: np.ndarray, n_items: int
) -> dict[str, Any]:
    """Acc, RStd, Cons., recall/selection by position and confusion for one method."""
    n = records.num_candidates
    correct = pred == records.answer
    acc_t = np.array([correct[records.ordering == t].mean() for t in np.unique(records.ordering)])
    shown = np.bincount(records.answer, minlength=n)  # records whose answer is at each position
    right = np.bincount(records.answer, weights=correct, minlength=n)
    recall = [_percent(r / s) if s else None for r, s in zip(right, shown, strict=True)]
    parsed = pred >= 0
    pairs = np.bincount(records.answer[parsed] * n + pred[parsed], minlength=n * n)
    confusion = pairs.reshape(n, n) / np.maximum(shown, 1)[:, None]  # rows without answers: 0
    present = [x for x in recall if x is not None]
    # Cons.: the items whose chosen image is the same (and parsed) under all their orderings.
    chosen = audit.chosen_candidates(records, pred)
    lo = np.full(n_items, np.iinfo(np.int64).max)
    hi = np.full(n_items, -2)
    np.minimum.at(lo, item_index, chosen)
    np.maximum.at(hi, item_index, chosen)
    out: dict[str, Any] = {
        "acc": _percent(acc_t.mean()),
        "acc_std": _percent(acc_t.std(ddof=1)) if len(acc_t) > 1 else 0.0,
        "rstd": float(np.std(present, ddof=1)) if len(present) > 1 else 0.0,
        "cons": _percent(float(np.mean((lo == hi) & (lo >= 0)))),
        "recall_by_position": recall,
        "selection_by_position": [
            _percent(x) for x in np.bincount(pred[pred >= 0], minlength=n) / len(pred)
        ],
        "confusion": (100.0 * confusion).tolist(),
        "acc_by_shuffle": [_percent(x) for x in acc_t],
    }
    if (pred == -1).any():
        out["parse_failure"] = _percent(np.mean(pred == -1))
    return out


def compute_metrics(
    records: RecordSet,
    predictions_by_method: dict[str, Any],
    *,
    costs: dict[str, float] | None = None,
    bootstrap: Bootstrap | None = DEFAULT_BOOTSTRAP,
    repeats: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """metrics.json (docs/formats.md) for each method's (R,) chosen positions (-1 = unparseable).

    `costs` gives forward passes per prediction by method; methods computed from records default
    to 1 (perm-avg: N). `bootstrap` sets the audit's resampling (None: no audit keys, e.g. for
    sweeps); `repeats` the chosen positions of the same records asked again, by method, whose
    disagreement is the noise floor. Independent of the order of the records.
    """
    if not len(records):
        raise LadError("no records to compute metrics on")
    n = records.num_candidates
    names, item_index = np.unique(records.items, return_inverse=True)
    known = {**{name: m.forward_passes(n) for name, m in METHODS.items()}, **(costs or {})}
    methods = {}
    for method, pred in predictions_by_method.items():
        chosen = _check_predictions(records, method, pred)
        m = method_metrics(records, chosen, item_index, len(names))
        cost = known.get(method)
        m["forward_passes_per_item"] = None if cost is None else float(cost)
        if bootstrap is not None:
            m.update(audit.audit_method(records, chosen, bootstrap))
        if repeats and method in repeats:
            again = _check_predictions(records, f"{method} (asked again)", repeats[method])
            m["noise_floor"] = audit.noise_floor(records, chosen, again)
        methods[method] = m
    if "vanilla" in methods:
        for m in methods.values():
            m["delta_rstd"] = m["rstd"] - methods["vanilla"]["rstd"]
    out = {
        "num_candidates": n,
        "num_items": len(names),
        "num_shuffles": int(np.bincount(item_index).max()),  # (item, ordering) pairs are unique
        "num_records": len(records),
        "methods": methods,
    }
    if bootstrap is not None:
        out["bootstrap"] = bootstrap.to_dict()
        if gaps := audit.order_gaps(methods):
            out["order_gaps"] = gaps
    return out


def format_table(metrics: dict[str, Any]) -> str:
    """The paper's layout: methods as rows; Acc (mean ± std), RStd, ΔRStd against vanilla, Cons.,
    passes (and generated tokens per item and the unparsed share when generation methods are
    present)."""
    methods = metrics["methods"]
    with_parse = any("parse_failure" in m for m in methods.values())
    with_tokens = any("generated_tokens_per_item" in m for m in methods.values())
    with_delta = all("delta_rstd" in m for m in methods.values())
    head = f"{'Method':<18}{'Acc (↑)':>16}{'RStd (↓)':>10}"
    head += f"{'ΔRStd':>8}" if with_delta else ""
    head += f"{'Cons. (↑)':>11}{'Passes':>8}"
    head += f"{'Gen. tok':>10}" if with_tokens else ""
    head += f"{'Unparsed':>10}" if with_parse else ""
    title = f"N = {metrics['num_candidates']}, {metrics['num_items']} items × "
    title += f"{metrics['num_shuffles']} shuffles"
    lines = [title, head, "-" * len(head)]
    for name, m in methods.items():
        acc = f"{m['acc']:.2f}±{m['acc_std']:.2f}"
        row = f"{name:<18}{acc:>16}{m['rstd']:>10.2f}"
        row += f"{m['delta_rstd']:>+8.2f}" if with_delta else ""
        row += f"{m['cons']:>11.2f}"
        row += f"{number_text(m.get('forward_passes_per_item'), '?', 'g'):>8}"
        row += f"{number_text(m.get('generated_tokens_per_item'), '-'):>10}" if with_tokens else ""
        if with_parse:
            row += f"{m.get('parse_failure', 0.0):>9.2f}%"
        lines.append(row)
    return "\n".join(lines)


def number_text(value: float | None, dash: str = "–", spec: str = ".1f") -> str:
    """A number as tables show it; `dash` for none."""
    return dash if value is None else format(value, spec)


def ci_text(ci: list[float] | None) -> str:
    """A bootstrap interval as tables show it, "[lo, hi]"; "–" for none."""
    return "–" if ci is None else f"[{ci[0]:.1f}, {ci[1]:.1f}]"


def position_verdict(test: dict[str, Any], alpha: float = 0.05) -> str:
    """'matters, p≤0.001' or 'noise, p=0.41'; the smallest p a B-draw test can give is 1/(B+1),
    said as ≤; '–' when each question was asked once."""
    p, smallest = test["p_value"], 1 / (test["permutations"] + 1)
    if p is None:
        return "– (one order)"
    said = f"p≤{p:.3f}" if p <= smallest + 1e-12 else f"p={p:.3f}"
    return f"{'matters' if p < alpha else 'noise'}, {said}"


def format_panel(metrics: dict[str, Any]) -> str:
    """The audit below format_table: per method the bootstrap intervals of Acc and RStd, the
    position test, the flip rate with its interval and the noise floor beside it, CircularEval
    accuracy and the share of errors due to order (docs/metrics.md); then the order gaps."""
    methods = metrics["methods"]
    boot = metrics.get("bootstrap")
    if boot is None or not all("ci" in m for m in methods.values()):
        return ""
    head = (
        f"{'Method':<18}{'Acc CI':>14}{'RStd CI':>14}{'Position':>18}{'Flip':>8}{'Flip CI':>14}"
        f"{'Floor':>7}{'Circ.':>8}{'Order err.':>11}"
    )
    title = (
        f"Position audit: {boot['level']:g}% bootstrap intervals over {metrics['num_items']} "
        f"items (B = {boot['B']}, seed {boot['seed']}); position: permutation test of RStd"
    )
    lines = [title, head, "-" * len(head)]
    for name, m in methods.items():
        flip, floor, err = m["flip_rate"], m.get("noise_floor") or {}, m["errors_due_to_order"]
        row = f"{name:<18}{ci_text(m['ci']['acc']):>14}{ci_text(m['ci']['rstd']):>14}"
        row += f"{position_verdict(m['position_test']):>18}"
        row += f"{number_text(flip, spec='.2f'):>8}{ci_text(m['ci']['flip_rate']):>14}"
        row += f"{number_text(floor.get('flip_rate'), spec='.2f'):>7}"
        row += f"{m['circular_acc']:>8.2f}{number_text(err, spec='.2f'):>11}"
        lines.append(row)
    if gaps := metrics.get("order_gaps"):
        said = ", ".join(
            f"{k.replace('_minus_', ' − ').replace('_', '-')} {v:+.2f}" for k, v in gaps.items()
        )
        lines.append(f"Acc gaps (points): {said}")
    if not any("noise_floor" in m for m in methods.values()):
        lines.append(
            "Floor: – until the same orderings are asked again (lad metrics --repeat-predictions; "
            "a *_circular_repeat task)"
        )
    return "\n".join(lines)
