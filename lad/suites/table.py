"""A suite's one table: lad's numbers for each model run, the paper's published numbers for the
paper's models beside them, and lad's minus the paper's for the model compared.

Layout "cells" (Table 5): one row group per cell, a column per (method, metric). Layout
"methods" (Table 1): one row group per (cell, method), a column per metric. In each group: a line
per lad model, a line per paper model with numbers for the cell, and `Δ` (lad − paper) when the
model run is compared with one of the paper's.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from lad.suites import Column, Suite


@dataclass
class Row:
    """One line of the table: what it shows (cell, method, source) and its values by column."""

    cell: str
    method: str | None
    source: str  # "lad <model>", "paper <model>" or "Δ <model> − paper <model>"
    values: list[float | None]


def table_rows(
    suite: Suite,
    results: Mapping[str, Mapping[str, Mapping[str, Any] | None]],
    compare: Mapping[str, str | None],
) -> list[Row]:
    """results: per lad model label, per cell id, its metrics.json (None: not run). compare: per
    lad model label, the paper model its Δ line is against (None: none)."""
    groups = [(c.id, None) for c in suite.cells]
    if suite.layout == "methods":
        groups = [(c.id, m) for c in suite.cells for m in suite.methods]
    rows = []
    for cell, method in groups:
        lad = {
            label: _values(c.get(cell), "methods", suite.columns, method)
            for label, c in results.items()
        }
        paper = {m: _values(c, cell, suite.columns, method) for m, c in suite.paper.items()}
        rows += [Row(cell, method, f"lad {label}", values) for label, values in lad.items()]
        rows += [
            Row(cell, method, f"paper {model}", values)
            for model, values in paper.items()
            if any(v is not None for v in values)
        ]
        for label, model in compare.items():
            if model in paper:
                diff = [
                    None if a is None or b is None else a - b
                    for a, b in zip(lad[label], paper[model], strict=True)
                ]
                if any(v is not None for v in diff):
                    rows.append(Row(cell, method, f"Δ {label} − paper {model}", diff))
    return rows


def _values(
    numbers: Mapping[str, Any] | None, key: str, columns: list[Column], method: str | None
) -> list[float | None]:
    """Each column's number in numbers[key] by method (a run's metrics.json and "methods", or
    the paper's numbers of a model and a cell id), None where there is none."""
    by_method = (numbers or {}).get(key) or {}
    values = [by_method.get(col.method or method or "", {}).get(col.metric) for col in columns]
    return [float(v) if isinstance(v, (int, float)) else None for v in values]


def format_suite_table(suite: Suite, rows: list[Row]) -> str:
    """The rows as text, the suite's title above them."""
    by_methods = suite.layout == "methods"
    width = max([len(r.source) for r in rows] + [6]) + 2
    cell_width = max(len(c.id) for c in suite.cells) + 2
    head = f"{'cell':<{cell_width}}" + (f"{'method':<18}" if by_methods else "")
    head += f"{'':<{width}}" + "".join(f"{c.title:>12}" for c in suite.columns)
    lines = [suite.title, head, "-" * len(head)]
    last = None
    for row in rows:
        key = (row.cell, row.method)
        if last is not None and key[0] != last[0]:
            lines.append("")
        new_cell = last is None or key[0] != last[0]
        text = f"{row.cell if new_cell else '':<{cell_width}}"
        if by_methods:
            text += f"{(row.method or '') if key != last else '':<18}"
        text += f"{row.source:<{width}}"
        delta = row.source.startswith("Δ")
        for col, value in zip(suite.columns, row.values, strict=True):
            signed = delta or col.metric == "delta_rstd"
            shown = "-" if value is None else (f"{value:+.2f}" if signed else f"{value:.2f}")
            text += f"{shown:>12}"
        lines.append(text)
        last = key
    return "\n".join(lines)
