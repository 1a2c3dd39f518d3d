"""The parts of a mixed run (several (task, N) cells in one items file): each N's run
configuration and inputs, and what a finished run directory is scored with (docs/formats.md,
"Mixed runs"). lad.evaluate runs the parts; lad.core.cells scores the cells."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lad.core.cells import Part
from lad.core.methods import METHODS, MethodOptions
from lad.data.items import Item, read_items, write_items
from lad.errors import CalibrationError, DataError, RunError
from lad.io.files import write_text
from lad.run.config import DEFAULT_CALIBRATION_ITEMS, EvalConfig
from lad.run.inputs import RunData, resolved
from lad.run.rundir import PART_INPUTS, STAGE_FILES, RunDir


def scoring_inputs(
    run: RunDir, methods: Sequence[str], options: MethodOptions, check_calibration: bool
) -> Part:
    """A finished run's records, calibration, options and the stages `methods` read, checked."""
    records = run.records
    calibration = run.calibration(check=check_calibration)
    options = dataclasses.replace(options, labels=run.arguments["labels"])
    stages = {}
    for method in methods:
        for stage in (METHODS[method].stage, METHODS[method].extra):
            if stage is None or stage == "records" or stage in stages:
                continue
            stages[stage] = run.stage_records(stage)
            if stages[stage] is None:
                raise RunError(
                    f"{run.file(STAGE_FILES[stage])}: missing; rerun lad eval with --methods "
                    f"including {method}"
                )
    return Part(records, calibration, options, stages)


def part_config(config: EvalConfig, run_dir: Path, n: int, data: RunData) -> EvalConfig:
    """The run of N's items in n{N}/: its inputs the N's share of --data, --calibration-data and
    --orders (written into n{N}/data/), its calibration the N's of --calibration DIR, the rest
    decided from the N's items as a run of one N is (lad.run.inputs.resolved)."""
    mine = RunDir(run_dir).part(n)
    given = {k: str(mine.file(path)) for k, path in PART_INPUTS.items() if getattr(config, k)}
    changes: dict[str, Any] = {**given, "num_candidates": n}
    if config.calibration:
        changes["calibration"] = calibration_for(config.calibration, n)
    if config.calibrate_on == "evaluation" and config.calibration_items is None:
        changes["calibration_items"] = DEFAULT_CALIBRATION_ITEMS  # each N's first 5, never fewer
    part = config.replace(**changes)
    mine = [it for it in data.items or () if it.num_candidates == n]
    if config.calibration_data and part.calibration_items is None:  # at most the N's share
        return resolved(part, RunData(mine, _calibration_of(config, data, n)))
    return resolved(part, RunData(mine))


def _calibration_of(config: EvalConfig, data: RunData, n: int) -> list[Item]:
    """--calibration-data's items of N, as read already (a path that is no file: refused here)."""
    read = data.calibration
    items = read if read is not None else read_items(str(config.calibration_data))
    mine = [it for it in items if it.num_candidates == n]
    if not mine:
        raise DataError(
            f"--calibration-data {config.calibration_data} holds no item of N = {n}, which "
            f"--data {config.data} holds; give calibration items of every N"
        )
    return mine


def calibration_for(folder: str, n: int) -> str:
    """N's calibration in --calibration DIR: DIR/calibration.n{N}.json, else DIR/n{N}/
    calibration.json (a mixed run's own)."""
    root = Path(folder)
    if not root.is_dir():
        raise CalibrationError(
            f"--calibration {folder}: a mixed items file (several N or tasks) needs a folder of "
            "calibration.n{N}.json files (or a mixed run directory), one per N"
        )
    for path in (root / f"calibration.n{n}.json", RunDir(root).part(n).calibration_file):
        if path.is_file():
            return str(path)
    raise CalibrationError(
        f"--calibration {folder}: no calibration.n{n}.json (nor n{n}/calibration.json) for the "
        f"items of N = {n}"
    )


def write_part_inputs(config: EvalConfig, parts: dict[int, EvalConfig], data: RunData) -> None:
    """Each N's items (and calibration items and orders) into its part's data/ folder; made
    again from the same inputs they are the same bytes, so a resumed part sees no change."""
    orders = Path(config.orders).read_text(encoding="utf-8") if config.orders else ""  # read once
    for n, part in parts.items():
        write_items(part.data, [it for it in data.items or () if it.num_candidates == n])
        if config.calibration_data:
            write_items(part.calibration_data, _calibration_of(config, data, n))
        if config.orders:
            write_text(part.orders, "".join(_orders_of(orders, n)))


def _orders_of(text: str, n: int) -> list[str]:
    """The lines of an orders file's `text` whose order has N entries (a line not read as one
    goes to every N, so each part's reader names it)."""
    lines = []
    for line in text.splitlines(keepends=True):
        try:
            order = json.loads(line).get("order")
        except (json.JSONDecodeError, AttributeError, RecursionError):
            order = None
        if not isinstance(order, list) or len(order) == n:
            lines.append(line if line.endswith("\n") else line + "\n")
    return lines
