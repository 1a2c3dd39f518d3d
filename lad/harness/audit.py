"""lad's metrics for harness runs: the audit file and folders (docs/harness.md, "The audit file").

`--model lad` writes one lad run folder per (task, N) under its `output` model_arg, which `lad
report` and `lad metrics` read, and `lad_audit.json` summing them up. Any model on a circular
variant (lad.harness.circular) leaves a row {item, ordering, order, answer, prediction} per
document, which the tasks' lad_* metrics aggregate and `lad harness audit` reads back. A row
with `repeat` r > 0 is its (item, ordering) asked again: the metrics are those of the first
askings, and the share of repeats whose choice differs is the method's noise floor.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from lad.core.audit import noise_floor
from lad.core.metrics import compute_metrics
from lad.core.records import RecordSet
from lad.errors import LadError
from lad.run.audits import audit_part, check_audit_destination, write_answers, write_audit
from lad.run.rundir import RunDir

ROW_KEYS = ("item", "ordering", "order", "answer", "prediction")
_SUMMARY_KEYS = (
    "acc",
    "acc_std",
    "rstd",
    "cons",
    "recall_by_position",
    "selection_by_position",
    "delta_rstd",
    "forward_passes_per_item",
    "flip_rate",
    "circular_acc",
    "any_order_acc",
    "errors_due_to_order",
    "ci",
    "position_test",
    "noise_floor",
)


def _summary(metrics: dict[str, Any], folder: str, **more: Any) -> dict[str, Any]:
    return {
        "folder": folder,
        **{k: metrics[k] for k in ("num_items", "num_shuffles", "num_records")},
        **{k: metrics[k] for k in ("bootstrap", "order_gaps") if k in metrics},
        **more,
        "methods": {
            name: {k: m[k] for k in _SUMMARY_KEYS if k in m}
            for name, m in metrics["methods"].items()
        },
    }


# What each pooled number is a mean over: records (Acc), questions, or a method's errors.
_POOLED = {
    "acc": "num_records",
    "cons": "num_items",
    "circular_acc": "num_items",
    "any_order_acc": "num_items",
    "flip_rate": "num_items",
    "errors_due_to_order": "errors",
}


def _pool(cells: list[dict[str, Any]]) -> dict[str, Any]:
    """Each method's numbers over `cells` (lad_audit.json entries of one N each), weighted by
    what the number is a mean over; cells where it is undefined are left out."""
    out: dict[str, Any] = {}
    for name in dict.fromkeys(m for cell in cells for m in cell["methods"]):
        mine = [(c, c["methods"][name]) for c in cells if name in c["methods"]]
        pooled: dict[str, Any] = {"num_records": sum(c["num_records"] for c, _ in mine)}
        for key, over in _POOLED.items():
            weighted = [
                (m[key], c["num_records"] * (100 - m["acc"]) / 100 if over == "errors" else c[over])
                for c, m in mine
                if m.get(key) is not None
            ]
            total = sum(w for _, w in weighted)
            pooled[key] = sum(v * w for v, w in weighted) / total if total > 0 else None
        out[name] = pooled
    return out


# The model_args each (task, N)'s run.json records among its "arguments".
_RECORDED = ("model", "labels", "method", "prompt_template")


def write_model_audit(results: Sequence[Any], output: Path, options: Any) -> Path:
    """`--model lad`'s folders and lad_audit.json (lad.harness.runner.TaskResult each)."""
    tasks: dict[str, dict[str, Any]] = defaultdict(dict)
    for result in results:
        n = result.records.num_candidates
        if not result.answers_known:  # e.g. a test split: there is nothing to measure
            tasks[result.task][str(n)] = {"skipped": "some documents give no answer"}
            continue
        run, folder = audit_part(output, result.task, n)
        arguments = {k: getattr(options, k) for k in _RECORDED}
        arguments |= {"source": "lmms-eval --model lad", "task": result.task}
        metrics = write_audit_folder(result, run.path, arguments)
        tasks[result.task][str(n)] = _summary(metrics, folder, calibration=result.source.to_dict())
    head = {"source": "--model lad", "model": options.model, "method": options.method}
    return _write_audit(output, dict(tasks), **head, labels=options.labels)


def write_audit_folder(result: Any, folder: Path, arguments: dict[str, Any]) -> dict:
    """A run directory (lad.run.rundir.RunDir) for one (task, N), a lad.harness.runner.TaskResult,
    which `lad report`, `lad ablate` and `lad metrics` read like any other: records, predictions
    of each method, metrics.json, calibration.json, run.json."""
    run = RunDir(folder)
    harness = {"task": result.task, "calibration": result.source.to_dict()}
    arguments = {**arguments, "num_candidates": result.records.num_candidates}
    run.write_run(
        arguments,
        result.records,
        harness=harness,
        stages=result.stages,
        calibration=result.calibration,
    )
    return run.write_scored(result.scored, harness=harness)


def _write_audit(output: Path, tasks: dict[str, Any], **head: Any) -> Path:
    """lad_audit.json: its format, `head` (where the rows came from), the tasks, and "pooled":
    per task over its N, and overall over every task and N."""
    cells = {t: [c for c in by_n.values() if "methods" in c] for t, by_n in tasks.items()}
    pooled = {
        "tasks": {t: _pool(mine) for t, mine in cells.items() if mine},
        "overall": _pool([c for mine in cells.values() for c in mine]),
    }
    return write_audit(output, {**head, "tasks": tasks, "pooled": pooled})


# ---------------------------------------------------------------- any model, from rows


def positions_records(rows: Sequence[dict[str, Any]]) -> RecordSet:
    """The rows of one N as the RecordSet lad.core.metrics reads. Only item, ordering, order and
    answer are known here (no model evidence): logprobs are zeros and attention has no layer,
    which no metric reads."""
    n = len(rows[0]["order"])
    return RecordSet(
        items=np.array([str(r["item"]) for r in rows]),
        ordering=np.array([int(r["ordering"]) for r in rows]),
        order=np.array([list(r["order"]) for r in rows], dtype=np.int64),
        answer=np.array([int(r["answer"]) for r in rows]),
        logprobs=np.zeros((len(rows), n)),
        attention=np.zeros((len(rows), 0, n)),
        extra=[{} for _ in rows],
    )


def rows_metrics(rows: Iterable[dict[str, Any]], method: str = "model") -> dict[int, dict]:
    """{N: metrics.json} of the rows' predictions (-1: the task's parser found no option)."""
    by_n: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for row in rows:  # each checked where read (lad.harness.samples) or made by lad
        by_n[len(row["order"])].append(row)
    out = {}
    for n, mine in sorted(by_n.items()):
        first = [r for r in mine if not r.get("repeat")]
        records = positions_records(first)
        prediction = np.array([int(r["prediction"]) for r in first], dtype=np.int64)
        metrics = compute_metrics(records, {method: prediction})  # passes: unknown (None)
        again = [r for r in mine if r.get("repeat")]
        if again:
            metrics["methods"][method]["noise_floor"] = repeat_floor(first, again)
        out[n] = metrics
    return out


def repeat_floor(first: Sequence[dict[str, Any]], again: Sequence[dict[str, Any]]) -> dict:
    """lad.core.audit.noise_floor of the repeated rows against their first askings."""
    asked = {(r["item"], r["ordering"]): int(r["prediction"]) for r in first}
    lost = [r for r in again if (r["item"], r["ordering"]) not in asked]
    if lost:
        raise LadError(f"an audit row repeats an ordering never asked first: {lost[0]}")
    before = np.array([asked[(r["item"], r["ordering"])] for r in again], dtype=np.int64)
    now = np.array([int(r["prediction"]) for r in again], dtype=np.int64)
    return noise_floor(positions_records(again), before, now)


def pooled(rows: Sequence[dict[str, Any]], key: str) -> float:
    """One number over all N for lmms-eval's table: `key` of each N's metrics, weighted by its
    records (acc, cons, flip_rate, circular_acc; RStd is defined within one N, so this is the
    records-weighted mean of the per-N RStd); N groups where it is undefined are left out."""
    return pooled_metrics(rows_metrics(rows), key)  # no rows: no N defines it


def pooled_metrics(by_n: dict[int, dict], key: str, method: str = "model") -> float:
    """`pooled`'s number from rows_metrics' {N: metrics.json}; NaN where no N defines it (e.g. a
    flip rate of questions asked once)."""
    defined = [m for m in by_n.values() if m["methods"][method][key] is not None]
    if not defined:
        return float("nan")
    total = sum(m["num_records"] for m in defined)
    return float(sum(m["methods"][method][key] * m["num_records"] for m in defined) / total)


def write_rows_audit(rows_by_task: dict[str, list[dict]], output: Path, source: str) -> Path:
    """lad_audit.json and one folder (metrics.json, run.json) per (task, N) for any model."""
    check_audit_destination(output, source)
    tasks: dict[str, dict[str, Any]] = {}
    for task, rows in sorted(rows_by_task.items()):
        tasks[task] = {}
        for n, metrics in rows_metrics(rows).items():
            run, folder = audit_part(output, task, n, under="lad_audit")
            arguments = {"labels": "upper", "source": source, "task": task}
            run.write_run(arguments, None, harness={"task": task, "source": source})
            run.write_metrics(metrics)  # answers only: nothing to fingerprint
            write_answers(run, [r for r in rows if len(r["order"]) == n])
            tasks[task][str(n)] = _summary(metrics, folder)
    return _write_audit(output, tasks, source=source)
