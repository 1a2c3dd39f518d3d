"""Train lad's embedded demo model: a tiny Qwen2-VL taught to match a caption to one of N shapes.

    lad demo train --out runs/demo-model
    lad demo train --out lad/demo/model --replace-shipped-model      (the shipped one)

`train(TrainConfig(), out)` does it from Python; the recipe is docs/demo-model.md's ("Recipe"): a
random-init Qwen2-VL (lad.testing.tiny) learns the shapes training split as a causal LM on three
kinds of multi-image prompt (lad.demo.batches), with two auxiliary losses that give the small
model the grounding a real MLLM gets from pretraining. The last stage trains only the output
mapping on drifting annotations, so the position bias is learned last, from data alone, and every
attention map stays as the grounded model left it. Nothing is edited after training. CPU only,
seeded, deterministic.
"""

from __future__ import annotations

import itertools
import json
import math
import shutil
import tempfile
import time
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from lad.data.items import cyclic_shift
from lad.data.shapes import BACKGROUND, shapes_vocabulary
from lad.demo import MODEL_DIR
from lad.demo.batches import Example, PreparedItem, Tokens, collate, draw, load_items
from lad.demo.recipe import Stage, TrainConfig
from lad.errors import LadError
from lad.io.files import check_not_inputs
from lad.testing.tiny_parts import chatml

ARCH = "qwen2_vl"


# ----------------------------------------------------------------------------- losses


def _losses(model, examples, tokens, config):
    """Per-example LM loss, vision-word alignment and intermediate-layer grounding of a batch."""
    batch, labels, last = collate(tokens, examples)
    out = model(**batch, output_hidden_states=config.grounding_weight > 0)
    logits, target = out.logits[:, :-1], labels[:, 1:]
    ce = F.cross_entropy(logits.transpose(1, 2), target, ignore_index=-100, reduction="none")
    counted = (target != -100).float()
    per_example = (ce * counted).sum(1) / counted.sum(1)
    parts = {"lm": per_example.mean()}
    embed = model.get_input_embeddings().weight
    word_vectors = F.normalize(embed[tokens.word_ids], dim=-1)
    if config.align_weight and embed.requires_grad:
        # Each picture's vision tokens (max over them) must name the words of its description.
        image = model.model.get_image_features(batch["pixel_values"], batch["image_grid_thw"])
        image = F.normalize(torch.stack(list(image.pooler_output)), dim=-1)
        present = torch.stack([tokens.said(d) for ex in examples for d in ex.descriptions])
        scores = 10 * (image @ word_vectors.T).amax(1)
        parts["align"] = F.binary_cross_entropy_with_logits(scores, present)
    if config.grounding_weight:
        hidden = out.hidden_states[config.grounding_layer]
        norm, head = model.model.language_model.norm, model.lm_head.weight
        index_losses, caption_losses = [], []
        for b, ex in enumerate(examples):
            where = (batch["input_ids"][b] == tokens.image_id).nonzero().flatten()
            picture = torch.arange(len(where)) // tokens.per_image
            index_logits = norm(hidden[b, where]) @ head[tokens.digits[: len(ex.pixels)]].T
            index_losses.append(F.cross_entropy(index_logits, picture))
            if ex.kind == "match":
                said = 10 * F.normalize(hidden[b, last[b]], dim=-1) @ word_vectors.T
                caption_losses.append(
                    F.binary_cross_entropy_with_logits(said, tokens.said(ex.text))
                )
        parts["index"] = torch.stack(index_losses).mean()
        if caption_losses:
            parts["caption"] = torch.stack(caption_losses).mean()
    total = parts["lm"] + config.align_weight * parts.get("align", 0)
    total = total + config.grounding_weight * (parts.get("index", 0) + parts.get("caption", 0))
    return total, {k: float(v.detach()) for k, v in parts.items()}, per_example.detach()


# ----------------------------------------------------------------------------- monitor


@torch.no_grad()
def monitor(model: Any, tokens: Tokens, items: list[PreparedItem], n: int = 4) -> dict[str, Any]:
    """Held-out accuracy at N = n over all cyclic shifts: the logits (vanilla), perm-avg, and the
    last prompt token's attention to each picture per layer, raw and divided by its mean over
    shifts and items (a stand-in for the calibration's attention prior)."""
    model.eval()
    labels = tokens.digits[:n]
    logp, attention, gold = [], [], []
    for it in items:
        shifts = [cyclic_shift(n, s) for s in range(n)]
        examples = [
            Example("match", it.query, [it.pixels[i] for i in order], "", []) for order in shifts
        ]
        batch, _, _ = collate(tokens, examples, with_targets=False)
        out = model(**batch, output_attentions=True)
        logp.append(out.logits[:, -1, labels].log_softmax(-1))
        where = (batch["input_ids"][0] == tokens.image_id).nonzero().flatten().view(n, -1)
        rows = torch.stack([a[:, :, -1].mean(1) for a in out.attentions])  # (layers, shifts, T)
        attention.append(torch.stack([rows[..., w].sum(-1) for w in where], -1))
        gold.append([order.index(it.answer) for order in shifts])
    model.train()
    lp, att, g = torch.stack(logp), torch.stack(attention, 1), torch.tensor(gold)
    vanilla = lp.argmax(-1) == g
    by_image = sum(lp[:, s].roll(s, dims=-1) for s in range(n))  # each picture's, over shifts
    answers = torch.tensor([it.answer for it in items])
    purified = att / att.mean((1, 2), keepdim=True)
    pct = lambda x: round(float(x.float().mean()) * 100, 1)  # noqa: E731
    return {
        "vanilla": pct(vanilla),
        "recall": [pct(vanilla[g == j]) for j in range(n)],
        "perm_avg": pct(by_image.argmax(-1) == answers),
        "attention": [pct(a.argmax(-1) == g) for a in att],
        "attention_purified": [pct(a.argmax(-1) == g) for a in purified],
    }


# ----------------------------------------------------------------------------- training


def _seed_everything(seed: int, threads: int) -> None:
    torch.manual_seed(seed)
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(True)


def _lr_at(step: int, stage: Stage, config: TrainConfig) -> float:
    """Within a stage: linear warm-up, then cosine decay to 10 % of the stage's peak (or flat)."""
    peak = config.lr * stage.lr_scale
    if step < config.warmup:
        return peak * (step + 1) / config.warmup
    if not stage.decay:
        return peak
    t = (step - config.warmup) / max(1, stage.steps - config.warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * t)))


def _initial_model(config: TrainConfig, out: Path) -> None:
    from transformers import AutoProcessor

    from lad.testing.tiny import TinySize, build_tiny_model

    # The model's shape: the fields TrainConfig shares with TinySize, by name.
    shape = {f.name for f in fields(TinySize)} & {f.name for f in fields(config)}
    size = TinySize(
        **{name: getattr(config, name) for name in shape},
        patch=14,
        image_side=56,  # 4 tokens per image after the 2×2 merge: one per cell of a shapes scene
        max_positions=2048,
    )
    words = [*shapes_vocabulary(), "Picture", "picture", "Describe", "What", "is", "in", "with"]
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
CHAT_TEMPLATE = "{% set image_count = namespace(value=0) %}" + chatml(
    "{% set image_count.value = image_count.value + 1 %}Picture {{ image_count.value }}: "
    "<|vision_start|><|image_pad|><|vision_end|>"
)


def train(
    config: TrainConfig,
    out: str | Path,
    *,
    init: str | Path | None = None,
    replace_shipped_model: bool = False,
    log: Any = print,
) -> Path:
    """Train the demo model and save it into `out` (save_pretrained); returns `out`.

    init: a checkpoint to continue from (e.g. only the bias stage on a trained model); by
    default a fresh random-init model (lad.testing.tiny) is built from the config.
    replace_shipped_model: allow `out` to be the model shipped inside lad (lad/demo/model).
    Every check (config, `out`, `init`) comes before any work.
    """
    from transformers import AutoModelForImageTextToText, AutoProcessor

    config.check()
    _check_out(out, init, replace_shipped_model)
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
        processor = AutoProcessor.from_pretrained(init)
        model = AutoModelForImageTextToText.from_pretrained(
            init, dtype=torch.float32, attn_implementation="eager"
        )
        train_items = load_items(
            processor, work, "train", config.settings, config.train_items, config
        )
        held_out = load_items(processor, work, "eval", ("random",), config.monitor_items, config)
    tokens = Tokens(processor, train_items[0].pixels[0].shape[0] // 4)
    log(f"data and init: {time.perf_counter() - start:.0f}s, {len(train_items)} items")
    model.train()
    history: list[dict[str, Any]] = []
    done = 0
    for index, stage in enumerate(config.stages):
        # Each stage starts afresh (optimizer, schedule, its own seeded draws), so running a
        # stage on a saved checkpoint with --init gives exactly what the whole command gives.
        params = _trained_parameters(model, stage)
        model.requires_grad_(False)
        for param in params:
            param.requires_grad_(True)
        opt = torch.optim.AdamW(params, lr=config.lr, weight_decay=config.weight_decay)
        rng = np.random.default_rng([config.seed, index])
        recent: dict[str, list[float]] = {}
        for step in range(stage.steps):
            for group in opt.param_groups:
                group["lr"] = _lr_at(step, stage, config)
            examples = [draw(train_items, config, stage, rng) for _ in range(config.batch_size)]
            loss, parts, per_example = _losses(model, examples, tokens, config)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
            for name, value in parts.items():
                recent.setdefault(name, []).append(value)
            for ex, value in zip(examples, per_example.tolist(), strict=True):
                recent.setdefault(f"lm_{ex.kind}", []).append(value)
            if (step + 1) % config.monitor_every == 0 or step + 1 == stage.steps:
                seconds = round(time.perf_counter() - start, 1)
                row = {"step": done + step + 1, "stage": stage.name, "seconds": seconds}
                row["loss"] = {k: round(float(np.mean(v)), 4) for k, v in sorted(recent.items())}
                row["held_out"] = monitor(model, tokens, held_out)
                recent = {}
                history.append(row)
                log(json.dumps(row))
        done += stage.steps
    _save(model, processor, config, out, time.perf_counter() - start, history)
    return out


def _trained_parameters(model: Any, stage: Stage) -> list[torch.nn.Parameter]:
    """All parameters, or the "head": what acts after the last attention map (the last decoder
    layer's post-attention norm and MLP, the final norm, the LM head), so that every attention
    map stays exactly as the earlier stages left it."""
    if stage.train == "all":
        return list(model.parameters())
    text = model.model.language_model
    last = text.layers[-1]
    modules = (last.post_attention_layernorm, last.mlp, text.norm, model.lm_head)
    return [p for m in modules for p in m.parameters()]


def _check_out(out: str | Path, init: str | Path | None, replace_shipped: bool) -> None:
    """`out` is replaced at the end: refuse the --init checkpoint, any folder not a model's, and
    the package's own model folder, whose weights `lad eval` uses by default, unless on purpose
    (`replace_shipped`, --replace-shipped-model)."""
    path = Path(out)
    if not replace_shipped and (path.resolve() == MODEL_DIR or MODEL_DIR in path.resolve().parents):
        raise LadError(
            f"--out {out} is the demo model shipped with lad ({MODEL_DIR}), which lad eval uses by "
            "default; training would replace its weights. Write elsewhere (e.g. --out "
            "runs/demo-model, then lad eval --model runs/demo-model), or pass "
            "--replace-shipped-model to replace them on purpose"
        )
    check_not_inputs({"--out": path}, {"--init": init})
    if path.exists() and (
        not path.is_dir() or (any(path.iterdir()) and not (path / "config.json").is_file())
    ):
        raise LadError(
            f"--out {path}: exists and is not a model folder (no config.json); lad replaces --out "
            "with the trained model, so give a new or a model folder"
        )


def _save(
    model: Any, processor: Any, config: TrainConfig, out: Path, seconds: float, history: list
) -> None:
    if out.exists():
        shutil.rmtree(out)
    model.eval()
    model.config._attn_implementation = "sdpa"
    model.save_pretrained(out)
    processor.save_pretrained(out)
    meta = {
        "format": "lad-demo-train/2",
        "config": asdict(config),
        "train_seconds": round(seconds, 1),
        "history": history,
        "torch": torch.__version__,
    }
    (out / "lad_demo_training.json").write_text(json.dumps(meta, indent=1) + "\n")


def plot_history(training_json: str | Path, path: str | Path) -> None:
    """The training curve: losses and held-out accuracies (logits, attention) against steps."""
    from lad.outputs.figures import gaps, plt, save_figure

    history = json.loads(Path(training_json).read_text())["history"]
    steps = [r["step"] for r in history]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.6))
    for name in ("lm_match", "lm_refer", "lm_find", "align", "index", "caption"):
        values = [r["loss"].get(name) for r in history]
        if any(v is not None for v in values):
            left.plot(steps, gaps(values), label=name)
    left.set(xlabel="step", ylabel="loss", yscale="log", title="training losses")
    if history:
        left.legend(fontsize=7)
    h = [r["held_out"] for r in history]
    right.plot(steps, [x["vanilla"] for x in h], label="logits (vanilla)")
    right.plot(steps, [x["perm_avg"] for x in h], label="perm-avg")
    right.plot(
        steps, [max(x["attention_purified"]) for x in h], label="purified attention (best layer)"
    )
    right.axhline(25, color="grey", lw=0.8, ls=":")
    right.set(xlabel="step", ylabel="held-out accuracy, N = 4 (%)", ylim=(0, 100),
              title="held-out accuracy")  # fmt: skip
    right.legend(fontsize=7)
    for r0, r1 in itertools.pairwise(history):
        if r0["stage"] != r1["stage"]:
            for ax in (left, right):
                ax.axvline(r0["step"], color="black", lw=0.6)
    save_figure(fig, Path(path))
