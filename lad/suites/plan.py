"""What a suite run is made of besides the runs themselves (lad.evaluate.run_suite): the models it
runs, the paper model each is compared with, a converted cell's N, a run's numbers."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lad.data.items import Item
from lad.errors import LadError
from lad.suites import Suite


@dataclass
class SuiteResult:
    """A suite's table (lad.suites.table), its rows, each (model, cell)'s run directory, and
    those of the cells found finished (only rescored: no model work)."""

    table: str
    rows: list[Any]
    runs: dict[str, dict[str, Path]]
    rescored: list[Path]


def suite_models(suite: Suite, model: str | None) -> list[tuple[str, str]]:
    """(label, path) of each model to run: `model` (labelled by the suite's name for it, when it
    is one of the suite's: its name, its hub id, or a local folder named as the hub id's last
    part, the copy `hf download` makes), else the suite's."""
    if model is None:
        if not suite.models:
            raise LadError(f"suite {suite.name} names no model; pass --model")
        return [(m.name, m.path) for m in suite.models]
    for m in suite.models:
        if model in (m.name, m.path):
            return [(m.name, m.path)]
    folder = Path(model)
    for m in suite.models:
        if folder.is_dir() and folder.name == m.path.rsplit("/", 1)[-1]:
            return [(m.name, model)]
    return [(model, model)]


def compared(suite: Suite, label: str, compare: str | None) -> str | None:
    """The paper model a lad model's Δ line is against: --compare, its own name in the paper,
    or the paper's one model."""
    if compare is not None:
        if compare not in suite.paper:
            raise LadError(f"--compare {compare!r}: the paper's models here: {list(suite.paper)}")
        return compare
    if label in suite.paper:
        return label
    return next(iter(suite.paper)) if len(suite.paper) == 1 else None


def one_n(items: Sequence[Item] | None) -> int | None:
    """The N of a converted cell's items when they all have one N (else None: a mixed run, or
    the shapes benchmark's generated data)."""
    ns = {it.num_candidates for it in items or ()}
    return ns.pop() if len(ns) == 1 else None


def cell_numbers(metrics: dict[str, Any] | None) -> dict[str, Any] | None:
    """A run's methods' numbers: a mixed run's overall (item-weighted) row."""
    if metrics is None or ("methods" in metrics and isinstance(metrics["methods"], dict)):
        return metrics
    return {"methods": metrics["groups"]["overall"]["methods"]}
