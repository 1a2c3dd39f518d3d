"""Circular variants of lm-evaluation-harness multiple-choice tasks, for any model
(`lad harness lm-eval-circular TASK.yaml --out DIR`; docs/harness.md, "Circular variants").

A variant includes the task's own YAML; its `process_docs` asks each question under all N cyclic
shifts of its choices (lad.data.items.cyclic_shift) and its `process_results` adds lad's audit row
to acc. lm-eval resolves `!function` in a file beside the YAML, so the variant is written with
`lad_circular.py`, which imports these functions from lad.
"""

from __future__ import annotations

import string
from pathlib import Path
from typing import Any

import numpy as np

from lad.data.items import cyclic_shift
from lad.errors import DataError, LadError
from lad.harness import harness_module
from lad.harness.circular import AUDIT_METRICS, shifted_dataset, shifted_row, with_audit
from lad.io import files

SHIM = "lad_circular.py"
_SHIM_TEXT = (
    '"""Written by `lad harness lm-eval-circular`: lm-eval resolves `!function` beside the '
    'YAML."""\n\nfrom lad.harness.circular import (  # noqa: F401\n'
    + "".join(f"    {name},\n" for name in AUDIT_METRICS)
    + ")\nfrom lad.harness.lm_eval_circular import circular_docs, circular_results  # noqa: F401\n"
)


def _answer(doc: dict[str, Any], n: int, k: int) -> int:
    answer = doc.get("answer")
    if isinstance(answer, str) and len(answer) == 1 and answer in string.ascii_uppercase[:n]:
        return string.ascii_uppercase.index(answer)
    if isinstance(answer, int) and not isinstance(answer, bool) and 0 <= answer < n:
        return answer
    raise DataError(
        f"document {k}: 'answer' must be the right choice's index 0..{n - 1} or its letter, "
        f"got {answer!r}"
    )


def _choices(doc: dict[str, Any], k: int) -> list[str]:
    choices = doc.get("choices")
    if not (
        isinstance(choices, list) and len(choices) >= 2 and all(isinstance(c, str) for c in choices)
    ):
        raise DataError(
            f"document {k}: a circular variant needs MMLU's fields, 'choices' a list of at least "
            f"2 texts (and 'question', 'answer'); got {str(choices)[:80]!r}"
        )
    return choices


def circular_docs(dataset: Any) -> Any:
    """Each question of `dataset` (a datasets.Dataset) under all N cyclic shifts of its choices,
    with `lad_item` (its row in the split) and `lad_shift`."""
    rows = []
    for k, doc in enumerate(dataset):
        choices = _choices(doc, k)
        n, answer = len(choices), _answer(doc, len(choices), k)
        for s in range(n):
            order = cyclic_shift(n, s)
            moved = order.index(answer)
            shown = moved if isinstance(doc["answer"], int) else string.ascii_uppercase[moved]
            rows.append(
                {**doc, "choices": [choices[i] for i in order], "answer": shown,
                 "lad_item": str(k), "lad_shift": s}
            )  # fmt: skip
    return shifted_dataset(dataset, rows)


def circular_results(doc: dict[str, Any], results: list[tuple[float, bool]]) -> dict[str, Any]:
    """acc of one shifted document (argmax of the choices' loglikelihoods; acc_norm is acc for
    one-letter labels) and lad's audit row for each lad metric."""
    lls = np.array([float(r[0]) for r in results])
    n = len(lls)
    pred = int(np.argmax(lls))
    answer = _answer(doc, n, int(doc.get("lad_shift", 0)))
    return with_audit({"acc": float(pred == answer)}, shifted_row(doc, n, answer, pred))


def _metric(name: str, aggregation: str, higher: bool) -> str:
    return (
        f"  - metric: {name}\n    aggregation: {aggregation}\n"
        f"    higher_is_better: {str(higher).lower()}\n"
    )


def write_variant(task_yaml: str | Path, out: str | Path) -> Path:
    """The circular variant of the task in `task_yaml`, written into folder `out` with its
    shim; returns the YAML's path."""
    load_yaml = harness_module("lm_eval.tasks._yaml_loader", "lm-eval").load_yaml
    task_yaml = Path(task_yaml).resolve()
    try:
        config = load_yaml(task_yaml, resolve_func=False)
    except Exception as e:  # lm-eval's own YAML loader: any error it raises, named
        detail = " ".join(str(e).split())[:300]
        raise LadError(
            f"{task_yaml}: lm-eval cannot read the task ({type(e).__name__}: {detail})"
        ) from None
    name = config.get("task") if isinstance(config, dict) else None
    if not isinstance(name, str):
        raise LadError(f"{task_yaml}: names no single task (a 'task' string); give a task's YAML")
    if config.get("output_type") != "multiple_choice":
        raise LadError(
            f"{task_yaml}: task {name!r} is {config.get('output_type')!r}, not multiple_choice"
        )
    own = [key for key in ("process_docs", "process_results") if key in config]
    if own:
        raise LadError(
            f"{task_yaml}: task {name!r} has its own {' and '.join(own)}, which the circular "
            "variant would replace; give a task without them"
        )
    out = Path(out)
    path = files.child(out, f"{name}_lad_circular.yaml", LadError, f"{task_yaml}: task ")
    metrics = _metric("acc", "mean", True) + "".join(
        _metric(m, f"!function lad_circular.{m}", m not in ("lad_rstd", "lad_flip"))
        for m in AUDIT_METRICS
    )
    text = (
        f"# lad's circular variant of {name} (lad harness lm-eval-circular {task_yaml}):\n"
        "# each question asked N times, its choices shifted cyclically; lad's metrics beside acc.\n"
        f"include: {task_yaml}\n"
        f"task: {name}_lad_circular\n"
        "tag: lad_circular\n"
        "process_docs: !function lad_circular.circular_docs\n"
        "process_results: !function lad_circular.circular_results\n"
        f"metric_list:\n{metrics}"
    )
    files.write_text(path, text)
    files.write_text(out / SHIM, _SHIM_TEXT)
    return path
