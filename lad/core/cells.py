"""Cells of a mixed run: items grouped by (task, N), each cell's metrics from its selection of the
records, and item-weighted group rows (per task, per N, overall) (docs/formats.md, "Mixed runs").

A cell is a selection of records, never a file of its own: its metrics are `score_records` on the
records of its items, so they equal those of the cell run alone with the same calibration and
orderings.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from lad.core.calibrate import Calibration
from lad.core.methods import MethodOptions
from lad.core.metrics import compute_metrics
from lad.core.records import RecordSet
from lad.core.scoring import score_records
from lad.errors import RunError

# The task of an item without a "task" key: all such items of one N form one cell.
DEFAULT_TASK = "items"
CELLS_FORMAT = "lad-cells/1"
# Scalars averaged, item-weighted, into the group rows.
GROUPED = ("acc", "rstd", "delta_rstd", "cons")


@dataclass(frozen=True)
class Cell:
    """One (task, N) of a mixed run and the ids of its items (evaluation and held-out alike)."""

    task: str
    num_candidates: int
    items: tuple[str, ...]

    @property
    def name(self) -> str:
        return f"{self.task} N={self.num_candidates}"


def task_of(extra: Mapping[str, Any]) -> str:
    """An item's task: its "task" key (a string), else DEFAULT_TASK."""
    task = extra.get("task", DEFAULT_TASK)
    return task if isinstance(task, str) and task else DEFAULT_TASK


def cells_of(items: Iterable[Any]) -> list[Cell]:
    """The (task, N) cells of `items` (lad.data.items.Item), in the order they first appear."""
    found: dict[tuple[str, int], list[str]] = {}
    for item in items:
        found.setdefault((task_of(item.extra), item.num_candidates), []).append(item.id)
    return [Cell(task, n, tuple(ids)) for (task, n), ids in found.items()]


def cells_json(cells: Sequence[Cell], parts: Mapping[int, str]) -> dict[str, Any]:
    """cells.json: each cell's task, N, part folder and item ids."""
    return {
        "format": CELLS_FORMAT,
        "cells": [
            {
                "task": c.task,
                "num_candidates": c.num_candidates,
                "part": parts[c.num_candidates],
                "items": list(c.items),
            }
            for c in cells
        ],
    }


def cells_from_json(stored: Any, path: object) -> list[Cell]:
    """The cells of a cells.json's content, refused (naming `path`) unless of lad's format."""
    if not isinstance(stored, dict) or stored.get("format") != CELLS_FORMAT:
        raise RunError(f"{path}: not lad's cells file (format {CELLS_FORMAT!r})")
    try:
        return [
            Cell(str(c["task"]), int(c["num_candidates"]), tuple(map(str, c["items"])))
            for c in stored["cells"]
        ]
    except (KeyError, TypeError, ValueError):
        raise RunError(f"{path}: damaged; rerun the run's lad eval to rewrite it") from None


@dataclass
class Part:
    """What one N's records are scored with: its records, calibration, options and the records
    of the other stages its methods read, by stage name (lad.core.scoring.score_records)."""

    records: RecordSet
    calibration: Calibration | None
    options: MethodOptions
    stages: dict[str, RecordSet]


def score_cells(
    cells: Sequence[Cell], parts: Mapping[int, Part], methods: Sequence[str]
) -> dict[str, Any]:
    """metrics.json's "cells" (each cell's metrics, as `compute_metrics` writes them for a run)
    and "groups" (item-weighted means per task, per N and overall, with their weights)."""
    out: dict[str, Any] = {}
    for cell in cells:
        part = parts[cell.num_candidates]
        ids = np.asarray(cell.items, dtype=object)
        mask = np.isin(part.records.items, ids)
        if not mask.any():
            continue  # every item of the cell held out for calibration
        # Each stage cut by its own items: perm-avg's holds N records per item, not one per record.
        stages = {s: r.select(np.isin(r.items, ids)) for s, r in part.stages.items()}
        scored = score_records(
            part.records.select(mask), methods, part.calibration, part.options, stages=stages
        )
        out[cell.name] = {"task": cell.task, **scored.metrics}
    return {"cells": out, "groups": group_rows(out)}


def measure_cells(
    cells: Sequence[Cell], records: RecordSet, chosen: Mapping[str, np.ndarray]
) -> dict[str, Any]:
    """ "cells" and "groups" of one N's records and each method's chosen positions (`lad score`,
    `lad metrics` on a part of a mixed run): `compute_metrics` of each cell's selection."""
    out = {}
    for cell in cells:
        mask = np.isin(records.items, np.asarray(cell.items, dtype=object))
        if cell.num_candidates == records.num_candidates and mask.any():
            picked = {m: np.asarray(c)[mask] for m, c in chosen.items()}
            out[cell.name] = {"task": cell.task, **compute_metrics(records.select(mask), picked)}
    return {"cells": out, "groups": group_rows(out)}


def group_rows(cells: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """Per task, per N and overall: each method's GROUPED scalars averaged over the cells,
    weighted by their evaluation items (the weights are shown beside)."""
    out: dict[str, Any] = {}
    for kind in ("task", "num_candidates"):
        groups: dict[str, list[str]] = {}
        for name, cell in cells.items():
            groups.setdefault(str(cell[kind]), []).append(name)
        out[kind] = {key: _weighted(cells, names) for key, names in groups.items()}
    return {**out, "overall": _weighted(cells, list(cells))}


def _weighted(cells: Mapping[str, Mapping[str, Any]], names: Sequence[str]) -> dict[str, Any]:
    weights = {name: cells[name]["num_items"] for name in names}
    total = sum(weights.values())
    methods: dict[str, dict[str, float]] = {}
    shared = [m for m in cells[names[0]]["methods"] if all(m in cells[c]["methods"] for c in names)]
    for method in shared:
        row = {}
        for key in GROUPED:
            values = [cells[c]["methods"][method].get(key) for c in names]
            if all(isinstance(v, (int, float)) for v in values):
                row[key] = sum(w * v for w, v in zip(weights.values(), values, strict=True)) / total
        methods[method] = row
    return {"num_items": total, "weights": weights, "methods": methods}


def table_rows(metrics: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any]]]:
    """A cells table's rows: each cell, per task and per N where several, then overall."""
    groups, rows = metrics["groups"], list(metrics["cells"].items())
    for kind, label in (("task", "task "), ("num_candidates", "N = ")):
        if len(groups[kind]) > 1:
            rows += [(label + key, group) for key, group in groups[kind].items()]
    return [*rows, ("overall (item-weighted)", groups["overall"])]


def format_cells_table(metrics: Mapping[str, Any], methods: Sequence[str] | None = None) -> str:
    """One row per cell, then the group rows: each method's Acc, and LAD's ΔRStd when there."""
    cells = metrics["cells"]
    shown = list(methods or next(iter(cells.values()))["methods"])
    head = f"{'cell':<34}{'items':>6}" + "".join(f"{m[:12]:>13}" for m in shown)
    delta = "lad" in shown and "vanilla" in shown
    head += f"{'ΔRStd lad':>11}" if delta else ""
    lines = [head, "-" * len(head)]

    def row(name: str, entry: Mapping[str, Any]) -> str:
        """A cell's or group's line: its items and, by method, what the table shows."""
        by_method = entry["methods"]
        text = f"{name[:33]:<34}{entry['num_items']:>6}"
        for m in shown:
            acc = by_method.get(m, {}).get("acc")
            text += f"{'-' if acc is None else f'{acc:.2f}':>13}"
        if delta:
            d = by_method.get("lad", {}).get("delta_rstd")
            text += f"{'-' if d is None else f'{d:+.2f}':>11}"
        return text

    lines += [row(name, entry) for name, entry in table_rows(metrics)]
    lines.insert(2 + len(cells), lines[1])  # the rule between the cells and the group rows
    return "\n".join(lines)
