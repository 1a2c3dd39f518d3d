"""Rows of lad's audit from the samples lmms-eval logs (`--log_samples`): one jsonl file per task
and run (`<date>_samples_<task>.jsonl` in a folder per model), each line a document's result,
holding the `lad_acc` row that lad.harness.circular added."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from lad.errors import LadError, at
from lad.harness.audit import ROW_KEYS

_SAMPLES = re.compile(r"samples_(?P<task>.+?)\.jsonl$")


def samples_rows(output_path: Path) -> dict[str, list[dict[str, Any]]]:
    """{task: rows} from the newest `samples_<task>.jsonl` of each task under `output_path`
    whose lines carry a lad audit row (tasks of lad's circular variants)."""
    if not output_path.is_dir():
        raise LadError(f"{output_path}: no such folder (lmms-eval's --output_path)")
    newest: dict[str, Path] = {}
    for path in sorted(output_path.rglob("*.jsonl")):  # names start with the run's date
        match = _SAMPLES.search(path.name)
        if match is None:
            continue
        task = match.group("task")
        if task in newest and newest[task].parent != path.parent:
            raise LadError(
                f"{output_path}: samples of task {task} from two models ({newest[task].parent}, "
                f"{path.parent}); pass the folder of one"
            )
        newest[task] = path
    rows = {task: r for task, path in sorted(newest.items()) if (r := _rows(path))}
    if not rows:
        raise LadError(
            f"{output_path}: no logged samples of a lad circular task (run lmms-eval with "
            "--log_samples on a task of `lad harness tasks`)"
        )
    return rows


def _rows(path: Path) -> list[dict[str, Any]]:
    rows, seen = [], set()
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                sample = json.loads(line)
            except json.JSONDecodeError as e:
                raise LadError(f"{at(path, lineno)}not valid JSON ({e.msg})") from None
            row = sample.get("lad_acc") if isinstance(sample, dict) else None
            if not (isinstance(row, dict) and all(k in row for k in ROW_KEYS)):
                continue
            key = (row["item"], row["ordering"])
            if key in seen:
                raise LadError(f"{at(path, lineno)}item {key[0]!r} shift {key[1]} twice")
            seen.add(key)
            rows.append(row)
    return rows
