"""`lad score` and `lad metrics`: methods and metrics over stored records, no model needed."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from lad.cli.flags import (
    InputPath,
    OutputPath,
    add_lad_flags,
    add_methods_flag,
    add_records_flag,
    add_settings,
    add_whole,
    command,
    methods_given,
    options_from,
    resolved,
)
from lad.core.audit import Bootstrap
from lad.core.calibrate import Calibration
from lad.core.cells import format_cells_table, measure_cells
from lad.core.methods import METHODS, MethodOptions
from lad.core.metrics import compute_metrics, format_panel, format_table
from lad.core.predictions import (
    predictions_by_method,
    read_predictions,
    write_predictions,
)
from lad.core.records import RecordSet, read_records
from lad.core.scoring import score_records
from lad.errors import LadError
from lad.io.files import check_output_file, write_text
from lad.run.rundir import cells_of_part, made_as


def register(subparsers: argparse._SubParsersAction) -> None:
    _register_score(subparsers)
    _register_metrics(subparsers)


def _register_score(subparsers: argparse._SubParsersAction) -> None:
    p = command(subparsers, "score", run_score)
    add_records_flag(p)
    source = p.add_mutually_exclusive_group()
    source.add_argument(
        "--calibration-records", type=InputPath, help="calibration records to fit (§4.2)"
    )
    source.add_argument("--calibration", type=InputPath, help="a calibration.json fitted earlier")
    add_methods_flag(p, None)
    add_lad_flags(p)
    add_settings(p, "layers")
    p.add_argument("--no-prior", action="store_true", help="do not divide by the attention prior")
    p.add_argument(
        "--perm-records", type=InputPath, help="each item under all N cyclic shifts (for perm-avg)"
    )
    p.add_argument(
        "--blank-records",
        type=InputPath,
        help="each record's prompt with its candidates blanked (for blank; blank_records.jsonl)",
    )
    labels = "label scheme of the records (parses replies of instruction, cot, self-consistency)"
    add_settings(p, "labels", help=labels)
    p.add_argument(
        "--allow-partial", action="store_true", help="accept calibration items missing shifts"
    )
    add_settings(p, "check_calibration")
    p.add_argument(
        "--save-calibration", type=OutputPath, help="also write the fitted calibration.json here"
    )
    p.add_argument(
        "--out", type=OutputPath, required=True, help="predictions file to write (.jsonl)"
    )


def run_score(args: argparse.Namespace) -> int:
    """score stored records with methods, write predictions

    Score stored records with one or more methods and write predictions.jsonl.

    Example:
        lad score --records runs/default/records.jsonl --calibration-records \\
            runs/default/calibration.jsonl --methods vanilla,lad --out predictions.jsonl
    """
    values = resolved(args)
    check_output_file(args.out)  # an output that is an input: refused by lad.cli.main
    if args.save_calibration:
        check_output_file(args.save_calibration, "--save-calibration")
    records = run_records(args.records, "score")
    calibration, where = None, args.calibration or args.calibration_records
    if args.calibration:
        calibration = Calibration.load(args.calibration)
        values.setdefault("obs_mean", calibration.obs_mean)  # unless stated: the file's own
    elif args.calibration_records:
        fitted_on = read_records(args.calibration_records)
        calibration = Calibration(obs_mean=values.get("obs_mean", "prob")).fit(
            fitted_on,
            made_as(args.calibration_records, fitted_on),
            allow_partial=args.allow_partial,
        )
    if calibration is not None:  # what the records' run.json says they were made as, if any
        made = made_as(args.records, records)
        calibration.check_compatible(records, made, strict=args.check_calibration, where=where)
    options = options_from(MethodOptions, args, use_prior=not args.no_prior, **values)
    if args.save_calibration:
        if calibration is None:
            raise LadError("--save-calibration needs --calibration-records to fit one")
        calibration.save(args.save_calibration)
    methods = list(methods_given(args.methods))
    stages = {METHODS[m].stage: records for m in methods}  # replies are in these records
    for stage, path in (("perm-avg", args.perm_records), ("blank", args.blank_records)):
        if path:  # the records of the extra passes (lad.core.methods.Method.extra)
            stages[stage] = read_records(path)
    scored = score_records(records, methods, calibration, options, stages=stages, bootstrap=None)
    write_predictions(args.out, scored.predictions)
    print(format_table(scored.metrics))
    cells = cells_of_part(args.records)
    if cells:  # a part of a mixed run: each of its cells' numbers, and the groups
        print("\n" + format_cells_table(measure_cells(cells, records, scored.chosen)))
    count = f"{len(methods)} method{'s' if len(methods) > 1 else ''}"
    print(f"written: {args.out} ({len(records)} records × {count})")
    return 0


def run_records(records: str, doing: str) -> RecordSet:
    """The records --records names, refused when it holds none. Those of a run directory a lad
    eval is still writing are a part of the run: said so."""
    from lad.run.lock import running_holder

    found = read_records(records)
    if not len(found):
        raise LadError(f"{records}: holds no records; nothing to {doing}")
    holder = running_holder(Path(records).parent)
    if holder is not None:
        print(
            f"Warning: {Path(records).parent} is being written by a running lad eval ({holder}); "
            f"these are the {len(found)} records of {records} written so far, not the finished run",
            file=sys.stderr,
        )
    return found


def _register_metrics(subparsers: argparse._SubParsersAction) -> None:
    p = command(subparsers, "metrics", run_metrics)
    add_records_flag(p)
    p.add_argument(
        "--predictions", type=InputPath, required=True, help="predictions.jsonl from lad score"
    )
    repeats = {  # the noise floor's flags
        "--repeat-predictions": "predictions of the same records asked again (e.g. records made "
        "with another --batch-size, scored by lad score): their disagreement is the noise floor",
        "--repeat-records": "the records --repeat-predictions scored (default: --records)",
    }
    for flag, help_text in repeats.items():
        p.add_argument(flag, type=InputPath, help=help_text)
    add_whole(
        p,
        "--bootstrap",
        minimum=1,
        default=Bootstrap().resamples,
        help="bootstrap resamples B of the intervals, and draws of the position test",
    )
    add_whole(p, "--bootstrap-seed", minimum=0, default=0, help="their seed")
    p.add_argument("--json", action="store_true", help="print metrics.json instead of a table")
    p.add_argument("--out", type=OutputPath, help="also write metrics.json here")


def run_metrics(args: argparse.Namespace) -> int:
    """Acc, RStd, Cons. of predictions, and the position audit

    Acc ± std, RStd, Cons. (§5.2) of predictions against their records, and the position
    audit below them: bootstrap intervals, a permutation test of position dependence, flip
    rate with its noise floor, CircularEval accuracy, errors due to order (docs/metrics.md).

    Example:
        lad metrics --records runs/default/records.jsonl \\
            --predictions runs/default/predictions.jsonl --json
    """
    boot = Bootstrap(resamples=args.bootstrap, seed=args.bootstrap_seed)  # its bound first
    if args.out:
        check_output_file(args.out)
    records = run_records(args.records, "measure")
    predictions = read_predictions(args.predictions)
    if not predictions:
        raise LadError(f"{args.predictions}: holds no predictions; nothing to measure")
    chosen = predictions_by_method(records, predictions, args.predictions)
    if args.repeat_records and not args.repeat_predictions:
        raise LadError("--repeat-records names the records of --repeat-predictions; give both")
    repeats = _repeats(args, records) if args.repeat_predictions else None
    metrics = compute_metrics(records, chosen, bootstrap=boot, repeats=repeats)
    cells = cells_of_part(args.records)
    if cells:  # a part of a mixed run: its cells' metrics too
        metrics.update(measure_cells(cells, records, chosen))
    text = json.dumps(metrics, indent=2)
    if args.out:
        write_text(args.out, text + "\n")
    print(text if args.json else f"{format_table(metrics)}\n{format_panel(metrics)}")
    if cells and not args.json:
        print("\n" + format_cells_table(metrics))
    return 0


def _repeats(args: argparse.Namespace, records: RecordSet) -> dict:
    """The chosen positions of the same (item, ordering) asked again, by method."""
    again = read_records(args.repeat_records) if args.repeat_records else records
    if again.keys() != records.keys() or not np.array_equal(again.order, records.order):
        raise LadError(
            f"{args.repeat_records}: its (item, ordering, order) differ from {args.records}; "
            "the noise floor compares the same orderings asked twice"
        )
    predictions = read_predictions(args.repeat_predictions)
    if not predictions:
        raise LadError(f"{args.repeat_predictions}: holds no predictions; nothing to compare")
    return predictions_by_method(again, predictions, args.repeat_predictions)
