"""The held-out calibration split and the per-cell summary of a released-benchmark conversion
whose items may have several tasks and several N (`lad data mmiu|muirbench|blink`, docs/data.md,
"Whole benchmarks").

`lad eval` on a mixed items file calibrates each N on the first |D_cal| items of that N in
`--calibration-data` (lad.run.mixed), so the split holds out `calibration_items` items of every
N, not of every (task, N) cell: more would never be read. They are drawn across the N's tasks in
turn (each task's own seeded order, the tasks in the order they first appear), so one task does
not supply them all. With one task and one N this is the seeded choice lad has always made.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Sequence
from itertools import zip_longest
from typing import Any

import numpy as np

from lad.errors import DataError


def held_out(
    cells: Sequence[tuple[str, int]],
    calibration_items: int,
    rng: np.random.Generator,
    source: object,
) -> set[int]:
    """The positions (into the converted items, whose (task, N) are `cells`) held out:
    `calibration_items` of each N, taken from its tasks in turn."""
    by_n: dict[int, dict[str, list[int]]] = {}
    for k, (task, n) in enumerate(cells):
        by_n.setdefault(n, {}).setdefault(task, []).append(k)
    held: set[int] = set()
    for n in sorted(by_n):
        cells = by_n[n].values()
        count = sum(len(ks) for ks in cells)
        if count <= calibration_items:
            raise DataError(
                f"{source}: {count} questions of N = {n} converted, too few to hold out "
                f"--calibration-items {calibration_items} of each N and evaluate on the rest; "
                "leave that N out with --num-candidates, or lower --calibration-items"
            )
        orders = [  # each task's own seeded order
            [ks[j] for j in rng.choice(len(ks), min(calibration_items, len(ks)), replace=False)]
            for ks in cells
        ]
        in_turn = [k for turn in zip_longest(*orders) for k in turn if k is not None]
        held.update(in_turn[:calibration_items])  # the first of each order, then the second, ...
    return held


def cell_rows(
    cells: Sequence[tuple[str, int]],
    held: set[int],
    written: set[int],
    skipped: dict[tuple[str, int | None], Counter[str]],
) -> list[dict[str, Any]]:
    """The summary's "cells": per (task, N), the questions converted, held out, written as
    evaluation items and skipped by reason; skips whose N was never known have N null."""
    counts = {  # per key of a row, its count per cell
        "converted": Counter(cells),
        "held_out": Counter(cells[k] for k in held),
        "items": Counter(cells[k] for k in written),
    }
    rows = []
    for task, n in sorted(set(counts["converted"]) | set(skipped), key=lambda c: (c[0], c[1] or 0)):
        row = {"task": task, "num_candidates": n}
        row.update({key: tally[(task, n)] for key, tally in counts.items()})
        rows.append({**row, "skipped": dict(sorted(skipped.get((task, n), Counter()).items()))})
    return rows


def skipped_text(skipped: dict[str, int]) -> str:
    """`skipped 3 (no answer: 1, other N: 2)`, or "" when none was."""
    reasons = ", ".join(f"{r}: {c}" for r, c in skipped.items())
    return f"skipped {sum(skipped.values())} ({reasons})" if skipped else ""


def cell_lines(rows: Sequence[dict[str, Any]]) -> Iterator[str]:
    """The printed summary per cell: `  TASK N=n: converted c, held out h; skipped s (...)`."""
    for row in rows:
        tail = skipped_text(row["skipped"])
        if row["num_candidates"] is None:
            yield f"  {row['task']} (N not known): {tail}"
            continue
        head = f"  {row['task']} N={row['num_candidates']}: converted {row['converted']}, "
        yield head + f"held out {row['held_out']}" + (f"; {tail}" if tail else "")
