"""Rows of lad's audit from the samples lmms-eval or lm-eval logs (`--log_samples`): one jsonl file
per task and run, in a folder per model, each line a document's result holding the `lad_acc` row
that lad.harness.circular added. Each row is checked (`checked_rows`); a bad line is one error
naming the file and line."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from lad.errors import LadError, at
from lad.harness.audit import ROW_KEYS
from lad.harness.inspect_logs import has_logs, inspect_rows
from lad.io.files import loads_json

# lmms-eval: <date>_samples_<task>.jsonl; lm-eval: samples_<task>_<date>.jsonl
_SAMPLES = re.compile(r"samples_(?P<task>.+?)(?:_\d{4}-\d\d-\d\dT[\d.-]+)?\.jsonl$")


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
        if not path.is_file():  # a pipe or device would be read forever
            raise LadError(f"{path}: not a regular file; lad reads samples files only")
        task = match.group("task")
        if task in newest and newest[task].parent != path.parent:
            raise LadError(
                f"{output_path}: samples of task {task} from two models ({newest[task].parent}, "
                f"{path.parent}); pass the folder of one"
            )
        newest[task] = path
    rows = {task: r for task, path in sorted(newest.items()) if (r := _rows(path))}
    if has_logs(output_path):  # Inspect's log folder (lad.harness.inspect_logs)
        rows.update(inspect_rows(output_path))
    if not rows:
        raise LadError(
            f"{output_path}: no logged samples of a lad circular task (run lmms-eval with "
            "--log_samples on a task of `lad harness tasks`, or Inspect with lad/circular and "
            "lad/position)"
        )
    return rows


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def row_problem(row: dict[str, Any]) -> str | None:
    """What is wrong with an audit row's values, or None."""
    order = row["order"]
    if not isinstance(row["item"], str):
        return f"'item' must be a string, got {row['item']!r}"
    if not (isinstance(order, list) and len(order) >= 2 and all(_is_int(i) for i in order)):
        return f"'order' must be a list of at least 2 integers, got {order!r}"
    n = len(order)
    if sorted(order) != list(range(n)):
        return f"'order' must be a permutation of 0..{n - 1} (each picture once), got {order}"
    for key, lowest in (("ordering", 0), ("answer", 0), ("prediction", -1), ("repeat", 0)):
        value = row.get(key, 0)
        below_n = key in ("answer", "prediction")  # a position; a shift or repeat is unbounded
        if not (_is_int(value) and lowest <= value and (not below_n or value < n)):
            wanted = f"{lowest}..{n - 1}" if below_n else ">= 0"
            return f"{key!r} must be an integer {wanted}, got {value!r}"
    return None


def _sample(raw: bytes, where: str) -> dict[str, Any]:
    """One logged line's document (`where`: its file and line); its audit row (`lad_acc`) is
    checked with the task's others (`checked_rows`)."""
    try:
        sample = loads_json(raw.decode("utf-8"), LadError, where)
    except UnicodeDecodeError as e:
        raise LadError(
            f"{where}not UTF-8 text (byte {e.start}); not an lmms-eval samples log"
        ) from None
    except json.JSONDecodeError as e:
        raise LadError(f"{where}not valid JSON ({e.msg})") from None
    if not isinstance(sample, dict):
        raise LadError(
            f"{where}expected a JSON object (one logged document), got {type(sample).__name__}"
        )
    return sample


def _rows(path: Path) -> list[dict[str, Any]]:
    with path.open("rb") as f:
        lines = [(at(path, lineno), raw) for lineno, raw in enumerate(f, 1) if raw.strip()]
    found = ((where, _sample(raw, where)) for where, raw in lines)
    return checked_rows(
        (where, sample["lad_acc"]) for where, sample in found if "lad_acc" in sample
    )


def checked_rows(rows: Iterable[tuple[str, dict[str, Any]]]) -> list[dict[str, Any]]:
    """The rows of one task's log, each (where it was read, row) with its values checked
    (`row_problem`): each (item, shift, repeat) once, a repeat asking what its first asking
    asked, each shift of an item another order. A bad row is one error naming `where`."""
    out: list[dict[str, Any]] = []
    first: dict[tuple[str, int], dict[str, Any]] = {}
    seen: set[tuple[str, int, int]] = set()
    shown: dict[tuple[str, tuple[int, ...]], int] = {}  # (item, order) -> its shift
    for where, row in rows:
        missing = [k for k in ROW_KEYS if k not in row] if isinstance(row, dict) else ROW_KEYS
        problem = f"lacks {list(missing)}" if missing else row_problem(row)
        if problem:
            raise LadError(f"{where}lad audit row: {problem}")
        key = (row["item"], row["ordering"], row.get("repeat", 0))
        if key in seen:
            again = f" repeat {key[2]}" if key[2] else ""
            raise LadError(f"{where}item {key[0]!r} shift {key[1]}{again} twice")
        seen.add(key)
        asked = first.setdefault(key[:2], row)
        if (asked["order"], asked["answer"]) != (row["order"], row["answer"]):
            raise LadError(
                f"{where}item {key[0]!r} shift {key[1]} asked again with another "
                f"order or answer ({row['order']}, {row['answer']} vs {asked['order']}, "
                f"{asked['answer']})"
            )
        shift = shown.setdefault((key[0], tuple(row["order"])), key[1])
        if shift != key[1]:
            raise LadError(
                f"{where}item {key[0]!r}: shifts {shift} and {key[1]} show the same "
                f"order {row['order']}; each shift of a circular task shows another"
            )
        out.append(row)
    return out
