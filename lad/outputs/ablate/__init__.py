"""The paper's analyses of finished runs, from their stored records alone (`lad ablate`).

Figure 5 (accuracy against N), Table 3 (calibration transfer), Table 4 (ablation of the
attention-guided mechanisms), Figure 6(a) (calibration size |D_cal|), Figure 6(b) (temperature
τ), Table 7 (logits vs attention at each ground-truth position) and Table 8 (cost). Every number
is a metric (lad.core.metrics) of predictions from lad.core.methods on a run's stored records,
with a calibration from lad.core.calibrate; nothing needs the model again.
lad.outputs.ablate.report writes them as Markdown, JSON, figures and an HTML page.

    runs = load_runs(["runs/n4", "runs/n8"])
    result = ablate(runs)  # every analysis the runs support; result.missing says what is not
    write_ablation(result, "runs/ablate")
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from lad.errors import LadError
from lad.outputs.ablate.analyses import (
    ablation_table,
    accuracy_vs_n,
    calibration_size_sweep,
    cost_table,
    divergence_table,
    temperature_sweep,
    transfer_table,
)
from lad.outputs.ablate.report import ANALYSES, write_ablation
from lad.outputs.ablate.runs import (
    DEFAULTS,
    AblateOptions,
    Ablation,
    AnalysisError,
    Missing,
    Run,
    Table,
    calibration_subsets,
    load_run,
    load_runs,
    prepare,
)


def ablate(
    runs: Sequence[Run], options: AblateOptions = DEFAULTS, only: Sequence[str] | None = None
) -> Ablation:
    """Every analysis of ANALYSES (or those in `only`) the runs support; one they cannot support
    is listed in `missing` with the reason and what would make it possible."""
    if not runs:
        raise LadError("no runs given; pass run directories made by lad eval")
    keys = list(dict.fromkeys(only or ANALYSES))
    unknown = [k for k in keys if k not in ANALYSES]
    if unknown:
        raise LadError(f"Unknown analyses {unknown}. Analyses: {list(ANALYSES)}")
    missing = [
        Missing(key, f"{r.name} holds a model's answers without its evidence (no "
                "calibration.json: a harness audit)", "make the run with lad eval, or with "
                "--model lad and a calibration")
        for r in runs if r.calibration is None for key in keys
    ]  # fmt: skip
    runs = prepare([r for r in runs if r.calibration is not None], options)  # once, for all
    options = dataclasses.replace(options, calibration_items=None)
    tables = []
    for key in keys if runs else []:
        try:
            table = ANALYSES[key].make(runs, options)
        except AnalysisError as e:
            missing += e.missing or [Missing(key, e.reason, e.fix)]
            continue
        tables.append(table)
        missing += table.missing
    return Ablation(tables, missing, [r.name for r in runs])


__all__ = [
    "ANALYSES",
    "AblateOptions",
    "Ablation",
    "AnalysisError",
    "Missing",
    "Run",
    "Table",
    "ablate",
    "ablation_table",
    "accuracy_vs_n",
    "calibration_size_sweep",
    "calibration_subsets",
    "cost_table",
    "divergence_table",
    "load_run",
    "load_runs",
    "prepare",
    "temperature_sweep",
    "transfer_table",
    "write_ablation",
]
