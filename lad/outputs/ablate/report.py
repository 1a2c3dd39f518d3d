"""Writes `lad ablate`'s results: per analysis a Markdown table, a JSON table and a PNG figure,
then `index.html` with all of them and `summary.json` (what was made, what was not and why).

    page = write_ablation(ablate(load_runs(["runs/n4"])), "runs/n4/ablate")
"""

from __future__ import annotations

import html
import json
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from lad.io.files import write_text
from lad.outputs.ablate import analyses
from lad.outputs.ablate.runs import AblateOptions, Ablation, Missing, Run, Table, tau_label
from lad.outputs.figures import DIVERGENCE_METHODS, gaps, plt
from lad.outputs.figures import save_figure as _save
from lad.outputs.tables import html_page, html_table, img_html


def write_ablation(result: Ablation, out_dir: str | Path) -> Path:
    """Write every table of `result` into out_dir; return the path of index.html."""
    out = Path(out_dir)
    for table in result.tables:
        stem = ANALYSES[table.key].stem
        write_text(out / f"{stem}.md", markdown(table, f"{stem}.png"))
        fields = asdict(table)  # the Table's fields in their order, its key as "analysis"
        _write_json(out / f"{stem}.json", {"analysis": fields.pop("key"), **fields})
        ANALYSES[table.key].figure(table, out / f"{stem}.png")
    summary = {
        "runs": result.runs,
        "analyses": {t.key: ANALYSES[t.key].stem for t in result.tables},
        "missing": [asdict(m) for m in result.missing],
    }
    _write_json(out / "summary.json", summary)
    page = out / "index.html"
    write_text(page, html_page("lad ablate", _html(result)))
    return page


def _write_json(path: Path, obj: Any) -> None:
    write_text(path, json.dumps(obj, indent=1, ensure_ascii=False, allow_nan=False) + "\n")


def cell_text(value: Any) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.2f}"
    return str(value)


def missing_text(m: Missing) -> str:
    return f"{m.analysis}: {m.reason}" + (f"; to get it: {m.fix}" if m.fix else "")


def markdown(table: Table, figure: str) -> str:
    """The table as GitHub Markdown, with its caption, what it leaves out, and its figure."""

    def row(cells: list[Any]) -> str:
        return "| " + " | ".join(cell_text(c).replace("|", "\\|") for c in cells) + " |"

    lines = [f"## {table.title}", "", table.caption, "", row(table.columns)]
    lines.append("|" + "|".join("---" for _ in table.columns) + "|")
    lines += [row(r) for r in table.rows]
    if table.missing:
        lines += ["", "Not shown:", ""] + [f"- {missing_text(m)}" for m in table.missing]
    lines += ["", f"![{table.title}]({figure})"]
    return "\n".join(lines) + "\n"


def _html(result: Ablation) -> list[str]:
    esc = html.escape
    parts = ["<p>Runs: " + ", ".join(f"<code>{esc(r)}</code>" for r in result.runs) + "</p>"]
    for table in result.tables:
        stem = ANALYSES[table.key].stem
        rows = [[esc(cell_text(c)) for c in r] for r in table.rows]
        parts += [
            f'<h2 id="{stem}">{esc(table.title)}</h2>',
            f"<p>{esc(table.caption)}</p>",
            html_table([esc(c) for c in table.columns], rows),
            img_html(f"{stem}.png", table.title),
            f'<p><a href="{stem}.md">{stem}.md</a> · <a href="{stem}.json">{stem}.json</a></p>',
        ]
    if result.missing:
        parts.append("<h2>Not possible with these runs</h2><ul>")
        parts += [f"<li>{esc(missing_text(m))}</li>" for m in result.missing]
        parts.append("</ul>")
    return parts


# ---------------------------------------------------------------------------------------------
# Figures, one per analysis, drawn from the table's `data`.


def _by_run(items: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for item in items:
        out.setdefault(item["run"], []).append(item)
    return out


def _ablation_figure(table: Table, path: Path) -> None:
    runs = _by_run(table.data["rows"])
    labels = [  # each Table 4 row, from its rows of every run
        f"{rows[0]['strategy']} {'✓' if rows[0]['prior'] else '–'}" + _k_label(rows)
        for rows in zip(*runs.values(), strict=True)
    ]
    y = np.arange(len(labels))
    height = 0.8 / len(runs)
    fig, ax = plt.subplots(figsize=(7.2, 0.45 * len(labels) * max(1, len(runs) ** 0.5) + 1.2))
    for i, (name, rows) in enumerate(runs.items()):
        acc = [r["acc"] for r in rows]
        err = [r["acc_std"] for r in rows]
        ax.barh(y + (i - (len(runs) - 1) / 2) * height, acc, height, xerr=err, label=name)
    ax.set_yticks(y, labels)
    ax.invert_yaxis()
    ax.set(xlim=(0, 100), xlabel="accuracy (%)", title="Table 4: ablation (strategy, prior, K)")
    ax.legend(fontsize=8, loc="lower right")
    _save(fig, path)


def _k_label(rows: Sequence[dict[str, Any]]) -> str:
    """A Table 4 row's K as the Markdown shows it, "K=8 (= all 4)"; runs that show it
    differently are named."""
    k = rows[0]["k"]
    if k is None:
        return ""
    shown = {r["k_shown"] for r in rows}
    if len(shown) == 1:
        return f" K={shown.pop()}"
    clamped = [r["run"] for r in rows if r["k_shown"] != str(k)]
    return f" K={k} (= all for {', '.join(clamped)})"


def _k_title(table: Table) -> str:
    """ ", K = 8 (= all 4)" for a figure's title where a run has fewer layers than K."""
    k = table.data.get("k", "")
    return f", K = {k}" if "(=" in k else ""


def _size_figure(table: Table, path: Path) -> None:
    fig, ax = plt.subplots(figsize=(6.4, 3.9))
    for i, (name, points) in enumerate(_by_run(table.data["points"]).items()):
        colour = f"C{i}"
        x = [p["size"] for p in points]
        for method, style, label in (("lad", "-o", "LAD"), ("pride", "--s", "PriDe")):
            mean = np.array([p[f"{method}_mean"] for p in points])
            std = np.array([p[f"{method}_shuffle_std"] for p in points])  # the paper's band
            ax.plot(x, mean, style, color=colour, label=f"{label} ({name})")
            ax.fill_between(x, mean - std, mean + std, color=colour, alpha=0.15)
    ax.set_xscale("log")
    sizes = sorted({p["size"] for p in table.data["points"]})
    ax.set_xticks(sizes, [str(s) for s in sizes])
    ax.minorticks_off()
    ax.set(xlabel="|D_cal| (calibration items)", ylabel="accuracy (%)")
    title = "Figure 6(a): calibration size" + _k_title(table)
    ax.set_title(title + "\n(mean over subsets ± std over shuffles)", fontsize=10)
    ax.legend(fontsize=8)
    _save(fig, path)


def _tau_position(tau: float | str, finite_max: float) -> float:
    return finite_max + 2.0 if tau == "inf" else float(tau)


def _temperature_figure(table: Table, path: Path) -> None:
    points = table.data["points"]
    top = max((p["tau"] for p in points if p["tau"] != "inf"), default=0.0)  # the largest finite τ
    fig, ax = plt.subplots(figsize=(6.4, 3.9))
    for i, (name, rows) in enumerate(_by_run(points).items()):
        colour = f"C{i}"
        x = np.array([_tau_position(r["tau"], top) for r in rows])
        acc = np.array([r["acc"] for r in rows])
        std = np.array([r["acc_std"] for r in rows])
        limit = np.array([r["tau"] == "inf" for r in rows])
        low, high = (acc - std)[~limit], (acc + std)[~limit]
        ax.plot(x[~limit], acc[~limit], "-o", color=colour, label=f"LAD ({name})")
        ax.fill_between(x[~limit], low, high, color=colour, alpha=0.15)
        if limit.any() and (~limit).any():  # τ = ∞: a limit, joined by a dotted line
            last = np.flatnonzero(~limit)[-1]
            j = np.flatnonzero(limit)[0]
            ax.plot(x[[last, j]], acc[[last, j]], ":", color=colour)
            ax.errorbar(x[j], acc[j], yerr=std[j], fmt="o", color=colour, capsize=3)
        ax.axhline(rows[0]["pride_acc"], color=colour, ls="--", lw=1, label=f"PriDe ({name})")
    taus = sorted({p["tau"] for p in points}, key=lambda t: _tau_position(t, top))
    ax.set_xticks([_tau_position(t, top) for t in taus], [tau_label(float(t)) for t in taus])
    title = "Figure 6(b): temperature" + _k_title(table) + " (mean ± std over shuffles)"
    ax.set(xlabel="τ (Eq. 12)", ylabel="accuracy (%)", title=title)
    ax.legend(fontsize=8)
    _save(fig, path)


def _n_figure(table: Table, path: Path) -> None:
    panels = table.data["panels"]
    size = (5.6 * len(panels), 3.9)
    fig, axes = plt.subplots(1, len(panels), figsize=size, squeeze=False, sharey=True)
    for ax, panel in zip(axes[0], panels, strict=True):
        for name, points in panel["series"].items():
            ns = [n for n in panel["ns"] if str(n) in points]
            acc = [points[str(n)]["acc"] for n in ns]
            err = [points[str(n)]["acc_std"] for n in ns]
            ax.errorbar(ns, acc, yerr=err, marker="o", capsize=3, label=name)
        title = f"{panel['setting'] or 'runs'} ({Path(panel['model']).name or '?'})"
        ax.set(xticks=panel["ns"], xlabel="number of candidates N", title=title)
        ax.legend(fontsize=8, ncol=2)
    axes[0][0].set_ylabel("accuracy (%)")
    fig.suptitle("Figure 5: accuracy against N")
    _save(fig, path)


def _transfer_figure(table: Table, path: Path) -> None:
    pairs = table.data["pairs"]
    x = np.arange(len(pairs))
    fig, ax = plt.subplots(figsize=(max(6.4, 0.7 * len(pairs) + 2), 4.2))
    for offset, key, label in ((-0.2, "transferred", "A's calibration"), (0.2, "own", "B's own")):
        acc, err = [p[key]["acc"] for p in pairs], [p[key]["acc_std"] for p in pairs]
        ax.bar(x + offset, acc, 0.4, yerr=err, label=label)
    ax.set_xticks(x, [f"{p['calibration']}→{p['records']}\n{p['method']}" for p in pairs])
    ax.tick_params(axis="x", labelsize=7)
    ax.set(ylim=(0, 105), ylabel="accuracy (%)", title="Table 3: calibration transfer (A → B)")
    ax.legend(fontsize=8)
    _save(fig, path)


def _divergence_figure(table: Table, path: Path) -> None:
    runs = table.data["runs"]
    fig, axes = plt.subplots(len(runs), 1, figsize=(7.2, 3.4 * len(runs)), squeeze=False)
    for ax, run in zip(axes[:, 0], runs, strict=True):
        methods = run["methods"]
        n = len(next(iter(methods.values()))["recall_by_position"])
        x = np.arange(n + 1)
        width = 0.8 / len(methods)
        for i, (name, m) in enumerate(methods.items()):
            values = [*gaps(m["recall_by_position"]), m["acc"]]
            offset = (i - (len(methods) - 1) / 2) * width
            ax.bar(x + offset, values, width, label=DIVERGENCE_METHODS[name][0])
        ax.set_xticks(x, [str(p + 1) for p in range(n)] + ["all"])
        title = f"Table 7: logits vs attention ({run['run']}{_k_title(table)})"
        ax.set(xlabel="ground-truth position", ylabel="accuracy (%)", title=title)
        ax.set_ylim(0, 119)  # room for the legend above 100
        ax.legend(fontsize=8, ncol=4)
    _save(fig, path)


def _cost_figure(table: Table, path: Path) -> None:
    fig, ax = plt.subplots(figsize=(6.4, 3.9))
    markers = "os^Dv<>p"
    for i, (name, rows) in enumerate(_by_run(table.data["rows"]).items()):
        for r in rows:
            style = {"color": analyses.COST_METHODS[r["method"]], "s": 50}
            x, label = r["forward_passes_per_item"], f"{r['method']} ({name})"
            ax.scatter(x, r["acc"], marker=markers[i % len(markers)], label=label, **style)
    passes = sorted({r["forward_passes_per_item"] for r in table.data["rows"]})
    ax.set_xscale("log", base=2)
    ax.set_xticks(passes, [f"{p:g}" for p in passes])
    ax.minorticks_off()
    ax.set_xlim(min(passes) / 1.6, max(passes) * 1.6)
    ax.set(xlabel="forward passes per prompt", ylabel="accuracy (%)")
    ax.set_title("Table 8: accuracy against cost")
    ax.legend(fontsize=7, ncol=2)
    _save(fig, path)


class Analysis(NamedTuple):
    """One analysis of `lad ablate`: what makes its table from the runs, the stem of the files
    it is written to, and what draws its figure from the table's `data`."""

    make: Callable[[list[Run], AblateOptions], Table]
    stem: str
    figure: Callable[[Table, Path], None]


# Every analysis by key, in the paper's order.
ANALYSES = {
    "fig5": Analysis(analyses.accuracy_vs_n, "fig5_accuracy_vs_n", _n_figure),
    "table3": Analysis(analyses.transfer_table, "table3_transfer", _transfer_figure),
    "table4": Analysis(analyses.ablation_table, "table4_ablation", _ablation_figure),
    "fig6a": Analysis(analyses.calibration_size_sweep, "fig6a_calibration_size", _size_figure),
    "fig6b": Analysis(analyses.temperature_sweep, "fig6b_temperature", _temperature_figure),
    "table7": Analysis(analyses.divergence_table, "table7_divergence", _divergence_figure),
    "table8": Analysis(analyses.cost_table, "table8_cost", _cost_figure),
}
