"""HTML report with PNG figures for one or more run directories (`lad report`).

Figures: confusion matrices vanilla vs LAD (paper Fig. 1), recall at each position, the
logit-vs-attention divergence at each answer position (Fig. 3), the calibration's bias matrix
(Eqs. 1, 5), and accuracy against N when the runs differ in N (Fig. 5); a table of vanilla,
PurAttn (attn-purified) and LAD accuracy with LAD's ΔRStd, one row per run (Table 5's layout);
under each run's table the position audit (lad.core.audit; docs/metrics.md), its bootstrap intervals
drawn as error bars in the recall, divergence and accuracy-against-N figures.
"""

from __future__ import annotations

import html
import math
from pathlib import Path
from typing import Any

import numpy as np

from lad.core.labels import get_scheme
from lad.core.metrics import ci_text
from lad.errors import CalibrationError, LadError, RunError
from lad.io.files import write_text
from lad.outputs.figures import DIVERGENCE_METHODS, gaps, plt
from lad.outputs.figures import save_figure as _save
from lad.outputs.tables import audit_html, cells_html, html_page, img_html, table5_html, table_html
from lad.run.audits import audit_folders
from lad.run.rundir import RunDir

_SCALARS = ("acc", "acc_std", "rstd", "cons")
_OPTIONAL = ("forward_passes_per_item", "generated_tokens_per_item", "parse_failure")


def _load_run(run_dir: Path) -> dict[str, Any]:
    """A run's metrics.json, run.json and calibration.json through lad.run.rundir.RunDir (the
    checks every reader of a run applies), and metrics.json's fields the report reads."""
    run = RunDir(run_dir).check()
    metrics = run.metrics()
    _check_metrics(metrics, run.metrics_file)
    out: dict[str, Any] = {"dir": run_dir, "metrics": metrics, "arguments": run.arguments}
    out["calibration"] = None
    if run.calibration_file.is_file():
        try:
            out["calibration"] = run.calibration(check=False).to_dict()
        except CalibrationError as e:
            raise RunError(str(e)) from None
    scheme = out["arguments"].get("labels", "digits")
    try:
        out["labels"] = get_scheme(scheme).labels(metrics["num_candidates"])
    except LadError as e:
        raise RunError(f"{run.run_file}: {e}") from None
    return out


def _number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _interval(x: Any) -> bool:
    """[lo, hi] of a bootstrap interval, or None."""
    return x is None or _list_of(x, 2, lambda v: isinstance(v, (int, float)) and math.isfinite(v))


def _list_of(x: Any, length: int, ok: Any) -> bool:
    return isinstance(x, list) and len(x) == length and all(ok(v) for v in x)


def _check_metrics(metrics: Any, path: Path) -> None:
    """The fields of the metrics format (docs/formats.md) that the report reads."""

    def bad(what: str) -> RunError:
        return RunError(f"{path}: damaged ({what}); rerun `lad eval` to rewrite it")

    n = metrics.get("num_candidates")
    if not (isinstance(n, int) and n >= 2):
        raise bad("'num_candidates' must be an integer >= 2")
    for key in ("num_items", "num_shuffles"):
        if not isinstance(metrics.get(key), int):
            raise bad(f"{key!r} must be an integer")
    methods = metrics.get("methods")
    if not isinstance(methods, dict) or not methods:
        raise bad("'methods' must map method names to their metrics")
    for name, m in methods.items():
        if not isinstance(m, dict) or not all(_number(m.get(k)) for k in _SCALARS):
            raise bad(f"method {name!r} needs numbers {list(_SCALARS)}")
        for key in _OPTIONAL:
            if m.get(key) is not None and not _number(m[key]):
                raise bad(f"method {name!r}: {key!r} must be a number")
        if not _list_of(m.get("recall_by_position"), n, lambda v: v is None or _number(v)):
            raise bad(f"method {name!r}: 'recall_by_position' must list N = {n} numbers or nulls")
        _check_audit(m, n, lambda what, name=name: bad(f"method {name!r}: {what}"))
        if not _list_of(m.get("confusion"), n, lambda row: _list_of(row, n, _number)):
            raise bad(f"method {name!r}: 'confusion' must be an N × N matrix of numbers")


def _check_audit(m: dict[str, Any], n: int, bad: Any) -> None:
    """lad.core.audit's keys, where present (metrics.json files before them lack them)."""
    ci = m.get("ci")
    if ci is not None and not (
        isinstance(ci, dict)
        and _list_of(ci.get("recall_by_position"), n, _interval)
        and all(_interval(ci.get(k)) for k in ("acc", "rstd", "flip_rate"))
    ):
        raise bad(
            "'ci' must hold [lo, hi] intervals (or null) of acc, rstd, flip_rate and N recalls"
        )
    for key in ("flip_rate", "circular_acc", "errors_due_to_order"):
        if not _interval([m.get(key) or 0.0] * 2):
            raise bad(f"{key!r} must be a number or null")
    floor = m.get("noise_floor")
    if floor is not None and not (
        isinstance(floor, dict) and _interval([floor.get("flip_rate")] * 2)
    ):
        raise bad("'noise_floor' must hold a number 'flip_rate'")
    test = m.get("position_test")
    if test is not None:
        p = test.get("p_value") if isinstance(test, dict) else None
        if not (p is None or (isinstance(p, (int, float)) and 0 <= p <= 1)):
            raise bad("'position_test' must hold a 'p_value' in [0, 1] (or null)")
        if not isinstance(test, dict) or not isinstance(test.get("permutations"), int):
            raise bad("'position_test' must hold an integer 'permutations'")


def _xticks(ax: Any, x: Any, labels: list[str]) -> None:
    """Position labels on the x axis, slanted when they are words ("the first image")."""
    slant = max(len(label) for label in labels) > 4
    ax.set_xticks(x, labels, rotation=30 if slant else 0, ha="right" if slant else "center")


def _heatmap(
    ax: Any, matrix: np.ndarray, labels: list[str], title: str, xlabel: str, vmax: float = 100
) -> None:
    ax.imshow(matrix, cmap="Blues", vmin=0, vmax=vmax)
    n = len(labels)
    _xticks(ax, range(n), labels)
    ax.set_yticks(range(n), labels)
    ax.set(xlabel=xlabel, ylabel="ground-truth position", title=title)
    if n <= 12:  # the numbers, where they fit
        for (i, j), v in np.ndenumerate(matrix):
            colour = "white" if v > 0.6 * vmax else "black"
            ax.text(j, i, f"{v:.0f}", ha="center", va="center", fontsize=7, color=colour)


def _confusion_figure(run: dict[str, Any]) -> Any:
    methods = run["metrics"]["methods"]
    shown = [m for m in ("vanilla", "lad") if m in methods] or list(methods)[:2]
    fig, axes = plt.subplots(1, len(shown), figsize=(4.6 * len(shown), 4.2), squeeze=False)
    for ax, name in zip(axes[0], shown, strict=True):
        m = methods[name]
        interval = (m.get("ci") or {}).get("rstd")  # older files: none
        title = f"{name}: Acc {m['acc']:.1f}, RStd {m['rstd']:.1f}"
        title += "" if interval is None else f" {ci_text(interval)}"
        _heatmap(ax, np.asarray(m["confusion"]), run["labels"], title, "selected position")
    return fig


def _recall_errors(m: dict[str, Any]) -> np.ndarray | None:
    """(2, N) distances from each recall down and up to its bootstrap interval (metrics.json's
    ci), NaN where there is none; None for a file without intervals."""
    ci = m.get("ci")
    if ci is None:
        return None
    recall = gaps(m["recall_by_position"])
    lo, hi = np.array([v or (np.nan, np.nan) for v in ci["recall_by_position"]], dtype=float).T
    return np.stack([recall - lo, hi - recall])


def _recall_figure(run: dict[str, Any]) -> Any:
    fig, ax = plt.subplots(figsize=(6.4, 3.8))
    x = np.arange(len(run["labels"]))
    for name, m in run["metrics"]["methods"].items():
        recall, errors = gaps(m["recall_by_position"]), _recall_errors(m)
        ax.errorbar(x, recall, yerr=errors, marker="o", capsize=3, label=name)
    _xticks(ax, x, run["labels"])
    boot = run["metrics"].get("bootstrap")
    bars = f" (bars: {boot['level']:g}% bootstrap intervals)" if boot else ""
    title = "Recall at each position" + bars
    ax.set(ylim=(-2, 102), xlabel="ground-truth position", ylabel="recall (%)", title=title)
    ax.legend(fontsize=8, ncol=2)
    return fig


def _divergence_figure(run: dict[str, Any]) -> Any:
    """Fig. 3: where the logits fail, does the attention still find the answer?"""
    methods = run["metrics"]["methods"]
    shown = [(label, methods[m]) for m, (_, label) in DIVERGENCE_METHODS.items() if m in methods]
    if "vanilla" not in methods or "attn" not in methods:
        return None
    x = np.arange(len(run["labels"]))
    width = 0.8 / len(shown)
    fig, ax = plt.subplots(figsize=(6.8, 4.0), layout="constrained")
    for i, (label, m) in enumerate(shown):
        offset = (i - (len(shown) - 1) / 2) * width
        recall, errors = gaps(m["recall_by_position"]), _recall_errors(m)
        ax.bar(x + offset, recall, width, yerr=errors, capsize=2, label=label)
    _xticks(ax, x, run["labels"])
    ax.set(ylim=(0, 105), xlabel="ground-truth position", ylabel="accuracy (%)")
    ax.set_title("Logit-attention divergence")
    fig.legend(loc="outside lower center", ncols=len(shown), fontsize=8, frameon=False)
    return fig


def _bias_figure(run: dict[str, Any]) -> Any:
    cal = run["calibration"]
    if cal is None:
        return None
    fig, axes = plt.subplots(1, 2, figsize=(9.2, 4.2))
    obs = 100 * np.exp(np.asarray(cal["log_obs"]))
    bias = 100 * np.exp(np.asarray(cal["log_bias"]))  # rows need not sum to 1 (Eq. 5)
    vmax = float(max(obs.max(), bias.max()))
    _heatmap(axes[0], obs, run["labels"], "P_obs(j | i) (%), Eq. 1", "predicted position j", vmax)
    title = f"P_bias(j | i) (%), Eq. 5 (γ = {cal['gamma']:.2f})"
    _heatmap(axes[1], bias, run["labels"], title, "predicted position j", vmax)
    axes[1].set_ylabel("")
    return fig


def _acc_vs_n_figure(runs: list[dict[str, Any]]) -> Any:
    """Fig. 5: one line per method and (model, setting), as `lad ablate` groups runs; only
    groups with at least two N are drawn."""
    groups: dict[tuple[str, str], dict[int, dict[str, Any]]] = {}
    for r in runs:  # two runs of one N in a group: the first, as lad ablate's Figure 5
        key = (str(r["arguments"].get("model", "")), str(r["arguments"].get("setting", "")))
        groups.setdefault(key, {}).setdefault(r["metrics"]["num_candidates"], r)
    groups = {k: by_n for k, by_n in groups.items() if len(by_n) > 1}
    if not groups:
        return None
    fig, ax = plt.subplots(figsize=(6.4, 3.8))
    names = sorted({m for r in runs for m in r["metrics"]["methods"]})
    colours = {name: f"C{i % 10}" for i, name in enumerate(names)}
    styles = ("-", "--", ":", "-.")
    models = {model for model, _ in groups}
    for g, ((model, setting), by_n) in enumerate(groups.items()):
        where = setting + (f" ({model})" if len(models) > 1 else "")
        scored = {n: by_n[n]["metrics"]["methods"] for n in sorted(by_n)}
        for name in names:
            points = {n: methods[name] for n, methods in scored.items() if name in methods}
            if not points:
                continue
            label = name if len(groups) == 1 else f"{name}, {where}"
            style = styles[g % len(styles)]
            acc = [m["acc"] for m in points.values()]
            ax.plot(list(points), acc, style, marker="o", color=colours[name], label=label)
            ci = {n: (m.get("ci") or {}).get("acc") for n, m in points.items()}  # older files: none
            drawn = [(n, *c) for n, c in ci.items() if c is not None]
            if drawn:  # the bootstrap interval of each point, as an error bar
                ax.vlines(*zip(*drawn, strict=True), color=colours[name], linewidth=1)
    ax.set_xticks(sorted({n for by_n in groups.values() for n in by_n}))  # a tick at each N drawn
    ax.set(xlabel="number of candidates N", ylabel="accuracy (%)", title="Accuracy against N")
    ax.legend(fontsize=8, ncol=2)
    return fig


# Each run's figures: file stem, the HTML before the picture, its alt text, what draws it (None
# when the run lacks what it shows).
RUN_FIGURES = (
    ("confusion", "<h3>Confusion (% of answers at each position)</h3>\n", "confusion matrices",
     _confusion_figure),
    ("divergence", "<h3>Logits vs attention</h3>", "divergence", _divergence_figure),
    ("recall", "<h3>Recall by position</h3>", "recall", _recall_figure),
    ("bias", "<h3>Calibration</h3>", "bias matrix", _bias_figure),
)  # fmt: skip


def write_report(run_dirs: list[Path], out_dir: Path) -> Path:
    """Write `out_dir/index.html` and its figures; return the page's path. A folder holding a
    harness audit (lad_audit.json, lad.harness.audit) stands for the run folders it lists."""
    runs = [_load_run(d) for given in run_dirs for d in audit_folders(Path(given))]
    parts = [cells_html(Path(given)) for given in run_dirs]
    # A mixed run's parts are in its table of cells, each N once (its group row): not again here.
    mixed = {str(p) for given in run_dirs if RunDir(given).is_mixed for p in audit_folders(given)}
    if table5 := table5_html([run for run in runs if str(run["dir"]) not in mixed]):
        parts.append(
            "<h2>Vanilla, PurAttn and LAD</h2><p>Accuracy (%) per run in the paper's Table 5 "
            "layout; ΔRStd is LAD's RStd minus vanilla's.</p>" + table5
        )
    if (fig := _acc_vs_n_figure(runs)) is not None:
        _save(fig, out_dir / "acc_vs_n.png")
        parts.append("<h2>Accuracy against N</h2>" + img_html("acc_vs_n.png", "accuracy against N"))
    for i, run in enumerate(runs):
        tag = "" if len(runs) == 1 else f"_{i + 1}"
        desc = ", ".join(f"{k}={v}" for k, v in run["arguments"].items() if v not in (None, {}, ""))
        m = run["metrics"]
        parts.append(f"<h2>{html.escape(str(run['dir']))}</h2>")
        parts.append(
            f"<p>N = {m['num_candidates']}, {m['num_items']} items × {m['num_shuffles']} shuffles."
            f"<br><code>{html.escape(desc)}</code></p>" + table_html(m) + audit_html(m)
        )
        for stem, heading, alt, draw in RUN_FIGURES:
            if (fig := draw(run)) is not None:
                _save(fig, out_dir / f"{stem}{tag}.png")
                parts.append(heading + img_html(f"{stem}{tag}.png", alt))
    page = out_dir / "index.html"
    write_text(page, html_page("lad report", parts))
    return page
