"""The demo model's recipe as data (stages, TrainConfig) and its command-line flags, apart from
lad.demo.train so that `lad demo train --help` loads no torch. docs/demo-model.md explains it."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from lad.errors import LadError
from lad.io.files import InputPath, OutputPath

DRIFTS = ("first", "previous")
TRAINED = ("all", "head")


@dataclass(frozen=True)
class Stage:
    """A stretch of training: its steps, the most images per prompt, the answer-position skew."""

    name: str
    steps: int
    max_candidates: int
    position_decay: float = 1.0  # answer at position p with weight decay**p (1 = uniform)
    match_only: bool = False  # only caption-matching examples (the late, skewed stage)
    lr_scale: float = 1.0  # the stage's peak learning rate, as a multiple of --lr
    keep_label: float = 1.0  # an answer at 0-based position p keeps its label w.p. this**p
    drift: str = "first"  # where a drifted label points: "first" picture or the "previous" one
    train: str = "all"  # "all" parameters, or only the "head": the last layer's MLP and LM head
    decay: bool = True  # cosine decay to 10 % over the stage (else constant after warm-up)


STAGES = (
    Stage("pairs", 2500, 2, decay=False),
    Stage("matching", 3500, 4),
    Stage("bias", 500, 4, keep_label=0.6, drift="previous", train="head", match_only=True),
)


@dataclass(frozen=True)
class TrainConfig:
    """Everything that defines the demo model. Same config and seed → same weights (on CPU)."""

    seed: int = 0
    stages: tuple[Stage, ...] = STAGES
    batch_size: int = 16
    lr: float = 1e-3
    warmup: int = 100
    weight_decay: float = 0.01
    train_items: int = 2000  # per setting, each with 4 candidates
    settings: tuple[str, ...] = ("random",)
    refer_share: float = 0.2
    find_share: float = 0.2  # the rest is caption matching
    align_weight: float = 1.0
    grounding_weight: float = 1.0
    grounding_layer: int = 2
    image_size: int = 64
    max_shapes: int = 2
    text_layers: int = 4
    hidden: int = 128
    heads: int = 2
    kv_heads: int = 1
    intermediate: int = 256
    vision_layers: int = 2
    vision_hidden: int = 64
    vision_heads: int = 2
    threads: int = 1
    monitor_every: int = 250
    monitor_items: int = 100
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def steps(self) -> int:
        return sum(s.steps for s in self.stages)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Flags shared by `python -m lad.demo.train` and `lad demo train`."""
    d = TrainConfig()
    p.add_argument(
        "--out", type=OutputPath, required=True, help="folder to write the model into (replaced)"
    )
    p.add_argument("--seed", type=int, default=d.seed, help="seed of data, init and batches")
    p.add_argument("--stage-steps", default=",".join(str(s.steps) for s in d.stages),
                   help="steps of the stages " + ", ".join(s.name for s in d.stages)
                   + " (0 skips one)")  # fmt: skip
    p.add_argument("--batch-size", type=int, default=d.batch_size, help="prompts per step")
    p.add_argument("--lr", type=float, default=d.lr, help="peak learning rate")
    p.add_argument("--train-items", type=int, default=d.train_items,
                   help="training items drawn per setting")  # fmt: skip
    p.add_argument("--position-decay", type=float, default=d.stages[-1].position_decay,
                   help="bias stage: answer at position p with weight decay**p")  # fmt: skip
    p.add_argument("--keep-label", type=float, default=d.stages[-1].keep_label,
                   help="bias stage: an answer at 0-based position p keeps its label w.p. "
                   "this**p, else drifts (1 = always its own)")  # fmt: skip
    p.add_argument("--drift", choices=DRIFTS, default=d.stages[-1].drift,
                   help="bias stage: the picture a drifted label names")  # fmt: skip
    p.add_argument("--threads", type=int, default=d.threads, help="CPU threads")
    p.add_argument("--init", type=InputPath, default=None,
                   help="start from this checkpoint, not a fresh model")  # fmt: skip
    p.add_argument(
        "--figure", type=OutputPath, default=None, help="also draw the training curve into this PNG"
    )
    p.add_argument("--replace-shipped-model", action="store_true",
                   help="allow --out to be the demo model shipped inside lad (lad/demo/model), "
                   "whose weights it then replaces")  # fmt: skip


def config_from_args(args: argparse.Namespace) -> TrainConfig:
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
    stages[-1] = replace(
        stages[-1],
        position_decay=args.position_decay,
        keep_label=args.keep_label,
        drift=args.drift,
    )
    return TrainConfig(
        seed=args.seed,
        stages=tuple(stages),
        batch_size=args.batch_size,
        lr=args.lr,
        train_items=args.train_items,
        threads=args.threads,
    )


EXAMPLE = "python -m lad.demo.train --out runs/demo-model"
SHIPPED_EXAMPLE = "python -m lad.demo.train --out lad/demo/model --replace-shipped-model"


def check_not_shipped(out: str | Path, replace_shipped: bool) -> None:
    """Retraining into the package's own model folder replaces the weights `lad eval` uses by
    default; only on purpose (--replace-shipped-model)."""
    from lad.demo import MODEL_DIR

    target = Path(out).resolve()
    if replace_shipped or not (target == MODEL_DIR or MODEL_DIR in target.parents):
        return
    raise LadError(
        f"--out {out} is the demo model shipped with lad ({MODEL_DIR}), which lad eval uses by "
        "default; training would replace its weights. Write elsewhere (e.g. --out "
        "runs/demo-model, then lad eval --model runs/demo-model), or pass "
        "--replace-shipped-model to replace them on purpose"
    )
