"""`lad export RUN --format facet-probe --out trials.jsonl`: a finished run's choices for another
audit tool, thin over lad.outputs.export."""

from __future__ import annotations

import argparse

from lad.cli.flags import InputPath, OutputPath, command


def register(subparsers: argparse._SubParsersAction) -> None:
    p = command(subparsers, "export", _export)
    p.add_argument("run", type=InputPath, help="a run directory or a harness audit's folder")
    p.add_argument("--format", choices=["facet-probe"], default="facet-probe", help="the format")
    p.add_argument(
        "--facet",
        choices=["image_set_order", "option_order"],
        help="Facet-Probe's facet (default: image_set_order for pictures, option_order for text "
        "options, as the run's items are)",
    )
    p.add_argument(
        "--dataset", help="the trials' dataset (default: each item's task, else the data)"
    )
    p.add_argument("--model-name", help="the model's name in the trials (default: the run's)")
    p.add_argument("--out", type=OutputPath, required=True, help="trials file to write (.jsonl)")


def _export(args: argparse.Namespace) -> int:
    """write a finished run's choices in another audit tool's format (Facet-Probe)

    Write one Facet-Probe TrialRecord per (method, item, ordering) of a finished run (a lad eval
    run, a mixed run, or a harness audit's folder) as JSON Lines, which facet-probe audit-jsonl,
    irt-export and irt-fit read. Each method is a model of its own ('<model>:<method>');
    answers are the chosen candidate's index in the item's own order, so a flip is a change of
    content (docs/metrics.md, 'Facet-Probe').

    Example:
        lad export runs/default --format facet-probe --out trials.jsonl
        lad export runs/muir --facet image_set_order --dataset muirbench --out muir.jsonl
    """
    from lad.io.files import check_output_file
    from lad.outputs.export import write_facet_probe

    out = check_output_file(args.out)
    count = write_facet_probe(
        args.run, out, facet=args.facet, dataset=args.dataset, model=args.model_name
    )
    print(f"wrote {count} Facet-Probe trials to {out}")
    return 0
