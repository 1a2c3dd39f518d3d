"""BLINK (Fu et al., 2024; huggingface.co/datasets/BLINK-Benchmark/BLINK) as lad items: the
questions whose choices are pictures.

The hub dataset has one config per task (`Art_Style/`, `Jigsaw/`, `Visual_Similarity/`, ...), each
with `val` and `test` parquet files, one row per question: `idx`, `question`, `sub_task`,
`image_1` … `image_4` (pictures as {"bytes", "path"}, null where the question has fewer),
`choices` (a list of strings), `answer` ("(A)", "(B)", …; not given in the test split), `prompt`
(question and choices as one text) and `explanation`. The user downloads it; lad reads the files.

A question becomes an item when every choice reads "the <ordinal> image" ("the second image"),
naming different pictures: those are the candidates, in BLINK's order, and the answer is the one
the answer's choice names. Pictures no choice names (the reference of Visual_Similarity,
Art_Style and Jigsaw, "the first image") are context pictures, shown before the candidates as
BLINK shows them, so the question's ordinals still hold; they must be the first pictures. The
item asks BLINK's `question`. Others are skipped and counted per task, by reason (REASONS).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lad.data.items import Item
from lad.data.mmiu import ordinal_image
from lad.data.released import (
    Row,
    Written,
    convert_parquet,
    picture_bytes,
    require,
    safe_name,
    save_picture,
    text_or_none,
)
from lad.errors import DataError

PICTURE_FIELDS = ("image_1", "image_2", "image_3", "image_4")
NO_ANSWER = "no answer"  # the test split, or a blank answer
ANSWER_NOT_AN_OPTION = "answer not an option"
EMPTY_QUESTION = "empty question"
OPTIONS_NOT_PICTURES = "options not pictures"  # a choice is not "the <ordinal> image"
NOT_ONE_PER_PICTURE = "not one option per picture"  # two choices name one picture, or a missing one
REFERENCE_NOT_FIRST = "reference pictures not first"
REASONS = (
    NO_ANSWER, ANSWER_NOT_AN_OPTION, EMPTY_QUESTION, OPTIONS_NOT_PICTURES, NOT_ONE_PER_PICTURE,
    REFERENCE_NOT_FIRST,
)  # fmt: skip


def convert_row(row: Row, pictures: Path) -> Item | str:
    """The item for one BLINK row (its pictures written under `pictures`), or why not."""
    choices = require(row, "choices")
    if not isinstance(choices, list) or not all(isinstance(c, str) for c in choices):
        raise DataError(f"{row.where}'choices' must be a list of strings, got {choices!r}")
    answer = text_or_none(require(row, "answer"))
    letter = "" if answer is None else answer.strip("() .").upper()
    if len(letter) != 1 or not letter.isalpha():
        return NO_ANSWER
    if not 0 <= ord(letter) - ord("A") < len(choices):
        return ANSWER_NOT_AN_OPTION
    named = [ordinal_image(c) for c in choices]
    if any(k is None for k in named) or len(named) < 2:
        return OPTIONS_NOT_PICTURES
    cells = [row.fields.get(name) for name in PICTURE_FIELDS]
    present = [k for k, cell in enumerate(cells) if cell is not None]
    if present != list(range(len(present))):
        raise DataError(f"{row.where}pictures must fill image_1, image_2, … in order")
    shown = [k for k in named if k is not None]
    if len(set(shown)) != len(shown) or max(shown) >= len(present):
        return NOT_ONE_PER_PICTURE
    context = [k for k in present if k not in shown]
    if context != list(range(len(context))):
        return REFERENCE_NOT_FIRST
    question = text_or_none(require(row, "question"))
    if question is None:
        return EMPTY_QUESTION
    task = str(require(row, "sub_task"))
    idx = str(require(row, "idx"))
    files = []
    for k in present:
        data = picture_bytes(cells[k], row.where)
        assert data is not None  # present
        files.append(save_picture(data, pictures, f"{safe_name(idx)}_{k + 1}", row.where))
    candidates = sorted(shown)  # BLINK's order of the pictures the choices name
    answer_index = candidates.index(shown[ord(letter) - ord("A")])
    extra = {"source": "blink", "task": task, "blink_idx": idx}
    shown_files = [files[k] for k in candidates]
    item = Item(f"blink-{safe_name(idx)}", question, shown_files, answer_index, extra, question)
    item.context_images = [files[k] for k in context]
    return item


def import_blink(path: str | Path, out: str | Path, **options: Any) -> Written:
    """Convert BLINK's parquet files (a file, or a folder searched for *.parquet, e.g. one task's
    config folder) into an items file `out`, calibration items and a summary beside it;
    options: pictures (default `<out stem>-pictures/` beside `out`), task, num_candidates,
    items, calibration_items, seed (lad.data.released.convert_parquet)."""
    return convert_parquet(
        path, out, benchmark="blink", convert_row=convert_row, task_field="sub_task", **options
    )
