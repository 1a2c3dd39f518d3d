"""Rows of lad's audit from the samples lmms-eval logs (`--log_samples`): one jsonl file per
task, each line a document's result, holding the `lad_acc` row that lad.harness.circular added."""

from __future__ import annotations

import json
import re
from collections import defaultdict
from pathlib import Path
from typing import Any

from lad.errors import LadError, at
from lad.harness.audit import ROW_KEYS

_SAMPLES = re.compile(r"samples_(?P<task>.+?)\.jsonl$")


def samples_rows(output_path: Path) -> dict[str, list[dict[str, Any]]]:
    """{task: rows} from every `samples_<task>.jsonl` under `output_path` whose lines carry a
    lad audit row (tasks of lad's circular variants)."""
    if not output_path.is_dir():
        raise LadError(f"{output_path}: no such folder (lmms-eval's --output_path)")
    rows: dict[str, list[dict[str, Any]]] = defaultdict(list)
    files = sorted(p for p in output_path.rglob("*.jsonl") if _SAMPLES.search(p.name))
    for path in files:
        with path.open(encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    sample = json.loads(line)
                except json.JSONDecodeError as e:
                    raise LadError(f"{at(path, lineno)}not valid JSON ({e.msg})") from None
                row = sample.get("lad_acc") if isinstance(sample, dict) else None
                if isinstance(row, dict) and all(k in row for k in ROW_KEYS):
                    task = _SAMPLES.search(path.name).group("task")
                    rows[re.sub(r"^\d{8}_\d{6}_", "", task)].append(row)
    if not rows:
        raise LadError(
            f"{output_path}: no logged samples of a lad circular task (run lmms-eval with "
            "--log_samples on a task of `lad harness tasks`)"
        )
    return dict(rows)
