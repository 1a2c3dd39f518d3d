"""The report's tables as HTML: each run's methods and audit panel, Table 5's layout across runs,
a mixed run's cells (lad.outputs.report); the page and table builders `lad report` and
`lad ablate` share."""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any

from lad.core.cells import table_rows
from lad.core.metrics import ci_text, number_text, position_verdict
from lad.run.rundir import RunDir

STYLE = (
    "body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;color:#222}"
    "table{border-collapse:collapse;margin:1em 0}"
    "td,th{padding:4px 10px;border-bottom:1px solid #ddd;"
    "text-align:right}th:first-child,td:first-child{text-align:left}img{max-width:100%}"
    "code{background:#f4f4f4;padding:1px 4px}"
)


def html_page(title: str, parts: list[str]) -> str:
    """A page of `parts` (HTML) under the heading `title`, in lad's style."""
    head = f"<!doctype html><meta charset=utf-8><title>{title}</title>\n<style>{STYLE}</style>"
    return "\n".join([f"{head}<h1>{title}</h1>", *parts]) + "\n"


def html_table(head: list[str], rows: list[list[str]]) -> str:
    """A table of cells that are HTML already (the caller escapes text), `head` its header."""
    lines = ["<tr>" + "".join(f"<th>{c}</th>" for c in head) + "</tr>"]
    lines += ["<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows]
    return "<table>" + "".join(lines) + "</table>"


def img_html(src: str, alt: str) -> str:
    return f'<p><img src="{src}" alt="{html.escape(alt)}"></p>'


def _delta_rstd(methods: dict[str, Any], name: str) -> float | None:
    """RStd of `name` minus vanilla's (metrics.json's delta_rstd; older files lack it)."""
    if name not in methods or "vanilla" not in methods:
        return None
    return float(methods[name]["rstd"] - methods["vanilla"]["rstd"])


# Table 5's columns: Acc of vanilla, PurAttn, LAD, then LAD's ΔRStd.
SHOWN = ("vanilla", "attn-purified", "lad")
TABLE5_HEAD = ["Vanilla ↑", "PurAttn ↑", "LAD ↑", "ΔRStd ↓"]


def _table5_cells(methods: dict[str, Any], delta: float | None) -> list[str]:
    """SHOWN's Acc, then ΔRStd, as Table 5 lays a row out; a dash for what is not there."""
    accs = [number_text(methods.get(m, {}).get("acc")) for m in SHOWN]
    return [*accs, number_text(delta, spec="+.1f")]


def table5_html(runs: list[dict[str, Any]]) -> str:
    """Table 5's layout, a row per run; a method a run did not score is a dash, and a note under
    the table names the run and the flag."""
    rows, notes = [], []
    for run in runs:
        methods = run["metrics"]["methods"]
        if not any(m in methods for m in SHOWN):
            continue
        name = html.escape(Path(run["dir"]).name)
        rows.append([name, *_table5_cells(methods, _delta_rstd(methods, "lad"))])
        absent = [m for m in SHOWN if m not in methods]
        if absent:
            notes.append(
                f"{name} has no {', '.join(absent)}: rerun it with lad eval --methods "
                f"{','.join(dict.fromkeys([*methods, *absent]))} (the stored records are rescored)"
            )
    if not rows:
        return ""
    return html_table(["run", *TABLE5_HEAD], rows) + "".join(f"<p>{note}</p>" for note in notes)


def cells_html(run_dir: Path) -> str:
    """A mixed run's cells in Table 5's layout, one row per (task, N) cell, then the
    item-weighted group rows with their item counts."""
    run = RunDir(run_dir)
    if not run.is_mixed:
        return ""
    rows = []
    for name, part in table_rows(run.check().metrics()):
        delta = part["methods"].get("lad", {}).get("delta_rstd")  # ΔRStd as metrics.json keeps it
        rows.append(
            [html.escape(name), str(part["num_items"]), *_table5_cells(part["methods"], delta)]
        )
    return (
        f"<h2>Cells of {html.escape(str(run_dir))}</h2><p>Accuracy (%) per (task, N) cell, then "
        "per task, per N and overall, each the mean of its cells weighted by their items.</p>"
        + html_table(["cell", "items", *TABLE5_HEAD], rows)
    )


def table_html(metrics: dict[str, Any]) -> str:
    methods = metrics["methods"]
    gen = any("generated_tokens_per_item" in m for m in methods.values())
    fails = any("parse_failure" in m for m in methods.values())
    delta = "vanilla" in methods
    head = ["method", "Acc", "RStd ↓", *(["ΔRStd ↓"] if delta else []), "Cons.", "passes/item"]
    head += (["gen. tokens/item"] if gen else []) + (["unparseable"] if fails else [])
    rows = []
    for name, m in methods.items():
        row = [html.escape(name), f"{m['acc']:.1f} ± {m['acc_std']:.1f}", f"{m['rstd']:.1f}"]
        row += [f"{_delta_rstd(methods, name):+.1f}"] if delta else []
        row += [f"{m['cons']:.1f}", number_text(m.get("forward_passes_per_item"), "", "g")]
        row += [number_text(m.get("generated_tokens_per_item"), "")] if gen else []
        if fails:
            row.append(f"{m['parse_failure']:.1f}%" if "parse_failure" in m else "")
        rows.append(row)
    return html_table(head, rows)


def audit_html(metrics: dict[str, Any]) -> str:
    """The position audit (lad.core.audit; docs/metrics.md): intervals, the position test, flip rate
    with its noise floor, CircularEval accuracy, errors due to order; empty for older files."""
    methods = metrics["methods"]
    boot = metrics.get("bootstrap")
    if boot is None or not all("ci" in m and "position_test" in m for m in methods.values()):
        return ""
    columns = {  # header: the cell of a method's metrics
        "Acc CI": lambda m: ci_text(m["ci"]["acc"]),
        "RStd CI": lambda m: ci_text(m["ci"]["rstd"]),
        "position": lambda m: html.escape(position_verdict(m["position_test"])),
        "flip rate": lambda m: number_text(m.get("flip_rate")),
        "flip CI": lambda m: ci_text(m["ci"].get("flip_rate")),
        "floor": lambda m: number_text((m.get("noise_floor") or {}).get("flip_rate")),
        "CircularEval": lambda m: f"{m.get('circular_acc', float('nan')):.1f}",
        "errors due to order": lambda m: number_text(m.get("errors_due_to_order")),
    }
    rows = [
        [html.escape(name), *(cell(m) for cell in columns.values())] for name, m in methods.items()
    ]
    note = (
        f"<p>{boot['level']:g}% bootstrap intervals over items (B = {boot['B']}, seed "
        f"{boot['seed']}); position: permutation test of RStd (answer positions permuted within "
        "items); floor: the same orderings asked twice (– not measured); docs/metrics.md.</p>"
    )
    return "<h3>Position audit</h3>" + note + html_table(["method", *columns], rows)
