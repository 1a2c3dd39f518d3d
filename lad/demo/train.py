"""Train lad's embedded demo model: a tiny Qwen2-VL taught to match a caption to one of N shapes.

    python -m lad.demo.train --out lad/demo/model        (or: lad demo train --out ...)

Recipe (docs/demo-model.md): a random-init Qwen2-VL (lad.tiny) is fine-tuned as a causal LM on
the vanilla multi-image caption-matching prompt, built exactly as the backend builds it, with the
answer label and end-of-turn token as the target. Its position bias comes from the training data
alone, as in a real MLLM whose instruction data is uneven: it only ever sees 2 to 4 images, and
the answer sits at the first position more often than at later ones (weights decay by
`position_decay` per position). Nothing is edited after training. CPU only, seeded.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from lad.errors import LadError

ARCH = "qwen2_vl"
LABELS = "digits"


@dataclass(frozen=True)
class TrainConfig:
    """Everything that defines the demo model. Same config and seed → same weights (on CPU)."""

    seed: int = 0
    steps: int = 5000
    batch_size: int = 16
    lr: float = 2e-3
    warmup: int = 100
    weight_decay: float = 0.01
    train_items: int = 2000  # per setting (random and adversarial), each with 4 candidates
    min_candidates: int = 2
    max_candidates: int = 4
    position_decay: float = 0.6  # answer-position weight ∝ decay**p: the data's primacy
    caption_share: float = 0.2  # share of single-image captioning examples
    refer_share: float = 0.3  # share of "Describe picture k." examples over 2..4 images
    image_size: int = 64
    max_shapes: int = 2
    text_layers: int = 4
    hidden: int = 128
    heads: int = 4
    kv_heads: int = 2
    intermediate: int = 256
    vision_layers: int = 2
    vision_hidden: int = 64
    vision_heads: int = 2
    threads: int = 1
    settings: tuple[str, ...] = ("random", "adversarial")
    extra: dict[str, Any] = field(default_factory=dict)

    def position_weights(self, num_candidates: int) -> list[float]:
        w = [self.position_decay**p for p in range(num_candidates)]
        return [x / sum(w) for x in w]


def _check(config: TrainConfig) -> None:
    if not 2 <= config.min_candidates <= config.max_candidates <= 9:
        raise LadError(
            "--min-candidates and --max-candidates must satisfy 2 <= min <= max <= 9. "
            f"Got {config.min_candidates} and {config.max_candidates}."
        )
    if not 0 <= config.caption_share + config.refer_share < 1 or config.refer_share < 0:
        raise LadError(
            "--caption-share and --refer-share must be >= 0 with a sum below 1. "
            f"Got {config.caption_share} and {config.refer_share}."
        )
    if not 0 < config.position_decay <= 1:
        raise LadError(f"--position-decay must be in (0, 1]. Got {config.position_decay}.")
    for name in ("steps", "batch_size", "train_items", "threads"):
        if getattr(config, name) < 1:
            raise LadError(f"--{name.replace('_', '-')} must be at least 1.")


# ----------------------------------------------------------------------------- data


@dataclass
class _Pool:
    """Training items held in memory: query, answer image, distractor images (PIL)."""

    queries: list[str]
    answers: list[Any]
    distractors: list[list[Any]]
    distractor_texts: list[list[str]]


def _load_pool(config: TrainConfig, work: Path) -> _Pool:
    """Draw the shapes training split (never eval/calibration scenes or images) into memory."""
    from lad.data.items import read_items
    from lad.data.shapes import build_shapes
    from lad.images import open_image

    pool = _Pool([], [], [], [])
    for setting in config.settings:
        path = build_shapes(
            work / setting,
            num_candidates=config.max_candidates,
            setting=setting,
            items=config.train_items,
            split="train",
            seed=config.seed,
            image_size=config.image_size,
            max_shapes=config.max_shapes,
        )
        for it in read_items(path):
            images = [open_image(p) for p in it.images]
            pool.queries.append(it.query)
            pool.answers.append(images[it.answer])
            pool.distractors.append([im for i, im in enumerate(images) if i != it.answer])
            texts = it.extra["descriptions"]
            pool.distractor_texts.append([t for i, t in enumerate(texts) if i != it.answer])
    return pool


def _draw_example(
    pool: _Pool, config: TrainConfig, rng: np.random.Generator
) -> tuple[str | None, list[Any], str]:
    """One training example: (query or None for a caption example, images, target text).

    Matching: the query's image among n candidates, answer position drawn from the skewed
    weights; target = the answer's label. Captioning (share `caption_share`, like an MLLM's
    alignment stage): one image, target = its description.
    """
    i = int(rng.integers(len(pool.queries)))
    u = rng.random()
    if u < config.caption_share:
        return None, [pool.answers[i]], pool.queries[i]
    n = int(rng.integers(config.min_candidates, config.max_candidates + 1))
    if u < config.caption_share + config.refer_share:
        # Referring (multi-image grounding data): describe the picture named by its index.
        chosen = rng.choice(len(pool.distractors[i]), size=n - 1, replace=False)
        images = [pool.answers[i], *(pool.distractors[i][j] for j in chosen)]
        texts = [pool.queries[i], *(pool.distractor_texts[i][j] for j in chosen)]
        k = int(rng.integers(n))
        return f"{REFER_PROMPT}{k + 1}.", images, texts[k]
    position = int(rng.choice(n, p=config.position_weights(n)))
    chosen = rng.choice(len(pool.distractors[i]), size=n - 1, replace=False)
    images = [pool.distractors[i][j] for j in chosen]
    images.insert(position, pool.answers[i])
    return pool.queries[i], images, _label(n, position)


def _label(num_candidates: int, position: int) -> str:
    from lad.labels import get_scheme

    return get_scheme(LABELS).labels(num_candidates)[position]


# ----------------------------------------------------------------------------- prompts


def prompt_text(processor: Any, query: str, num_candidates: int) -> str:
    """The chat-formatted vanilla prompt, ending where the answer label starts."""
    from lad.backends.prompting import chat_text  # exactly the backend's prompt building
    from lad.labels import get_scheme
    from lad.prompts import render_prompt

    text = render_prompt("vanilla", query, get_scheme(LABELS), num_candidates)
    return chat_text(processor, text, num_candidates)


CAPTION_PROMPT = "Describe the image."
REFER_PROMPT = "Describe picture "


def _batch(
    processor: Any, examples: Sequence[tuple[str | None, list[Any], str]]
) -> dict[str, torch.Tensor]:
    """Tokenised prompts + targets; the loss sees only the target and the end-of-turn token."""
    from lad.backends.prompting import chat_text

    tok = processor.tokenizer
    prompts, texts, images = [], [], []
    for query, imgs, target in examples:
        if query is None:
            prompt = chat_text(processor, CAPTION_PROMPT, 1)
        elif query.startswith(REFER_PROMPT):
            prompt = chat_text(processor, query, len(imgs))
        else:
            prompt = prompt_text(processor, query, len(imgs))
        prompts.append(prompt)
        texts.append(prompt + target + tok.eos_token)
        images.append(imgs)
    tok.padding_side = "right"
    enc = processor(text=texts, images=images, return_tensors="pt", padding=True)
    prompt_lengths = processor(text=prompts, images=images, return_tensors="pt", padding=True)[
        "attention_mask"
    ].sum(1)
    labels = enc["input_ids"].clone()
    positions = torch.arange(labels.shape[1])[None, :]  # (1, T)
    labels[(positions < prompt_lengths[:, None]) | (enc["attention_mask"] == 0)] = -100
    enc["labels"] = labels
    return dict(enc)


# ----------------------------------------------------------------------------- training


def _seed_everything(seed: int, threads: int) -> None:
    torch.manual_seed(seed)
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(True)


def _lr_at(step: int, config: TrainConfig) -> float:
    """Linear warm-up, then cosine decay to 10 % of the peak."""
    if step < config.warmup:
        return config.lr * (step + 1) / config.warmup
    t = (step - config.warmup) / max(1, config.steps - config.warmup)
    return config.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * t)))


def _initial_model(config: TrainConfig, out: Path) -> None:
    from transformers import AutoProcessor

    from lad.data.shapes import BACKGROUND, shapes_vocabulary
    from lad.tiny import TinySize, build_tiny_model

    size = TinySize(
        text_layers=config.text_layers,
        hidden=config.hidden,
        heads=config.heads,
        kv_heads=config.kv_heads,
        intermediate=config.intermediate,
        vision_layers=config.vision_layers,
        vision_hidden=config.vision_hidden,
        vision_heads=config.vision_heads,
        patch=14,
        image_side=56,  # 4 tokens per image after the 2×2 merge: one per cell of a shapes scene
        max_positions=2048,
    )
    words = [*shapes_vocabulary(), "Picture", "picture", "Describe"]
    build_tiny_model(ARCH, out, size=size, words=words, seed=config.seed)
    processor = AutoProcessor.from_pretrained(out)
    processor.chat_template = CHAT_TEMPLATE
    # Normalise pixels around the shapes' grey background rather than CLIP's photo statistics:
    # the background then embeds near zero and the small objects dominate each patch.
    grey = BACKGROUND[0] / 255
    processor.image_processor.image_mean = [grey] * 3
    processor.image_processor.image_std = [0.25] * 3
    processor.save_pretrained(out)


# Qwen2-VL's own chat template with its `add_vision_id` option always on: "Picture k: " before
# image k, so the model can name the image it picked without counting images.
CHAT_TEMPLATE = (
    "{% set image_count = namespace(value=0) %}{% for message in messages %}"
    "{% if loop.first and message['role'] != 'system' %}<|im_start|>system\n"
    "You are a helpful assistant.<|im_end|>\n{% endif %}"
    "<|im_start|>{{ message['role'] }}\n{% if message['content'] is string %}"
    "{{ message['content'] }}{% else %}{% for c in message['content'] %}"
    "{% if c['type'] == 'image' %}{% set image_count.value = image_count.value + 1 %}"
    "Picture {{ image_count.value }}: <|vision_start|><|image_pad|><|vision_end|>"
    "{% elif c['type'] == 'text' %}{{ c['text'] }}{% endif %}{% endfor %}{% endif %}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def train(
    config: TrainConfig, out: str | Path, *, init: str | Path | None = None, log: Any = print
) -> Path:
    """Train the demo model and save it into `out` (save_pretrained); returns `out`.

    init: a checkpoint to continue from (the second stage of the recipe); by default a fresh
    random-init model (lad.tiny) is built from the config.
    """
    from transformers import AutoModelForImageTextToText, AutoProcessor

    _check(config)
    out = Path(out)
    _seed_everything(config.seed, config.threads)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="lad-demo-") as tmp:
        work = Path(tmp)
        if init is None:
            init = work / "init"
            _initial_model(config, init)
        elif not (Path(init) / "config.json").is_file():
            raise LadError(f"--init {init}: not a model folder (no config.json)")
        pool = _load_pool(config, work / "data")
        processor = AutoProcessor.from_pretrained(init)
        model = AutoModelForImageTextToText.from_pretrained(init, dtype=torch.float32)
    log(f"data and init: {time.perf_counter() - start:.0f}s, {len(pool.queries)} items")
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=config.lr, weight_decay=config.weight_decay)
    rng = np.random.default_rng(config.seed)
    history = []
    for step in range(config.steps):
        for group in opt.param_groups:
            group["lr"] = _lr_at(step, config)
        examples = [_draw_example(pool, config, rng) for _ in range(config.batch_size)]
        batch = _batch(processor, examples)
        loss = model(**batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        history.append(loss.item())
        if (step + 1) % 50 == 0 or step + 1 == config.steps:
            recent = float(np.mean(history[-50:]))
            log(f"step {step + 1}/{config.steps}  loss {recent:.4f}  "
                f"{time.perf_counter() - start:.0f}s")  # fmt: skip
    _save(model, processor, config, out, time.perf_counter() - start, history)
    return out


def _save(
    model: Any, processor: Any, config: TrainConfig, out: Path, seconds: float, history: list[float]
) -> None:
    if out.exists():
        shutil.rmtree(out)
    model.eval()
    model.save_pretrained(out)
    processor.save_pretrained(out)
    meta = {
        "format": "lad-demo-train/1",
        "config": asdict(config),
        "train_seconds": round(seconds, 1),
        "final_loss": float(np.mean(history[-50:])),
        "torch": torch.__version__,
    }
    (out / "lad_demo_training.json").write_text(json.dumps(meta, indent=2) + "\n")


# ----------------------------------------------------------------------------- command line


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Flags shared by `python -m lad.demo.train` and `lad demo train`."""
    d = TrainConfig()
    p.add_argument("--out", required=True, help="folder to write the model into (replaced)")
    p.add_argument("--seed", type=int, default=d.seed, help="seed of data, init and batches")
    p.add_argument("--steps", type=int, default=d.steps, help="optimizer steps")
    p.add_argument("--batch-size", type=int, default=d.batch_size, help="prompts per step")
    p.add_argument("--lr", type=float, default=d.lr, help="peak learning rate")
    p.add_argument("--train-items", type=int, default=d.train_items,
                   help="training items drawn per setting (random, adversarial)")  # fmt: skip
    p.add_argument("--min-candidates", type=int, default=d.min_candidates)
    p.add_argument("--max-candidates", type=int, default=d.max_candidates)
    p.add_argument("--position-decay", type=float, default=d.position_decay,
                   help="answer at position p with weight decay**p (1 = uniform)")  # fmt: skip
    p.add_argument("--caption-share", type=float, default=d.caption_share,
                   help="share of single-image captioning examples (alignment stage)")  # fmt: skip
    p.add_argument("--refer-share", type=float, default=d.refer_share,
                   help="share of 'Describe picture k.' examples (grounding)")  # fmt: skip
    p.add_argument("--threads", type=int, default=d.threads, help="CPU threads")
    p.add_argument("--init", default=None,
                   help="start from this checkpoint (stage 2), not a fresh model")  # fmt: skip


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    return TrainConfig(
        seed=args.seed,
        steps=args.steps,
        batch_size=args.batch_size,
        lr=args.lr,
        train_items=args.train_items,
        min_candidates=args.min_candidates,
        max_candidates=args.max_candidates,
        position_decay=args.position_decay,
        caption_share=args.caption_share,
        refer_share=args.refer_share,
        threads=args.threads,
    )


EXAMPLE = "python -m lad.demo.train --out lad/demo/model"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m lad.demo.train",
        description="Train lad's demo model (a tiny Qwen2-VL) on the shapes training split, CPU.",
        epilog="example:\n  " + EXAMPLE,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        train(config_from_args(args), args.out, init=args.init)
    except LadError as e:
        print(f"Error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
