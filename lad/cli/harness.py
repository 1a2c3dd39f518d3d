"""`lad harness tasks|audit|lm-eval|lm-eval-circular|lm-eval-files`: lad inside lmms-eval and
lm-evaluation-harness (docs/harness.md); thin over lad.harness."""

from __future__ import annotations

import argparse
from pathlib import Path

from lad.cli.flags import InputPath, OutputPath, command


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "harness",
        help="lad inside lmms-eval and lm-eval: tasks, audits, --model lad",
        description="lad inside lmms-eval and lm-evaluation-harness: --model lad and circular "
        "task variants (docs/harness.md).",
        epilog="example:\n  python -m lmms_eval --model lad --model_args "
        "model=demo,calibration=calibration.json,output=out/lad --tasks muirbench_circular "
        "--include_path $(lad harness tasks) --output_path out --log_samples",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(dest="harness_command", required=True, metavar="COMMAND")
    command(commands, "tasks", _tasks)
    p = command(commands, "audit", _audit)
    p.add_argument(
        "output_path",
        type=InputPath,
        help="the harness's --output_path of a run with --log_samples, or Inspect's log folder",
    )
    p.add_argument("--out", type=OutputPath, help="folder to write into (default: OUTPUT_PATH)")
    p.set_defaults(implied=_audit_file)
    p = command(commands, "lm-eval", _lm_eval)
    p.set_defaults(passthrough=[])  # every other argument is lm-eval's
    p = command(commands, "lm-eval-circular", _lm_eval_circular)
    p.add_argument("task_yaml", type=InputPath, help="the task's YAML file")
    p.add_argument("--out", type=OutputPath, required=True, help="folder to write into")
    command(commands, "lm-eval-files", _lm_eval_files)


def _lm_eval(args: argparse.Namespace) -> int:
    """lm-evaluation-harness's command line with --model lad registered

    Run lm-evaluation-harness (lm-eval 0.4.x, pip install -e '.[lm-eval]') with --model lad
    registered; every argument is lm-eval's (docs/harness.md).

    Example:
        lad harness lm-eval --model lad --model_args \
            pretrained=Qwen/Qwen3-0.6B,calibration_items=mmlu.dev.jsonl \
            --tasks mmlu_abstract_algebra --device cuda --output_path out
    """
    from lad.harness import harness_module

    return harness_module("lad.harness.lm_eval", "lm-eval").main(list(args.passthrough))


def _lm_eval_circular(args: argparse.Namespace) -> int:
    """write the circular variant of an lm-eval multiple-choice task

    Write TASK_lad_circular's YAML (each question asked N times, its choices shifted
    cyclically, lad's metrics beside acc) and its lad_circular.py into --out, for lm-eval's
    --include_path. The task's documents need MMLU's fields (question, choices, answer).

    Example:
        lad harness lm-eval-circular tasks/mcq.yaml --out circular/
    """
    from lad.harness.lm_eval_circular import write_variant

    print(write_variant(args.task_yaml, args.out))
    return 0


def _lm_eval_files(args: argparse.Namespace) -> int:
    """print the folder of lad's plain chat template and MMLU prompt template

    Print the folder holding plain.jinja (the prompt as lm-eval writes it) and mmlu.txt
    (lm-eval's MMLU prompt as a lad prompt template): given to lad calibrate as
    --chat-template and --prompt-template they make calibrations --model lad accepts.

    Example:
        lad harness lm-eval-files
    """
    from lad.harness.text_scorer import FILES

    print(FILES)
    return 0


def _audit_file(args: argparse.Namespace) -> dict:
    """The audit summary written into --out (default: OUTPUT_PATH itself)."""
    from lad.run.audits import AUDIT_FILE

    return {"its audit file": Path(args.out or args.output_path) / AUDIT_FILE}


def _tasks(args: argparse.Namespace) -> int:
    """print the folder of lad's task YAMLs (for lmms-eval's --include_path)

    Print the folder of lad's circular variants of lmms-eval's picture-option tasks, for
    --include_path.

    Example:
        lad harness tasks
    """
    from lad.harness import tasks_folder

    print(tasks_folder())
    return 0


def _audit(args: argparse.Namespace) -> int:
    """lad's metrics of any model's circular-task samples: lad_audit.json

    Read the samples lmms-eval or lm-eval logged (--log_samples) for lad's circular tasks
    under OUTPUT_PATH, or Inspect's logs of tasks scored by lad/position, and write
    lad_audit.json and one folder per (task, N) with metrics.json (Acc, RStd, recall by
    position, Cons.; `lad report` reads them).

    Example:
        lad harness audit out/
    """
    from lad.core.metrics import format_panel, format_table
    from lad.harness.audit import write_rows_audit
    from lad.harness.samples import samples_rows
    from lad.run.audits import audit_folders
    from lad.run.rundir import RunDir

    output_path = Path(args.output_path)
    out = Path(args.out) if args.out else output_path
    path = write_rows_audit(samples_rows(output_path), out, f"harness samples in {output_path}")
    for folder in audit_folders(out):  # each (task, N): the table and the audit panel
        metrics = RunDir(folder).metrics()
        print(f"{folder.relative_to(out)}: {format_table(metrics)}\n{format_panel(metrics)}\n")
    print(f"audit: {path}")
    return 0
