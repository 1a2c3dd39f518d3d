"""`lad demo train`: retrain the embedded demo model (docs/demo-model.md)."""

from __future__ import annotations

import argparse

from lad.cli.flags import HelpFormat


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "demo",
        help="the embedded demo model: retrain it",
        description="lad's embedded demo model, a tiny Qwen2-VL trained on the shapes benchmark.",
        epilog="example:\n  lad demo train --out runs/demo-model\n  lad eval --model "
        "runs/demo-model",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(dest="demo_command", required=True, metavar="COMMAND")
    p = commands.add_parser(
        "train",
        help="train the demo model from scratch on CPU (seeded, reproducible)",
        description="Train the demo model from scratch on the shapes training split, on CPU "
        "(about 30 minutes on 2 cores; docs/demo-model.md).",
        epilog="example:\n  lad demo train --out runs/demo-model\n  lad eval --model "
        "runs/demo-model\nthe shipped weights came from (it replaces them):\n  lad demo train "
        "--out lad/demo/model --replace-shipped-model",
        formatter_class=HelpFormat,
    )
    from lad.demo.recipe import add_arguments

    add_arguments(p)
    p.set_defaults(func=_train)


def _train(args: argparse.Namespace) -> int:
    from lad.demo.train import run

    path = run(args)
    print(f"Wrote the demo model to {path}")
    return 0
