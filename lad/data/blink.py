"""BLINK (Fu et al., 2024; huggingface.co/datasets/BLINK-Benchmark/BLINK) as lad items: the
questions whose choices all read "the <ordinal> image" (docs/data.md, "MuirBench and BLINK", has
the columns and every rule). The pictures they name are the candidates, in BLINK's order; the
others (Visual_Similarity's reference, "the first image") are context pictures shown before
them, as BLINK shows them, so the question's ordinals still hold; they must be the first ones.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lad.data.questions import Benchmark, Row, require, strings
from lad.data.released import Options, Written, convert
from lad.data.rules import (
    EMPTY_QUESTION,
    OPTIONS_NOT_PICTURES,
    Choice,
    answer_position,
    first_reason,
    named_choice,
    option_letters,
    ordinal_image,
    pictures_named,
    safe_name,
)
from lad.errors import DataError

PICTURE_FIELDS = ("image_1", "image_2", "image_3", "image_4")


def choose(row: Row) -> Choice | str:
    """BLINK's rule: a row whose choices name its pictures, or why it is skipped."""
    choices = strings(row, "choices")
    letters = option_letters(len(choices))
    answer = answer_position(require(row, "answer"), letters)
    named = [ordinal_image(c) for c in choices]  # the picture each names ("the second image": 1)
    if any(k is None for k in named) or len(named) < 2:
        return first_reason(answer, OPTIONS_NOT_PICTURES)
    cells = [row.fields.get(name) for name in PICTURE_FIELDS]
    present = [k for k, cell in enumerate(cells) if cell is not None]
    if present != list(range(len(present))):
        raise DataError(f"{row.where}pictures must fill image_1, image_2, … in order")
    shown = [k for k in named if k is not None]
    placed = pictures_named(shown, len(present))
    if isinstance(placed, str):
        return first_reason(answer, placed)
    question = require(row, "question")
    question = "" if question is None else str(question).strip()
    if not question:
        return first_reason(answer, EMPTY_QUESTION)
    task = str(row.fields.get("sub_task") or "")
    idx = str(require(row, "idx"))
    return named_choice(
        cells,
        placed,
        shown,
        letters,
        answer,
        item=f"blink-{safe_name(idx)}",
        task=task,
        question=question,
        extra={"source": "blink", "task": task, "blink_idx": idx},
    )


BENCHMARK = Benchmark(
    name="blink",
    title="BLINK",
    choose=choose,
    task_field="sub_task",
    hub="BLINK-Benchmark/BLINK",
    example="lad data blink BLINK/Visual_Similarity --out blink-similarity.jsonl",
    harness_keys=("idx", "question", "choices", "answer", "image_1"),
)


def import_blink(path: str | Path, out: str | Path, **options: Any) -> Written:
    """`lad data blink` (lad.data.released.convert; options: those of its Options)."""
    return convert(BENCHMARK, path, out, Options(**options))[1]
