"""The demo model's training data: shapes items with their pictures preprocessed once, the
examples drawn from them (caption matching, referring, finding) and the batches built from them
exactly as the processor would build them, without calling it (docs/demo-model.md).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from lad.backends.prompting import chat_text  # exactly the backend's prompt building
from lad.core.labels import get_scheme
from lad.core.prompts import render_prompt
from lad.data.items import read_items
from lad.data.shapes import COLOURS, SHAPES, build_shapes
from lad.demo.recipe import Stage, TrainConfig
from lad.io.images import open_image

LABELS = "digits"
REFER_PROMPT = "What is in picture {k}?"
FIND_PROMPT = "Describe the picture with {object}."


@dataclass
class PreparedItem:
    """A shapes item whose candidate pictures went through the processor once."""

    query: str
    pixels: list[torch.Tensor]  # per candidate: the processor's pixel_values of that image
    descriptions: list[str]
    answer: int


def load_items(
    processor: Any, work: Path, split: str, settings: Sequence[str], items: int, config: TrainConfig
) -> list[PreparedItem]:
    """A shapes split (4 candidates per item), pictures preprocessed once by the processor."""
    out = []
    for setting in settings:
        path = build_shapes(
            work / f"{split}-{setting}",
            num_candidates=4,
            setting=setting,
            items=items,
            split=split,
            seed=config.seed,
            image_size=config.image_size,
            max_shapes=config.max_shapes,
        )
        for it in read_items(path):
            pixels = [pixels_of(processor, open_image(p)) for p in it.images]
            out.append(PreparedItem(it.query, pixels, it.extra["descriptions"], it.answer))
    return out


def pixels_of(processor: Any, image: Any) -> torch.Tensor:
    return processor.image_processor(images=[image], return_tensors="pt")["pixel_values"]


@dataclass
class Example:
    kind: str  # "match", "refer" or "find"
    text: str  # the user turn's text (for "match": the caption)
    pixels: list[torch.Tensor]
    target: str
    descriptions: list[str]  # of the pictures, in prompt order


def draw(items: list[PreparedItem], config: TrainConfig, stage: Stage, rng: np.random.Generator):
    it = items[int(rng.integers(len(items)))]
    n = int(rng.integers(2, stage.max_candidates + 1))
    others = [i for i in range(len(it.pixels)) if i != it.answer]
    chosen = [others[j] for j in rng.choice(len(others), size=n - 1, replace=False)]
    u = 1.0 if stage.match_only else rng.random()
    order = [it.answer, *chosen]
    if u < config.refer_share + config.find_share:
        rng.shuffle(order)
        texts = [it.descriptions[i] for i in order]
        pixels = [it.pixels[i] for i in order]
        if u < config.refer_share:
            k = int(rng.integers(n))
            return Example("refer", REFER_PROMPT.format(k=k + 1), pixels, texts[k], texts)
        # Finding: an object of the answer's scene that no other candidate shows.
        taken = {o for i in chosen for o in it.descriptions[i].split(" and ")}
        free = [o for o in it.query.split(" and ") if o not in taken]
        if free:
            obj = free[int(rng.integers(len(free)))]
            return Example("find", FIND_PROMPT.format(object=obj), pixels, it.query, texts)
    weights = np.array([stage.position_decay**p for p in range(n)])
    position = int(rng.choice(n, p=weights / weights.sum()))
    order = chosen.copy()
    rng.shuffle(order)
    order.insert(position, it.answer)
    texts = [it.descriptions[i] for i in order]
    label = position
    if stage.keep_label < 1 and rng.random() >= stage.keep_label**position:
        # The annotation drifts, the likelier the later the true answer sits.
        label = 0 if stage.drift == "first" else position - 1
    return Example("match", it.query, [it.pixels[i] for i in order], str(label + 1), texts)


def prompt_text(processor: Any, query: str, num_candidates: int) -> str:
    """The chat-formatted vanilla prompt, ending where the answer label starts."""
    text = render_prompt("vanilla", query, get_scheme(LABELS), num_candidates)
    return chat_text(processor, text, num_candidates)


class Tokens:
    """Token ids of prompts and targets, cached (image placeholders expanded as by the processor),
    of the labels 1..9, and of the shapes' colour and shape words (the auxiliary losses')."""

    def __init__(self, processor: Any, tokens_per_image: int):
        self.processor = processor
        self.tok = processor.tokenizer
        self.image_id = self.tok.convert_tokens_to_ids(processor.image_token)
        self.per_image = tokens_per_image
        self.cache: dict[tuple[str, str, int], list[int]] = {}
        self.digits = [self.tok.convert_tokens_to_ids(str(k + 1)) for k in range(9)]
        self.words = [*COLOURS, *SHAPES]
        self.word_ids = torch.tensor([self.tok.convert_tokens_to_ids("▁" + w) for w in self.words])

    def said(self, text: str) -> torch.Tensor:
        """Which of the words `text` says, as a 0/1 vector."""
        said = set(text.split())
        return torch.tensor([float(w in said) for w in self.words])

    def prompt(self, kind: str, text: str, n: int) -> list[int]:
        key = (kind, text, n)
        if key not in self.cache:
            full = (prompt_text if kind == "match" else chat_text)(self.processor, text, n)
            image = self.processor.image_token
            full = full.replace(image, image * self.per_image)
            self.cache[key] = self.tok(full)["input_ids"]
        return self.cache[key]

    def target(self, text: str) -> list[int]:
        key = ("target", text, 0)
        if key not in self.cache:
            ids = self.tok(text + self.tok.eos_token, add_special_tokens=False)["input_ids"]
            self.cache[key] = ids
        return self.cache[key]


def collate(tokens: Tokens, examples: Sequence[Example], with_targets: bool = True):
    """Right-padded model inputs (what the processor would give) and the target labels."""
    seqs, starts = [], []
    for ex in examples:
        prompt = tokens.prompt(ex.kind, ex.text, len(ex.pixels))
        seqs.append(prompt + (tokens.target(ex.target) if with_targets else []))
        starts.append(len(prompt))
    length = max(map(len, seqs))
    ids = torch.full((len(seqs), length), tokens.tok.pad_token_id)
    mask = torch.zeros_like(ids)
    labels = torch.full_like(ids, -100)
    for b, (seq, start) in enumerate(zip(seqs, starts, strict=True)):
        ids[b, : len(seq)] = torch.tensor(seq)
        mask[b, : len(seq)] = 1
        labels[b, start : len(seq)] = ids[b, start : len(seq)]
    pixels = [p for ex in examples for p in ex.pixels]
    side = math.isqrt(pixels[0].shape[0])
    batch = {
        "input_ids": ids,
        "attention_mask": mask,
        "mm_token_type_ids": (ids == tokens.image_id).long(),
        "pixel_values": torch.cat(pixels),
        "image_grid_thw": torch.tensor([[1, side, side]] * len(pixels)),
    }
    return batch, labels, torch.tensor(starts) - 1
