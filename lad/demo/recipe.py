"""The demo model's recipe as data (stages, TrainConfig) and its checks, apart from lad.demo.train
so that `lad demo train --help` loads no torch. docs/demo-model.md explains it."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from lad.core.methods import flag
from lad.errors import LadError

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

    def check(self) -> None:
        if not 2 <= self.max_candidates <= 9:
            raise LadError(
                f"stage {self.name}: at most 2..9 images per prompt, got {self.max_candidates}"
            )
        if not 0 < self.position_decay <= 1:
            raise LadError(f"--position-decay must be in (0, 1]. Got {self.position_decay}.")
        if not 0 <= self.keep_label <= 1:
            raise LadError(f"--keep-label must be in [0, 1]. Got {self.keep_label}.")
        if self.drift not in DRIFTS:
            raise LadError(f"--drift must be one of {', '.join(DRIFTS)}. Got {self.drift!r}.")
        if self.train not in TRAINED:
            raise LadError(f"stage {self.name}: train must be one of {', '.join(TRAINED)}")
        if self.steps < 0:
            raise LadError(f"--stage-steps must be >= 0. Got {self.steps} for {self.name}.")


STAGES = (
    Stage("pairs", 2500, 2, decay=False),
    Stage("matching", 3500, 4),
    Stage("bias", 500, 4, keep_label=0.6, drift="previous", train="head", match_only=True),
)


@dataclass(frozen=True)
class TrainConfig:
    """Everything that defines the demo model. Same config and seed → same weights (on CPU). A
    field with metadata is a flag of `lad demo train` (lad.cli.flags.add_settings)."""

    seed: int = flag(0, "seed of data, init and batches", type=int)
    stages: tuple[Stage, ...] = STAGES
    batch_size: int = flag(16, "prompts per step", type=int)
    lr: float = flag(1e-3, "peak learning rate", type=float)
    warmup: int = 100
    weight_decay: float = 0.01
    train_items: int = flag(2000, "training items drawn per setting", type=int)  # 4 candidates each
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
    threads: int = flag(1, "CPU threads", type=int)
    monitor_every: int = 250
    monitor_items: int = 100
    extra: dict[str, Any] = field(default_factory=dict)

    def check(self) -> None:
        """Every value in range, before any work; a message names the flag that sets it."""
        if not 0 <= self.seed < 2**32:
            raise LadError(f"--seed must be in 0..{2**32 - 1}. Got {self.seed}.")
        if not (math.isfinite(self.lr) and self.lr > 0):
            raise LadError(f"--lr must be a positive finite number. Got {self.lr}.")
        for s in self.stages:
            s.check()
        shares = (self.refer_share, self.find_share)
        if min(shares) < 0 or sum(shares) >= 1:
            raise LadError(
                "--refer-share and --find-share must be >= 0 with a sum below 1. "
                f"Got {self.refer_share} and {self.find_share}."
            )
        if not 1 <= self.grounding_layer <= self.text_layers:
            raise LadError(f"grounding_layer must be in 1..{self.text_layers}")
        for name in ("batch_size", "train_items", "threads"):
            if getattr(self, name) < 1:
                raise LadError(f"--{name.replace('_', '-')} must be at least 1.")
