"""The paper's analyses of finished runs: Figure 5 (accuracy against N) and Table 3 (calibration
transfer) across runs; Table 4 (ablation), Figure 6(a) (|D_cal|), Figure 6(b) (τ), Table 7
(divergence by position) and Table 8 (cost) of each run on its own. Every number is `Run.metrics`:
lad.core.methods' predictions on the run's stored records, measured by lad.core.metrics.

    table = ablation_table(load_run("runs/adv4"), AblateOptions(ks=(1, 2, 4)))
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np

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
    calibration_subsets,
    k_note,
    nothing_made,
    prepare,
    score_cells,
    settings_note,
    summary,
    tau_json,
    tau_label,
)
from lad.outputs.figures import DIVERGENCE_METHODS
from lad.run.rundir import CALIBRATION_FILE
from lad.run.spec import RecordSpec
from lad.run.stages import SOFA_GRID

# ---------------------------------------------------------------------------------------------
# Across runs: Figure 5 and Table 3.


def accuracy_vs_n(runs: Sequence[Run], options: AblateOptions = DEFAULTS) -> Table:
    """Figure 5: every method's accuracy against N, one panel per (model, setting)."""
    runs = prepare(runs, options)
    groups: dict[tuple[str, str], dict[int, Run]] = {}
    missing = []
    for run in runs:
        first = groups.setdefault((run.model, run.setting), {}).setdefault(run.num_candidates, run)
        if first is not run:
            same = f"N = {run.num_candidates} ({run.setting or 'same setting'})"
            reason = f"{first.name} and {run.name} both have {same}; Figure 5 uses {first.name}"
            missing.append(Missing("fig5", reason))
    panels, shown = [], []
    another_n = "lad eval -n 8 (or another N) with the same model and setting"
    for (model, setting), by_n in groups.items():
        if len(by_n) < 2:
            (run,) = by_n.values()
            where = f"{run.name} ({run.setting or 'its setting'})"
            reason = f"{where} is the only run of its model and setting"
            missing.append(Missing("fig5", reason, another_n))
            continue
        shown += by_n.values()
        ns = sorted(by_n)
        series = {}
        for method in METHODS:
            points = {
                str(n): summary(by_n[n].metrics(method, by_n[n].options(options)))
                for n in ns
                if not by_n[n].lacks(method)
            }
            if points:
                series[method] = points
        names = {str(n): by_n[n].name for n in ns}
        panels.append(
            {"model": model, "setting": setting, "ns": ns, "runs": names, "series": series}
        )
    if not panels:
        raise AnalysisError(
            "Figure 5 needs runs of at least two N with the same model and setting",
            another_n + ", then pass both runs",
        )
    all_ns = sorted({n for p in panels for n in p["ns"]})
    models = {p["model"] for p in panels}
    rows = []
    for p in panels:
        label = p["setting"] + (f" ({p['model']})" if len(models) > 1 else "")
        for method, points in p["series"].items():
            cells = [acc_text(points[str(n)]) if str(n) in points else None for n in all_ns]
            rows.append([label, method, *cells])
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
            opts, pair = target.options(options), f"{source.name} → {target.name}"
            for method in ("vanilla", "pride", "lad"):
                moved = target.metrics(method, opts, source.calibration)
                own = target.metrics(method, opts)
                rows.append([pair, method, *score_cells(moved), *score_cells(own)])
                names = {"calibration": source.name, "records": target.name, "method": method}
                data.append({**names, "transferred": summary(moved), "own": summary(own)})
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
        made_for = RecordSpec.from_mapping(target.arguments).fingerprint(  # what it must fit
            target.num_candidates, target.inputs
        )
        source.calibration.check_compatible(target.records, made_for, strict=strict)
    except LadError as e:
        if isinstance(e, CalibrationMismatch):  # ablate's reports name the command's flag
            e.skip = "--no-calibration-check"
        return f"{pair}: {target.arguments.get('calibration') or CALIBRATION_FILE}: {e}"
    return ""


# ---------------------------------------------------------------------------------------------
# Table 4: the ablation of the attention-guided mechanisms.


def ablation_table(runs: Run | Sequence[Run], options: AblateOptions = DEFAULTS) -> Table:
    """Table 4: attention readout without / with prior, all layers, dynamic layers without prior,
    dynamic with prior for each K, on each run's records and calibration."""
    runs = prepare(runs, options)
    top_k = options.options.top_k
    table4 = [  # (strategy, prior, K, method, MethodOptions changes) of each row
        ("Attn Readout", False, top_k, "attn", {}),
        ("Attn Readout", True, top_k, "attn-purified", {}),
        ("All Layers", True, None, "lad", {"layers": "all"}),
        ("Dynamic", False, top_k, "lad", {"use_prior": False}),
        *[("Dynamic", True, k, "lad", {"top_k": k}) for k in options.ks],
    ]
    rows, data = [], []
    for run in runs:
        nl = run.records.num_layers
        for strategy, prior, k, method, changes in table4:
            opts = run.options(options, **changes)  # K above the layers searched: clamped
            m = run.metrics(method, opts)
            shown_k = "–" if k is None else run.k_text(k, options.options.layer_range)
            rows.append([run.name, strategy, "✓" if prior else "–", shown_k, *score_cells(m)])
            row = {
                "run": run.name,
                "strategy": strategy,
                "prior": prior,
                "k": k,
                "k_shown": shown_k,
            }
            used = {"layers_used": nl if k is None else opts.top_k, "method": method}
            chosen = {**dataclasses.asdict(opts), "tau": tau_json(opts.tau)}
            data.append({**row, **used, "options": chosen, **summary(m)})
    return Table(
        "table4",
        "Table 4: ablation of the attention-guided mechanisms",
        f"{settings_note(options, runs=runs)}. Attn Readout without prior is the raw attention "
        "argmax (method attn), with prior the purified attention π (attn-purified); the other "
        "rows are LAD (Eq. 14) with that layer strategy, prior and K. Acc is mean ± std over the "
        f"shuffles. {calibration_note(runs)}",
        ["Run", "Strategy", "Prior", "K", "Acc", "RStd", "Cons."],
        rows,
        {"rows": data},
    )


# ---------------------------------------------------------------------------------------------
# Figure 6: calibration size and temperature.


def calibration_size_sweep(runs: Run | Sequence[Run], options: AblateOptions = DEFAULTS) -> Table:
    """Figure 6(a): LAD's and PriDe's accuracy against |D_cal|, each calibration fitted on a
    random subset of the run's calibration items. A point is the mean Acc over the subsets; its
    band, as the paper's caption, the std over the T evaluation shuffles (each subset's, then
    averaged over the subsets); the spread over the subsets is kept beside it."""
    runs = [runs] if isinstance(runs, Run) else list(runs)  # subsets of all their items
    rows, data, missing = [], [], []
    most = max(options.sizes)
    for run in runs:
        try:
            items = run.calibration_items()
        except AnalysisError as e:
            fix = f"{e.fix}; |D_cal| up to {most} needs lad eval --calibration-items {most}"
            missing.append(Missing("fig6a", e.reason, fix))
            continue
        have = len(items)
        too_big = [s for s in options.sizes if s > have]
        if too_big:
            sizes = ", ".join(map(str, too_big))
            reason = f"|D_cal| = {sizes} for {run.name}: its calibration holds {have} items"
            fix = f"lad eval --calibration-items {most} keeps every calibration record"
            missing.append(Missing("fig6a", reason, fix))
        opts = run.options(options)
        for size in (s for s in options.sizes if s <= have):
            subsets = calibration_subsets(items, size, options.subsets, options.seed)
            fitted = [run.fit_calibration(subset) for subset in subsets]
            got = {m: [run.metrics(m, opts, c) for c in fitted] for m in ("lad", "pride")}
            point = {m: _size_point(v) for m, v in got.items()}
            accs = [f"{p['mean']:.2f} ± {p['shuffle_std']:.2f}" for p in point.values()]
            spreads = [round(p["subset_std"], 2) for p in point.values()]
            rows.append([run.name, size, len(subsets), *accs, *spreads])
            fields = {f"{m}_{k}": v for m, p in point.items() for k, v in p.items()}
            data.append({"run": run.name, "size": size, "subsets": subsets, **fields})
    if not rows:
        raise nothing_made(missing, "Figure 6(a) needs calibration records")
    shuffles = "/".join(str(t) for t in sorted({len(np.unique(r.records.ordering)) for r in runs}))
    return Table(
        "fig6a",
        "Figure 6(a): accuracy against the calibration size |D_cal|",
        f"Each |D_cal| draws {options.subsets} random subsets of the run's calibration items "
        f"(seed {options.seed}; without replacement across subsets; all of them when there are "
        "no more), fits a calibration on each subset's symmetrised records and scores the run's "
        f"records ({settings_note(options, runs=runs)}). Acc is the mean over the subsets ± the "
        f"std over the {shuffles} evaluation shuffles (the paper's band; each subset's, "
        "averaged over the subsets); subset std is the spread of Acc over the subsets.",
        ["Run", "|D_cal|", "subsets", "LAD Acc", "PriDe Acc", "LAD subset std", "PriDe subset std"],
        rows,
        {"points": data, "k": k_note(options, runs)},
        missing,
    )


def _size_point(metrics: list[dict]) -> dict[str, Any]:
    """One Figure 6(a) point of a method from each subset's metrics: Acc per subset, its std
    over the shuffles per subset, their means (the point and its band) and the subset spread."""
    acc = [m["acc"] for m in metrics]
    shuffle_std = [m["acc_std"] for m in metrics]
    return {
        "acc": acc,
        "acc_shuffle_std": shuffle_std,
        "mean": float(np.mean(acc)),
        "shuffle_std": float(np.mean(shuffle_std)),
        "subset_std": float(np.std(acc, ddof=1)) if len(acc) > 1 else 0.0,
    }


def temperature_sweep(runs: Run | Sequence[Run], options: AblateOptions = DEFAULTS) -> Table:
    """Figure 6(b): LAD's accuracy against τ (0 and ∞ are the limits), PriDe for reference."""
    runs = prepare(runs, options)
    rows, data = [], []
    for run in runs:
        pride = run.metrics("pride", run.options(options))
        for tau in options.taus:
            m = run.metrics("lad", run.options(options, tau=tau))
            rows.append([run.name, tau_label(tau), *score_cells(m), acc_text(pride)])
            point = {"run": run.name, "tau": tau_json(tau), **summary(m)}
            data.append({**point, "pride_acc": pride["acc"]})
    return Table(
        "fig6b",
        "Figure 6(b): accuracy against the temperature τ",
        f"LAD with {settings_note(options, tau=False, runs=runs)} and τ of Eq. 12; τ = 0 makes π "
        "uniform (a static mixture of the bias rows), τ = ∞ puts all of π on the purified "
        "attention's argmax. PriDe does not depend on τ. Acc is mean ± std over the shuffles. "
        + calibration_note(runs),
        ["Run", "τ", "LAD Acc", "RStd", "Cons.", "PriDe Acc"],
        rows,
        {"points": data, "k": k_note(options, runs)},
    )


# ---------------------------------------------------------------------------------------------
# Tables 7 and 8.


def divergence_table(runs: Run | Sequence[Run], options: AblateOptions = DEFAULTS) -> Table:
    """Table 7: accuracy at each ground-truth position (recall) and overall of the logits
    (vanilla), the raw attention, the purified attention and LAD."""
    runs = prepare(runs, options)
    rows, data = [], []
    for run in runs:
        opts = run.options(options)
        got = {m: run.metrics(m, opts) for m in DIVERGENCE_METHODS}
        for p in range(run.num_candidates):
            recalls = [got[m]["recall_by_position"][p] for m in DIVERGENCE_METHODS]
            rows.append([run.name, str(p + 1), *(r if r is None else round(r, 2) for r in recalls)])
        rows.append([run.name, "all", *[acc_text(got[m]) for m in DIVERGENCE_METHODS]])
        data.append({"run": run.name, "methods": {m: summary(v) for m, v in got.items()}})
    return Table(
        "table7",
        "Table 7: logit-attention divergence by ground-truth position",
        "Accuracy (%) of each readout over the records whose answer is at that position (1 = "
        "first), and overall (mean ± std over the shuffles): the logits (vanilla), the raw "
        "attention argmax, the purified attention π (Eq. 12) and LAD. "
        f"{settings_note(options, runs=runs)}. {calibration_note(runs)}",
        ["Run", "Position", *(name for name, _ in DIVERGENCE_METHODS.values())],
        rows,
        {"runs": data, "k": k_note(options, runs)},
    )


def cost_table(runs: Run | Sequence[Run], options: AblateOptions = DEFAULTS) -> Table:
    """Table 8: Acc, RStd, Cons. and forward passes of vanilla, SoFA, permutation averaging and
    LAD; needs perm_records.jsonl and/or sofa_records.jsonl."""
    runs = prepare(runs, options)
    rows, data, missing = [], [], []
    for run in runs:
        absent = [m for m in ("sofa", "perm-avg") if run.lacks(m)]
        missing += [
            Missing("table8", f"{m} for {run.name}: no {run.lacks(m)}", run.methods_fix(m))
            for m in absent
        ]
        if len(absent) == 2:
            continue
        opts = run.options(options)
        for method in (m for m in COST_METHODS if not run.lacks(m)):
            m = run.metrics(method, opts)
            once = _calibration_passes(run, method)
            passes = f"{m['forward_passes_per_item']:g}"
            rows.append([run.name, method, *score_cells(m), passes, once])
            scored = {"run": run.name, "method": method, **summary(m)}
            data.append({**scored, "calibration_passes": once})
    if not rows:
        raise AnalysisError(
            "Table 8 compares with SoFA and permutation averaging: "
            + "; ".join(m.reason for m in missing),
            runs[0].methods_fix("sofa and perm-avg") if len(runs) == 1 else "",
        )
    return Table(
        "table8",
        "Table 8: cost against SoFA and permutation averaging",
        "Forward passes per evaluated prompt, and passes made once before evaluating "
        "(calibration: N per calibration item; SoFA with --sofa-sigma auto: its σ grid on the "
        f"calibration items). {settings_note(options, runs=runs)}. "
        + calibration_note([r for r in runs if r.name in {d["run"] for d in data}]),
        ["Run", "Method", "Acc", "RStd", "Cons.", "passes/item", "passes once"],
        rows,
        {"rows": data},
        missing,
    )


# Table 8's methods, in its order, each with its colour in the figure.
COST_METHODS = {"vanilla": "C0", "sofa": "C1", "perm-avg": "C2", "blank": "0.5", "lad": "C3"}


def _calibration_passes(run: Run, method: str) -> int:
    n = run.num_candidates
    cal_items = run.calibration.num_items or 0
    if method in ("lad", "pride"):
        return n * cal_items
    if method == "sofa" and run.arguments.get("sofa_sigma") == "auto":
        return len(SOFA_GRID) * n * cal_items
    return 0
