"""`lad export`: a finished run's choices in another audit tool's format.

Facet-Probe (Paruchuri et al., arXiv 2606.26079; github.com/yahskapar/facet-probe) fits its IRT
model of ordering bias against noise on `TrialRecord` JSON Lines, one model call under one
ordering per line (its `facet_probe.schema.TrialRecord`, read by `facet-probe audit-jsonl`,
`irt-export`, `irt-fit`). lad writes one trial per (method, item, ordering) of every folder of
the run (a `lad eval` run, each part of a mixed run, each (task, N) folder of a harness audit):

    facet              "image_set_order" (picture candidates) or "option_order" (text options):
                       the facet whose unit lad permutes
    dataset            the item's task (a mixed run's cell, a harness task), else the data's name
    item_id            the item's id
    ordering_idx       the record's ordering
    permutation        order: permutation[p] is the candidate shown at position p, as
                       Facet-Probe orders components (`ordered = [components[i] for i in perm]`)
    model              "<model>:<method>", so each method is a model of its own to Facet-Probe
                       (it groups trials by facet, dataset, model and item)
    answer_normalized  the chosen candidate's index in the item's own order ("2"), content not
                       position, so a flip is a change of content; null where a reply named none
    gold_normalized    the right candidate's index, the same under every ordering
    correct            answer_normalized == gold_normalized
    score_kind         "option_content_idx" (Facet-Probe's name for a choice mapped back to its
                       source option)

and, as further keys (Facet-Probe keeps them as `metadata`): method, num_candidates, position
(the chosen position, -1 none), answer_position and run (the folder). A repeated asking of a
harness audit (`repeat` > 0) is not a trial of its own: Facet-Probe's noise is across orderings.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from lad.core.predictions import predictions_by_method, read_predictions
from lad.errors import LadError, RunError
from lad.run.audits import ANSWERS_FILE, audit_folders
from lad.run.rundir import CELLS_FILE, RunDir

FORMATS = ("facet-probe",)
FACETS = ("image_set_order", "option_order")
TRIAL_KEYS = (
    "facet", "dataset", "item_id", "ordering_idx", "permutation", "model", "answer_normalized",
    "gold_normalized", "correct", "score_kind",
)  # fmt: skip
SCORE_KIND = "option_content_idx"


def facet_probe_trials(
    run: str | Path,
    *,
    facet: str | None = None,
    dataset: str | None = None,
    model: str | None = None,
) -> Iterator[dict[str, Any]]:
    """Facet-Probe TrialRecord rows of every folder of `run` (module docstring); `facet`,
    `dataset` and `model` override what the run says (None: from the run)."""
    path = Path(run)
    if not path.is_dir():
        raise RunError(f"{path}: no such run directory")
    if facet is not None and facet not in FACETS:
        raise LadError(f"--facet must be one of {', '.join(FACETS)}. Got {facet!r}.")
    tasks = _cell_tasks(path)
    for folder in audit_folders(path):
        yield from _folder_trials(RunDir(folder).check(), facet, dataset, model, tasks)


def _cell_tasks(path: Path) -> dict[str, str]:
    """A mixed run's task of each item (cells.json), else nothing."""
    if not (path / CELLS_FILE).is_file():
        return {}
    return {item: cell.task for cell in RunDir(path).cells() for item in cell.items}


def _folder_trials(
    run: RunDir, facet: str | None, dataset: str | None, model: str | None, tasks: dict[str, str]
) -> Iterator[dict[str, Any]]:
    arguments = run.arguments
    facet = facet or _facet(run)
    name = dataset or str(arguments.get("task") or _data_name(arguments))
    who = model or str(arguments.get("model") or arguments.get("source") or "model")
    for method, item, ordering, order, answer, chosen in _choices(run):
        right = order[answer]
        trial = {
            "facet": facet,
            "dataset": dataset or tasks.get(item, name),
            "item_id": item,
            "ordering_idx": ordering,
            "permutation": order,
            "model": f"{who}:{method}",
            "answer_normalized": None if chosen < 0 else str(order[chosen]),
            "gold_normalized": str(right),
            "correct": chosen >= 0 and order[chosen] == right,
            "score_kind": SCORE_KIND,
            "method": method,
            "num_candidates": len(order),
            "position": chosen,
            "answer_position": answer,
            "run": str(run.path),
        }
        yield trial


def _choices(run: RunDir) -> Iterator[tuple[str, str, int, list[int], int, int]]:
    """(method, item, ordering, order, answer position, chosen position) of every choice."""
    if run.records_file("records").is_file():
        records = run.records
        path = run.predictions_file
        if not path.is_file():
            raise RunError(f"{path}: missing; rerun the run's lad eval to score it")
        chosen = predictions_by_method(records, read_predictions(path), path)
        for method, positions in chosen.items():
            for k in range(len(records)):
                order = [int(i) for i in records.order[k]]
                yield (method, str(records.items[k]), int(records.ordering[k]), order,
                       int(records.answer[k]), int(positions[k]))  # fmt: skip
        return
    path = run.file(ANSWERS_FILE)
    if not path.is_file():
        raise RunError(
            f"{run.path}: holds neither records.jsonl nor {ANSWERS_FILE} (a harness audit "
            "written by an older lad); rerun `lad harness audit` on its samples to write them"
        )
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            if row.get("repeat"):
                continue
            order = [int(i) for i in row["order"]]
            yield ("model", str(row["item"]), int(row["ordering"]), order, int(row["answer"]),
                   int(row["prediction"]))  # fmt: skip
        except (ValueError, KeyError, TypeError, AttributeError):
            raise RunError(
                f"{path}:{n}: not an answer row (item, ordering, order, answer, prediction)"
            ) from None


def _data_name(arguments: dict[str, Any]) -> str:
    data = arguments.get("data")
    return "shapes" if data in (None, "shapes") else Path(str(data)).stem


def _facet(run: RunDir) -> str:
    """The facet of a folder's items: text options or pictures. A harness audit says it by its
    harness (lm-eval: text); a lad eval run by its items file."""
    arguments = run.arguments
    source = str(arguments.get("source") or "")
    if run.is_harness:
        return "option_order" if "lm-eval" in source or "lm_eval" in source else "image_set_order"
    data = arguments.get("data")
    if data in (None, "shapes"):
        return "image_set_order"
    from lad.data.items import read_items

    path = Path(str(data))
    if not path.is_absolute() and not path.is_file():
        path = run.path / path
    if not path.is_file():
        raise RunError(
            f"{run.path}: its items file {data} is not there to say whether its candidates are "
            "pictures or texts; pass --facet image_set_order or --facet option_order"
        )
    texts = {it.is_text for it in read_items(path)}
    return "option_order" if texts == {True} else "image_set_order"


def write_facet_probe(run: str | Path, out: str | Path, **options: Any) -> int:
    """Write the trials of `run` to `out` (JSON Lines); returns how many."""
    from lad.io.files import write_text

    lines = [json.dumps(t, ensure_ascii=False) for t in facet_probe_trials(run, **options)]
    if not lines:
        raise RunError(f"{run}: holds no choice to export")
    write_text(Path(out), "\n".join(lines) + "\n")
    return len(lines)


def accuracy(trials: list[dict[str, Any]]) -> dict[str, float]:
    """Share of correct trials per model, in % (a check against the run's own Acc)."""
    by: dict[str, list[bool]] = {}
    for t in trials:
        by.setdefault(t["model"], []).append(bool(t["correct"]))
    return {m: float(np.mean(v) * 100) for m, v in by.items()}
