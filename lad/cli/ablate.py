"""`lad ablate`: the paper's analyses of finished runs (thin over lad.outputs.ablate)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from lad.cli.flags import (
    InputPath,
    OutputPath,
    add_lad_flags,
    add_settings,
    add_whole,
    command,
    number,
    options_from,
    read_as,
    resolved,
    whole,
)
from lad.errors import LadError


def _list(kind: str, parse: Callable[[str], Any], text: str) -> tuple:
    """Comma-separated values of `kind` ("int", "float", "str"), each read by `parse` (which
    may refuse a value out of range with an error naming its flag)."""
    listed = f"comma-separated {kind}s"
    values = read_as(lambda t: tuple(parse(x) for x in t.split(",") if x.strip()), text, listed)
    if not values:
        raise argparse.ArgumentTypeError(f"expected at least one value, got {text!r}")
    return values


# lad.outputs.ablate.ANALYSES' keys, in its order (a test keeps them equal): named here so
# that `lad --help` need not import lad.outputs.ablate and its plotting.
ANALYSES = ("fig5", "table3", "table4", "fig6a", "fig6b", "table7", "table8")


def _names(text: str) -> tuple[str, ...]:
    names = _list("str", str, text)
    unknown = [n for n in names if n not in ANALYSES]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown {unknown}; analyses: {','.join(ANALYSES)}")
    return names


def register(subparsers: argparse._SubParsersAction) -> None:
    p = command(subparsers, "ablate", _ablate)
    p.add_argument(
        "runs", type=InputPath, nargs="+", metavar="RUN", help="run directories made by lad eval"
    )
    p.add_argument(
        "--out", type=OutputPath, help="folder to write (default: RUN/ablate for one run)"
    )
    p.add_argument(
        "--analyses",
        "--only",
        dest="only",
        type=_names,
        metavar="A1,A2",
        help=f"comma-separated analyses of {','.join(ANALYSES)} (default: all)",
    )
    add_lad_flags(p)
    sweeps = {  # unstated: AblateOptions' defaults (their help states them)
        "--ks": ("int", "K of Table 4's rows (default: 1,2,4,8)"),
        "--sizes": ("int", "|D_cal| of Figure 6(a) (default: 1,5,10,20,50,100)"),
        "--taus": ("float", "τ of Figure 6(b); 'inf' is the limit (default: 0,1,3,5,7,9,inf)"),
    }
    for flag, (kind, help_text) in sweeps.items():  # whole numbers >= 1, or numbers >= 0
        parse = whole(1, flag) if kind == "int" else number(flag, 0.0)
        p.add_argument(flag, type=partial(_list, kind, parse), help=help_text)
    add_settings(
        p,
        "calibration_items",
        help="refit each run's calibration on a seeded random subset of this many of its "
        "calibration items, for all but Figure 6(a) (e.g. 5, the paper's |D_cal|, from a run "
        "made with --calibration-items 100; default: the run's calibration.json)",
    )
    add_whole(p, "--subsets", minimum=1, default=5, help="calibration subsets per |D_cal|")
    add_settings(p, "check_calibration")
    add_settings(p, "seed", help="seed of the calibration subsets")


def _ablate(args: argparse.Namespace) -> int:
    """the paper's ablations, sweeps, transfer and cost from finished runs

    From the stored records of finished lad eval runs (no model needed), write the paper's
    analyses: Figure 5 (accuracy against N, runs of several N), Table 3 (calibration
    transfer between runs), Table 4 (ablation), Figure 6(a) (|D_cal|, from a run made with
    --calibration-items 100), Figure 6(b) (τ), Table 7 (divergence by position), Table 8
    (cost, with perm-avg and sofa records). Each as Markdown, JSON and a PNG, with
    index.html; what the runs cannot support is listed with the flag that would make it
    possible.

    Example:
        lad eval --calibration-items 100 --out runs/n4
        lad eval -n 8 --out runs/n8
        lad ablate runs/n4 runs/n8 --out runs/ablate
    """
    from lad.core.methods import MethodOptions
    from lad.outputs.ablate import AblateOptions, ablate, load_runs, write_ablation
    from lad.outputs.ablate.report import ANALYSES, missing_text

    if args.out is None and len(args.runs) > 1:
        raise LadError("--out is needed with several runs")
    out = Path(args.out) if args.out else Path(args.runs[0]) / "ablate"
    variants = resolved(args)
    refit = variants.pop("obs_mean", None)  # each run's own Eq. 1 average unless stated
    method = options_from(MethodOptions, args, obs_mean=MethodOptions.obs_mean, **variants)
    options = options_from(AblateOptions, args, options=method, obs_mean=refit)
    runs = load_runs(args.runs, check_calibration=args.check_calibration)
    result = ablate(runs, options, args.only)
    if not result.tables:
        reasons = "".join(f"\n  {missing_text(m)}" for m in result.missing)
        raise LadError(f"none of the analyses can be made from these runs:{reasons}")
    page = write_ablation(result, out)
    for table in result.tables:
        print(f"{table.title}: {out / ANALYSES[table.key].stem}.md")
    if result.missing:
        print("\nNot possible with these runs:")
        for m in result.missing:
            print(f"  {missing_text(m)}")
    print(f"\npage: {page}")
    return 0
