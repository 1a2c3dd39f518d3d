"""Analyses across runs: Figure 5 (accuracy against N) and Table 3 (calibration transfer).

table = transfer_table(load_runs(["runs/coco4", "runs/flickr4"]))
"""

from __future__ import annotations

from collections.abc import Sequence

from lad.core.fingerprint import CalibrationMismatch
from lad.core.methods import METHODS
from lad.errors import LadError
from lad.outputs.ablate.runs import (
    DEFAULTS,
    AblateOptions,
    AnalysisError,
    Missing,
    Run,
    Table,
    acc_text,
    calibration_note,
    nothing_made,
    prepare,
    score_cells,
    settings_note,
    summary,
)
from lad.run.rundir import CALIBRATION_FILE


def accuracy_vs_n(runs: Sequence[Run], options: AblateOptions = DEFAULTS) -> Table:
    """Figure 5: every method's accuracy against N, one panel per (model, setting)."""
    runs = prepare(runs, options)
    groups: dict[tuple[str, str], dict[int, Run]] = {}
    missing = []
    for run in runs:
        by_n = groups.setdefault((run.model, run.setting), {})
        if run.num_candidates in by_n:
            first = by_n[run.num_candidates].name
            missing.append(
                Missing(
                    "fig5",
                    f"{first} and {run.name} both have N = {run.num_candidates} "
                    f"({run.setting or 'same setting'}); Figure 5 uses {first}",
                )
            )
            continue
        by_n[run.num_candidates] = run
    panels, alone = [], []
    for (model, setting), by_n in groups.items():
        if len(by_n) < 2:
            alone += by_n.values()
            continue
        ns = sorted(by_n)
        series = {}
        for method in METHODS:
            points = {
                str(n): summary(by_n[n].metrics(method, by_n[n].options(options)))
                for n in ns
                if method in by_n[n].methods()
            }
            if points:
                series[method] = points
        runs_by_n = {str(n): by_n[n].name for n in ns}
        panels.append(
            {"model": model, "setting": setting, "ns": ns, "runs": runs_by_n, "series": series}
        )
    if not panels:
        raise AnalysisError(
            "Figure 5 needs runs of at least two N with the same model and setting",
            "lad eval -n 8 (or another N) with the same model and setting, then pass both runs",
        )
    missing += [
        Missing(
            "fig5",
            f"{run.name} ({run.setting or 'its setting'}) is the only run of its model and setting",
            "lad eval -n 8 (or another N) with the same model and setting",
        )
        for run in alone
    ]
    all_ns = sorted({n for p in panels for n in p["ns"]})
    models = {p["model"] for p in panels}
    rows = []
    for p in panels:
        label = p["setting"] + (f" ({p['model']})" if len(models) > 1 else "")
        for method, points in p["series"].items():
            cells = [acc_text(points[str(n)]) if str(n) in points else None for n in all_ns]
            rows.append([label, method, *cells])
    shown = [r for by_n in groups.values() if len(by_n) > 1 for r in by_n.values()]
    return Table(
        "fig5",
        "Figure 5: accuracy against the number of candidates N",
        f"Each method on each run's own records and calibration "
        f"({settings_note(options, runs=shown)}); Acc is mean ± std over the shuffles. "
        + calibration_note(shown),
        ["Setting", "Method", *[f"N = {n}" for n in all_ns]],
        rows,
        {"panels": panels},
        missing,
    )


def transfer_table(runs: Sequence[Run], options: AblateOptions = DEFAULTS) -> Table:
    """Table 3: each run's calibration applied to each other run's records (A → B), next to B
    with its own calibration. Runs must share the model, N, layers, labels and prompt."""
    runs = prepare(runs, options)
    if len(runs) < 2:
        raise AnalysisError(
            "Table 3 transfers a calibration between runs and was given one",
            "pass two or more runs of the same model and N, e.g. another dataset or setting",
        )
    rows, data, missing = [], [], []
    for source in runs:
        for target in runs:
            if source is target:
                continue
            reason = _transfer_refusal(source, target, options.check_calibration)
            if reason:
                missing.append(Missing("table3", reason))
                continue
            opts = target.options(options)
            for method in ("vanilla", "pride", "lad"):
                moved = target.metrics(method, opts, source.calibration)
                own = target.metrics(method, opts)
                rows.append(
                    [
                        f"{source.name} → {target.name}",
                        method,
                        *score_cells(moved),
                        *score_cells(own),
                    ]
                )
                data.append(
                    {
                        "calibration": source.name,
                        "records": target.name,
                        "method": method,
                        "transferred": summary(moved),
                        "own": summary(own),
                    }
                )
    if not rows:
        raise nothing_made(missing, "no pair of runs can exchange calibrations")
    return Table(
        "table3",
        "Table 3: calibration transfer",
        "A → B applies run A's calibration (fitted on A's calibration records) to run B's "
        "records; the last three columns are B with its own calibration. Vanilla uses no "
        f"calibration. {settings_note(options, runs=runs)}. "
        + ("" if options.check_calibration else UNCHECKED)
        + calibration_note(runs),
        ["A → B", "Method", "Acc", "RStd", "Cons.", "Acc (own)", "RStd (own)", "Cons. (own)"],
        rows,
        {"pairs": data},
        missing,
    )


UNCHECKED = (
    "Calibrations are applied without checking that they were made with the records' model, "
    "label scheme, prompt, chat template and picture preparation (--no-calibration-check). "
)


def _transfer_refusal(source: Run, target: Run, strict: bool = True) -> str:
    """Why source's calibration cannot score target's records ("" if it can); `strict` False
    checks only N, the layer count and Eq. 1's average."""
    pair = f"{source.name} → {target.name}"
    if source.num_candidates != target.num_candidates:
        return (
            f"{pair}: Table 3 transfers a calibration between runs of the same N; "
            f"{source.name} has N = {source.num_candidates}, {target.name} N = "
            f"{target.num_candidates}"
        )
    if source.calibration.obs_mean != target.calibration.obs_mean:
        return (
            f"{pair}: the calibrations average Eq. 1 over {source.calibration.obs_mean!r} and "
            f"{target.calibration.obs_mean!r}; pass --obs-mean to refit both alike"
        )
    try:
        source.calibration.check_compatible(target.records, target.fingerprint(), strict=strict)
    except LadError as e:
        if isinstance(e, CalibrationMismatch):  # ablate's reports name the command's flag
            e.skip = "--no-calibration-check"
        return f"{pair}: {target.arguments.get('calibration') or CALIBRATION_FILE}: {e}"
    return ""
