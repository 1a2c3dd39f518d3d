"""`lad ablate`: the paper's analyses of finished runs (thin over lad.ablate)."""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from lad.cli.flags import (
    InputPath,
    OutputPath,
    add_calibration_check_flag,
    add_lad_flags,
    resolved,
)
from lad.errors import LadError


def _list(kind: type, text: str) -> tuple:
    try:
        values = tuple(kind(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated {kind.__name__}s, got {text!r}"
        ) from None
    if not values:
        raise argparse.ArgumentTypeError(f"expected at least one value, got {text!r}")
    return values


def _names(text: str) -> tuple[str, ...]:
    from lad.ablate.runs import ANALYSIS_FILES

    names = _list(str, text)
    unknown = [n for n in names if n not in ANALYSIS_FILES]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown {unknown}; analyses: {','.join(ANALYSIS_FILES)}")
    return names


def register(subparsers: argparse._SubParsersAction) -> None:
    from lad.ablate.runs import ANALYSIS_FILES

    p = subparsers.add_parser(
        "ablate",
        help="the paper's ablations, sweeps, transfer and cost from finished runs",
        description="From the stored records of finished lad eval runs (no model needed), write "
        "the paper's analyses: Figure 5 (accuracy against N, runs of several N), Table 3 "
        "(calibration transfer between runs), Table 4 (ablation), Figure 6(a) (|D_cal|, from a "
        "run made with --calibration-items 100), Figure 6(b) (τ), Table 7 (divergence by "
        "position), Table 8 (cost, with perm-avg and sofa records). Each as Markdown, JSON and "
        "a PNG, with index.html; what the runs cannot support is listed with the flag that "
        "would make it possible.",
        epilog="example:\n  lad eval --calibration-items 100 --out runs/n4\n"
        "  lad eval -n 8 --out runs/n8\n  lad ablate runs/n4 runs/n8 --out runs/ablate",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "runs", type=InputPath, nargs="+", metavar="RUN", help="run directories made by lad eval"
    )
    p.add_argument(
        "--out", type=OutputPath, help="folder to write (default: RUN/ablate for one run)"
    )
    p.add_argument(
        "--only",
        type=_names,
        help=f"comma-separated analyses of {','.join(ANALYSIS_FILES)} (default: all)",
    )
    add_lad_flags(p)
    p.add_argument(
        "--ks", type=lambda t: _list(int, t), default=(1, 2, 4, 8), help="K of Table 4's rows"
    )
    p.add_argument(
        "--sizes",
        type=lambda t: _list(int, t),
        default=(1, 5, 10, 20, 50, 100),
        help="|D_cal| of Figure 6(a) (default 1,5,10,20,50,100)",
    )
    p.add_argument(
        "--taus",
        type=lambda t: _list(float, t),
        default=(0.0, 1.0, 3.0, 5.0, 7.0, 9.0, math.inf),
        help="τ of Figure 6(b); 'inf' is the limit (default 0,1,3,5,7,9,inf)",
    )
    p.add_argument(
        "--calibration-items",
        type=int,
        help="refit each run's calibration on a seeded random subset of this many of its "
        "calibration items, for all but Figure 6(a) (e.g. 5, the paper's |D_cal|, from a run "
        "made with --calibration-items 100; default: the run's calibration.json)",
    )
    p.add_argument("--subsets", type=int, default=5, help="calibration subsets per |D_cal|")
    add_calibration_check_flag(p)
    p.add_argument("--seed", type=int, default=0, help="seed of the calibration subsets")
    p.set_defaults(func=_ablate)


def _ablate(args: argparse.Namespace) -> int:
    from lad.ablate import AblateOptions, ablate, load_runs, write_ablation
    from lad.ablate.report import FILES, missing_text

    if args.out is None and len(args.runs) > 1:
        raise LadError("--out is needed with several runs")
    out = Path(args.out) if args.out else Path(args.runs[0]) / "ablate"
    options = AblateOptions(
        top_k=args.top_k,
        tau=args.tau,
        ks=args.ks,
        sizes=args.sizes,
        taus=args.taus,
        subsets=args.subsets,
        seed=args.seed,
        calibration_items=args.calibration_items,
        **resolved(args, ("obs_mean", "mixture", "attn_mean", "layer_range")),
    )
    runs = load_runs(args.runs, check_calibration=args.calibration_check)
    result = ablate(runs, options, args.only)
    if not result.tables:
        reasons = "".join(f"\n  {missing_text(m)}" for m in result.missing)
        raise LadError(f"none of the analyses can be made from these runs:{reasons}")
    page = write_ablation(result, out)
    for table in result.tables:
        print(f"{table.title}: {out / FILES[table.key]}.md")
    if result.missing:
        print("\nNot possible with these runs:")
        for m in result.missing:
            print(f"  {missing_text(m)}")
    print(f"\npage: {page}")
    return 0
