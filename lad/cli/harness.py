"""`lad harness tasks|audit`: lad inside lmms-eval (docs/harness.md); thin over lad.harness."""

from __future__ import annotations

import argparse
from pathlib import Path

from lad.cli.flags import InputPath, OutputPath


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "harness",
        help="lad inside lmms-eval: task folder, audit of logged samples",
        description="lad inside lmms-eval: --model lad and circular task variants "
        "(docs/harness.md).",
        epilog="example:\n  python -m lmms_eval --model lad --model_args "
        "model=demo,calibration=calibration.json,output=out/lad --tasks muirbench_circular "
        "--include_path $(lad harness tasks) --output_path out --log_samples",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(dest="harness_command", required=True, metavar="COMMAND")
    p = commands.add_parser(
        "tasks",
        help="print the folder of lad's task YAMLs (for lmms-eval's --include_path)",
        description="Print the folder of lad's circular task variants, for --include_path.",
        epilog="example:\n  lad harness tasks",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.set_defaults(func=_tasks)
    p = commands.add_parser(
        "audit",
        help="lad's metrics of any model's circular-task samples: lad_audit.json",
        description="Read the samples lmms-eval logged (--log_samples) for lad's circular "
        "tasks under OUTPUT_PATH and write lad_audit.json and one folder per (task, N) with "
        "metrics.json (Acc, RStd, recall by position, Cons.; `lad report` reads them).",
        epilog="example:\n  lad harness audit out/  # out/ is lmms-eval's --output_path",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "output_path",
        type=InputPath,
        help="lmms-eval's --output_path of a run with --log_samples",
    )
    p.add_argument("--out", type=OutputPath, help="folder to write into (default: OUTPUT_PATH)")
    p.set_defaults(func=_audit, implied=_audit_file)


def _audit_file(args: argparse.Namespace) -> tuple[dict, dict]:
    """The audit summary written into --out (default: OUTPUT_PATH itself)."""
    from lad.run.rundir import AUDIT_FILE

    return {}, {"its audit file": Path(args.out or args.output_path) / AUDIT_FILE}


def _tasks(args: argparse.Namespace) -> int:
    from lad.harness import tasks_folder

    print(tasks_folder())
    return 0


def _audit(args: argparse.Namespace) -> int:
    from lad.core.metrics import format_panel, format_table
    from lad.errors import RunError
    from lad.harness.audit import write_rows_audit
    from lad.harness.samples import samples_rows
    from lad.io.files import read_json
    from lad.run.rundir import audit_folders

    output_path = Path(args.output_path)
    out = Path(args.out) if args.out else output_path
    path = write_rows_audit(samples_rows(output_path), out, f"lmms-eval samples in {output_path}")
    for folder in audit_folders(out):  # each (task, N): the table and the audit panel
        metrics = read_json(folder / "metrics.json", RunError)
        print(f"{folder.relative_to(out)}: {format_table(metrics)}\n{format_panel(metrics)}\n")
    print(f"audit: {path}")
    return 0
