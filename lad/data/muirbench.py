"""MuirBench (Wang et al., 2024; huggingface.co/datasets/MUIRBENCH/MUIRBENCH) as lad items: the
questions whose options are pictures.

The hub dataset is parquet (`data/test-*.parquet`), one row per question: `idx`, `task`,
`image_relation`, `image_type`, `question` (text with an `<image>` where it shows a picture),
`options` (a list of strings; a picture option is "<image>"), `answer` (the option's letter),
`image_list` (the pictures, each {"bytes", "path"}: one per `<image>` of the question, then one per
`<image>` of the options, in order, as its evaluation feeds them with question and options) and
`counterpart_idx` (its unanswerable twin). The user downloads it; lad reads the files.

A question becomes an item when every option is a picture: the options' pictures are the
candidates, in option order, and the answer is the one its letter names. The question's own
pictures are context pictures, shown where the question writes `<image>` (which stays in the
question). Pictures are written out, bytes unchanged, to a folder. Others are skipped and counted
per task, by reason (REASONS); the unanswerable twins, whose answer "None of the choices provided"
is a text option, are skipped as `options not pictures`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lad.core.prompts import CONTEXT_PLACEHOLDER
from lad.data.items import Item
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

NO_ANSWER = "no answer"
ANSWER_NOT_AN_OPTION = "answer not an option"
EMPTY_QUESTION = "empty question"
OPTIONS_NOT_PICTURES = "options not pictures"  # an option is text
PICTURES_NOT_PLACES = "pictures do not match <image> places"  # image_list vs the <image> count
REASONS = (
    NO_ANSWER, ANSWER_NOT_AN_OPTION, EMPTY_QUESTION, OPTIONS_NOT_PICTURES, PICTURES_NOT_PLACES,
)  # fmt: skip


def convert_row(row: Row, pictures: Path) -> Item | str:
    """The item for one MuirBench row (its pictures written under `pictures`), or why not."""
    question = str(require(row, "question") or "")
    options = require(row, "options")
    if not isinstance(options, list) or not all(isinstance(o, str) for o in options):
        raise DataError(f"{row.where}'options' must be a list of strings, got {options!r}")
    answer = text_or_none(require(row, "answer"))
    if answer is None:
        return NO_ANSWER
    letter = answer.strip("() .").upper()
    if len(letter) != 1 or not 0 <= ord(letter) - ord("A") < len(options):
        return ANSWER_NOT_AN_OPTION
    if not all(o.strip() == CONTEXT_PLACEHOLDER for o in options) or len(options) < 2:
        return OPTIONS_NOT_PICTURES
    listed = require(row, "image_list") or []
    places = question.count(CONTEXT_PLACEHOLDER)
    if len(listed) != places + len(options):
        return PICTURES_NOT_PLACES
    if not question.replace(CONTEXT_PLACEHOLDER, "").strip():
        return EMPTY_QUESTION
    idx = str(require(row, "idx"))
    files = []
    for k, cell in enumerate(listed):
        data = picture_bytes(cell, row.where)
        if data is None:
            return PICTURES_NOT_PLACES
        files.append(save_picture(data, pictures, f"{safe_name(idx)}_{k}", row.where))
    extra = {
        "source": "muirbench",
        "task": str(require(row, "task")),
        "image_relation": row.fields.get("image_relation"),
        "image_type": row.fields.get("image_type"),
        "muirbench_idx": idx,
        "counterpart_idx": row.fields.get("counterpart_idx"),
    }
    text = question.strip()
    item = Item(f"muirbench-{idx}", text, files[places:], ord(letter) - ord("A"), extra, text)
    item.context_images = files[:places]
    return item


def import_muirbench(path: str | Path, out: str | Path, **options: Any) -> Written:
    """Convert MuirBench's parquet files (a file, or a folder searched for *.parquet) into an
    items file `out`, calibration items and a summary beside it; options: pictures (default
    `<out stem>-pictures/` beside `out`), task, num_candidates, items, calibration_items, seed
    (lad.data.released.convert_parquet)."""
    return convert_parquet(
        path, out, benchmark="muirbench", convert_row=convert_row, task_field="task", **options
    )
