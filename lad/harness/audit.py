"""lad's metrics for harness runs: the audit file and folders.

Two sources:

- `--model lad` writes, at the end of its requests, one lad run folder per (task, N) under its
  `output` model_arg (records.jsonl, predictions.jsonl of vanilla, the chosen method and LAD,
  metrics.json, calibration.json, run.json: `lad report` and `lad metrics` read them) and
  `lad_audit.json` summing them up.
- Any model on a circular variant (lad.harness.circular): each document's result carries the
  row {item, ordering, order, answer, prediction}; the task's `lad_acc`, `lad_rstd`, `lad_cons`
  metrics aggregate them in lmms-eval's own results, and `lad harness audit OUTPUT_PATH` reads
  the samples lmms-eval logged (`--log_samples`) and writes `lad_audit.json` and one folder per
  (task, N) (metrics.json, run.json: `lad report` reads them) beside lmms-eval's results.

lad_audit.json: {"format": "lad-harness-audit/1", "source", "tasks": {task: {N: {"folder",
"num_items", "num_shuffles", "num_records", "calibration" (for --model lad), "methods": {name:
{"acc", "acc_std", "rstd", "cons", "recall_by_position", "selection_by_position", "delta_rstd"
}}}}}}; numbers are percentages as in metrics.json, computed by lad.core.metrics.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from lad.core.metrics import compute_metrics
from lad.core.records import RecordSet
from lad.errors import LadError
from lad.io.files import write_text
from lad.run.rundir import AUDIT_FILE, AUDIT_FORMAT, RunDir

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
)


def _summary(metrics: dict[str, Any], folder: str, **more: Any) -> dict[str, Any]:
    return {
        "folder": folder,
        "num_items": metrics["num_items"],
        "num_shuffles": metrics["num_shuffles"],
        "num_records": metrics["num_records"],
        **more,
        "methods": {
            name: {k: m[k] for k in _SUMMARY_KEYS if k in m}
            for name, m in metrics["methods"].items()
        },
    }


def write_model_audit(results: Sequence[Any], output: Path, options: Any, task_dict: Any) -> Path:
    """`--model lad`'s folders and lad_audit.json (lad.harness.runner.TaskResult each)."""
    from lad.harness.runner import write_audit_folder

    tasks: dict[str, dict[str, Any]] = defaultdict(dict)
    for result in results:
        n = result.records.num_candidates
        if not result.answers_known:  # e.g. a test split: there is nothing to measure
            tasks[result.task][str(n)] = {"skipped": "some documents give no answer"}
            continue
        folder = output / result.task / f"n{n}"
        arguments = {
            "model": options.model,
            "labels": options.labels,
            "method": options.method,
            "prompt_template": options.prompt_template,
            "source": "lmms-eval --model lad",
            "task": result.task,
        }
        metrics = write_audit_folder(result, folder, arguments)
        calibration = result.source.to_dict()
        tasks[result.task][str(n)] = _summary(
            metrics, f"{result.task}/n{n}", calibration=calibration
        )
    audit = {
        "format": AUDIT_FORMAT,
        "source": "--model lad",
        "model": options.model,
        "method": options.method,
        "labels": options.labels,
        "tasks": dict(tasks),
    }
    path = output / AUDIT_FILE
    write_text(path, json.dumps(audit, indent=2) + "\n")
    return path


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
    for row in rows:
        missing = [k for k in ROW_KEYS if k not in row]
        if missing:
            raise LadError(f"an audit row lacks {missing}: {row}")
        by_n[len(row["order"])].append(row)
    out = {}
    for n, mine in sorted(by_n.items()):
        records = positions_records(mine)
        prediction = np.array([int(r["prediction"]) for r in mine], dtype=np.int64)
        out[n] = compute_metrics(records, {method: prediction})  # passes: unknown (None)
    return out


def pooled(rows: Sequence[dict[str, Any]], key: str) -> float:
    """One number over all N for lmms-eval's table: `key` of each N's metrics, weighted by its
    records (acc, cons; RStd is defined within one N, so this is the records-weighted mean of
    the per-N RStd)."""
    if not rows:
        return float("nan")
    by_n = rows_metrics(rows)
    total = sum(m["num_records"] for m in by_n.values())
    return float(sum(m["methods"]["model"][key] * m["num_records"] for m in by_n.values()) / total)


def write_rows_folder(folder: Path, task: str, source: str, rows: Sequence[dict]) -> None:
    """A run directory (lad.run.rundir.RunDir) of one (task, N) of any model's answers:
    metrics.json and run.json, no records (there is no model evidence)."""
    run = RunDir(folder)
    arguments = {"labels": "upper", "source": source, "task": task}
    run.write_run(arguments, None, harness={"task": task, "source": source})
    run.write_answers(rows_metrics(rows)[len(rows[0]["order"])])


def write_rows_audit(rows_by_task: dict[str, list[dict]], output: Path, source: str) -> Path:
    """lad_audit.json and one folder (metrics.json, run.json) per (task, N) for any model."""
    tasks: dict[str, dict[str, Any]] = {}
    for task, rows in sorted(rows_by_task.items()):
        tasks[task] = {}
        for n, metrics in rows_metrics(rows).items():
            folder = output / "lad_audit" / task / f"n{n}"
            write_rows_folder(folder, task, source, [r for r in rows if len(r["order"]) == n])
            tasks[task][str(n)] = _summary(metrics, f"lad_audit/{task}/n{n}")
    audit = {"format": AUDIT_FORMAT, "source": source, "tasks": tasks}
    path = output / AUDIT_FILE
    write_text(path, json.dumps(audit, indent=2) + "\n")
    return path
