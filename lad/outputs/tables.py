"""The report's tables as HTML: each run's methods and audit panel, Table 5's layout across runs,
a mixed run's cells (lad.outputs.report)."""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any

from lad.run.rundir import RunDir

STYLE = (
    "body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;color:#222}"
    "table{border-collapse:collapse;margin:1em 0}"
    "td,th{padding:4px 10px;border-bottom:1px solid #ddd;"
    "text-align:right}th:first-child,td:first-child{text-align:left}img{max-width:100%}"
    "code{background:#f4f4f4;padding:1px 4px}"
)


def _delta_rstd(methods: dict[str, Any], name: str) -> float | None:
    """RStd of `name` minus vanilla's (metrics.json's delta_rstd; older files lack it)."""
    if name not in methods or "vanilla" not in methods:
        return None
    return float(methods[name]["rstd"] - methods["vanilla"]["rstd"])


# Table 5's columns: Acc of vanilla, PurAttn, LAD, then LAD's ΔRStd.
SHOWN = ("vanilla", "attn-purified", "lad")
TABLE5_HEAD = "<th>Vanilla ↑</th><th>PurAttn ↑</th><th>LAD ↑</th><th>ΔRStd ↓</th></tr>"


def _table5_row(first: list[str], methods: dict[str, Any], delta: float | None) -> str:
    """A row of Table 5's layout: the `first` cells (already HTML), then SHOWN's Acc, then ΔRStd;
    a dash for what is not there."""
    accs = "".join(
        f"<td>{methods[m]['acc']:.1f}</td>" if "acc" in methods.get(m, {}) else "<td>–</td>"
        for m in SHOWN
    )
    heads = "".join(f"<td>{c}</td>" for c in first)
    return f"<tr>{heads}{accs}<td>{'–' if delta is None else f'{delta:+.1f}'}</td></tr>"


def table5_html(runs: list[dict[str, Any]]) -> str:
    """Table 5's layout, a row per run; a method a run did not score is a dash, and a note under
    the table names the run and the flag."""
    rows = ["<tr><th>run</th>" + TABLE5_HEAD]
    notes = []
    for run in runs:
        methods = run["metrics"]["methods"]
        if not any(m in methods for m in SHOWN):
            continue
        name = html.escape(Path(run["dir"]).name)
        rows.append(_table5_row([name], methods, _delta_rstd(methods, "lad")))
        absent = [m for m in SHOWN if m not in methods]
        if absent:
            notes.append(
                f"{name} has no {', '.join(absent)}: rerun it with lad eval --methods "
                f"{','.join(dict.fromkeys([*methods, *absent]))} (the stored records are rescored)"
            )
    if len(rows) == 1:
        return ""
    table = "<table>" + "".join(rows) + "</table>"
    return table + "".join(f"<p>{note}</p>" for note in notes)


def cells_html(run_dir: Path) -> str:
    """A mixed run's cells in Table 5's layout, one row per (task, N) cell, then the
    item-weighted group rows with their item counts."""
    run = RunDir(run_dir)
    if not run.is_mixed:
        return ""
    metrics = run.check().metrics()
    rows = ["<tr><th>cell</th><th>items</th>" + TABLE5_HEAD]

    def row(name: str, count: int, methods: dict[str, Any]) -> str:
        delta = methods.get("lad", {}).get("delta_rstd")
        return _table5_row([html.escape(name), str(count)], methods, delta)

    for name, cell in metrics["cells"].items():
        rows.append(row(name, cell["num_items"], cell["methods"]))
    groups = metrics["groups"]
    for kind, label in (("task", "task "), ("num_candidates", "N = ")):
        if len(groups[kind]) > 1:
            rows += [row(label + k, g["num_items"], g["methods"]) for k, g in groups[kind].items()]
    overall = groups["overall"]
    rows.append(row("overall (item-weighted)", overall["num_items"], overall["methods"]))
    return (
        f"<h2>Cells of {html.escape(str(run_dir))}</h2><p>Accuracy (%) per (task, N) cell, then "
        "per task, per N and overall, each the mean of its cells weighted by their items.</p>"
        "<table>" + "".join(rows) + "</table>"
    )


def table_html(metrics: dict[str, Any]) -> str:
    methods = metrics["methods"]
    gen = any("generated_tokens_per_item" in m for m in methods.values())
    fails = any("parse_failure" in m for m in methods.values())
    delta = "vanilla" in methods
    head = "<tr><th>method</th><th>Acc</th><th>RStd ↓</th>"
    head += ("<th>ΔRStd ↓</th>" if delta else "") + "<th>Cons.</th><th>passes/item</th>"
    head += ("<th>gen. tokens/item</th>" if gen else "") + ("<th>unparseable</th>" if fails else "")
    rows = [head + "</tr>"]
    for name, m in methods.items():
        passes = m.get("forward_passes_per_item")
        row = (
            f"<tr><td>{html.escape(name)}</td><td>{m['acc']:.1f} ± {m['acc_std']:.1f}</td>"
            f"<td>{m['rstd']:.1f}</td>"
        )
        row += f"<td>{_delta_rstd(methods, name):+.1f}</td>" if delta else ""
        row += f"<td>{m['cons']:.1f}</td><td>{'' if passes is None else f'{passes:g}'}</td>"
        if gen:
            tokens = m.get("generated_tokens_per_item")
            row += f"<td>{'' if tokens is None else f'{tokens:.1f}'}</td>"
        if fails:
            row += f"<td>{m['parse_failure']:.1f}%</td>" if "parse_failure" in m else "<td></td>"
        rows.append(row + "</tr>")
    return "<table>" + "".join(rows) + "</table>"


def audit_html(metrics: dict[str, Any]) -> str:
    """The position audit (lad.core.audit; docs/metrics.md): intervals, the position test, flip rate
    with its noise floor, CircularEval accuracy, errors due to order; empty for older files."""
    from lad.core.metrics import ci_text, position_verdict

    methods = metrics["methods"]
    boot = metrics.get("bootstrap")
    if boot is None or not all("ci" in m and "position_test" in m for m in methods.values()):
        return ""
    head = (
        "<tr><th>method</th><th>Acc CI</th><th>RStd CI</th><th>position</th><th>flip rate</th>"
        "<th>flip CI</th><th>floor</th><th>CircularEval</th><th>errors due to order</th></tr>"
    )
    rows = [head]
    for name, m in methods.items():
        flip, floor, err = m.get("flip_rate"), m.get("noise_floor"), m.get("errors_due_to_order")
        floor = None if floor is None else floor["flip_rate"]
        rows.append(
            f"<tr><td>{html.escape(name)}</td><td>{ci_text(m['ci']['acc'])}</td>"
            f"<td>{ci_text(m['ci']['rstd'])}</td>"
            f"<td>{html.escape(position_verdict(m['position_test']))}</td>"
            f"<td>{'–' if flip is None else f'{flip:.1f}'}</td>"
            f"<td>{ci_text(m['ci'].get('flip_rate'))}</td>"
            f"<td>{'–' if floor is None else f'{floor:.1f}'}</td>"
            f"<td>{m.get('circular_acc', float('nan')):.1f}</td>"
            f"<td>{'–' if err is None else f'{err:.1f}'}</td></tr>"
        )
    note = (
        f"<p>{boot['level']:g}% bootstrap intervals over items (B = {boot['B']}, seed "
        f"{boot['seed']}); position: permutation test of RStd (answer positions permuted within "
        "items); floor: the same orderings asked twice (– not measured); docs/metrics.md.</p>"
    )
    return "<h3>Position audit</h3>" + note + "<table>" + "".join(rows) + "</table>"
