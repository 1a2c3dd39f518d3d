"""`lad demo train`: retrain the embedded demo model (docs/demo-model.md); thin over lad.demo."""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

from lad.cli.flags import InputPath, OutputPath, add_settings, command, options_from
from lad.demo.recipe import DRIFTS, TrainConfig
from lad.errors import LadError
from lad.io.files import check_output_file

_EXAMPLES = ("lad demo train --out runs/demo-model", "lad eval --model runs/demo-model")
_SHIPPED = (
    "\nthe shipped weights came from (it replaces them):\n"
    "  lad demo train --out lad/demo/model --replace-shipped-model"
)


def register(subparsers: argparse._SubParsersAction) -> None:
    about = "lad's embedded demo model, a tiny Qwen2-VL trained on the shapes benchmark."
    parser = command(subparsers, "demo", "the embedded demo model: retrain it", about, *_EXAMPLES)
    commands = parser.add_subparsers(dest="demo_command", required=True, metavar="COMMAND")
    short = "train the demo model from scratch on CPU (seeded, reproducible)"
    train_about = (
        "Train the demo model from scratch on the shapes training split, on CPU (about 30 "
        "minutes on 2 cores; docs/demo-model.md)."
    )
    p = command(commands, "train", short, train_about, *_EXAMPLES)
    p.epilog += _SHIPPED
    _add_train_flags(p)
    p.set_defaults(func=_train)


def _add_train_flags(p: argparse.ArgumentParser) -> None:
    d = TrainConfig()
    p.add_argument(
        "--out", type=OutputPath, required=True, help="folder to write the model into (replaced)"
    )
    add_settings(p, "seed", of=TrainConfig)
    p.add_argument("--stage-steps", default=",".join(str(s.steps) for s in d.stages),
                   help="steps of the stages " + ", ".join(s.name for s in d.stages)
                   + " (0 skips one)")  # fmt: skip
    add_settings(p, "batch_size", "lr", "train_items", of=TrainConfig)
    p.add_argument("--position-decay", type=float, default=d.stages[-1].position_decay,
                   help="bias stage: answer at position p with weight decay**p")  # fmt: skip
    p.add_argument("--keep-label", type=float, default=d.stages[-1].keep_label,
                   help="bias stage: an answer at 0-based position p keeps its label w.p. "
                   "this**p, else drifts (1 = always its own)")  # fmt: skip
    p.add_argument("--drift", choices=DRIFTS, default=d.stages[-1].drift,
                   help="bias stage: the picture a drifted label names")  # fmt: skip
    add_settings(p, "threads", of=TrainConfig)
    p.add_argument("--init", type=InputPath, default=None,
                   help="start from this checkpoint, not a fresh model")  # fmt: skip
    p.add_argument(
        "--figure", type=OutputPath, default=None, help="also draw the training curve into this PNG"
    )
    p.add_argument("--replace-shipped-model", action="store_true",
                   help="allow --out to be the demo model shipped inside lad (lad/demo/model), "
                   "whose weights it then replaces")  # fmt: skip


def _config(args: argparse.Namespace) -> TrainConfig:
    """The TrainConfig the flags give: the default recipe, its stages' steps and bias stage set."""
    d = TrainConfig()
    try:
        steps = [int(x) for x in args.stage_steps.split(",")]
    except ValueError:
        steps = []
    if len(steps) != len(d.stages):
        raise LadError(
            f"--stage-steps must be {len(d.stages)} integers separated by commas "
            f"({', '.join(s.name for s in d.stages)}). Got {args.stage_steps!r}."
        )
    stages = [replace(s, steps=k) for s, k in zip(d.stages, steps, strict=True)]
    bias = {"position_decay": args.position_decay, "keep_label": args.keep_label}
    stages[-1] = replace(stages[-1], **bias, drift=args.drift)
    # the flags named as its fields: --seed, --batch-size, --lr, --train-items, --threads
    return options_from(TrainConfig, args, stages=tuple(stages))


def _train(args: argparse.Namespace) -> int:
    config = _config(args)
    config.check()  # every flag, before torch loads
    if args.figure:  # now, not after half an hour of training (--figure as --init: lad.cli.main)
        if Path(args.figure).suffix.lower() != ".png":
            raise LadError(f"--figure {args.figure}: give a .png path")
        check_output_file(args.figure, "--figure")
    from lad.demo.train import plot_history, train

    path = train(config, args.out, init=args.init, replace_shipped_model=args.replace_shipped_model)
    if args.figure:
        plot_history(path / "lad_demo_training.json", args.figure)
    print(f"Wrote the demo model to {path}")
    return 0
