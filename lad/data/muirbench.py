"""MuirBench (Wang et al., 2024; huggingface.co/datasets/MUIRBENCH/MUIRBENCH) as lad items: the
questions whose options are all pictures (docs/data.md, "MuirBench and BLINK", has the columns
and every rule). `image_list` holds one picture per `<image>` of the question, then one per
option, as its evaluation feeds them: the options' pictures are the candidates, in option order;
the question's own are context pictures, shown where it writes `<image>` (kept in its text).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lad.data.items import CONTEXT_PLACEHOLDER
from lad.data.questions import Benchmark, Row, require, strings
from lad.data.released import Options, Written, convert
from lad.data.rules import (
    EMPTY_QUESTION,
    OPTIONS_NOT_PICTURES,
    PICTURES_NOT_PLACES,
    Choice,
    answer_position,
    first_reason,
    kept,
    option_letters,
)
from lad.data.screen import picture_question_reason
from lad.errors import DataError


def choose(row: Row) -> Choice | str:
    """MuirBench's rule: a row whose options are all pictures, or why it is skipped."""
    question = require(row, "question")
    if question is not None and not isinstance(question, str):
        raise DataError(f"{row.where}'question' must be a string, got {question!r}")
    question = question or ""
    options = strings(row, "options")
    listed = require(row, "image_list")
    if listed is not None and not isinstance(listed, list):
        raise DataError(
            f"{row.where}'image_list' must be a list of pictures, got {type(listed).__name__}"
        )
    listed = listed or []
    answer = answer_position(require(row, "answer"), option_letters(len(options)))
    if not all(o.strip() == CONTEXT_PLACEHOLDER for o in options) or len(options) < 2:
        return first_reason(answer, OPTIONS_NOT_PICTURES)
    places = question.count(CONTEXT_PLACEHOLDER)
    if len(listed) != places + len(options):
        return first_reason(answer, PICTURES_NOT_PLACES)
    if not question.replace(CONTEXT_PLACEHOLDER, "").strip():
        return first_reason(answer, EMPTY_QUESTION)
    if any(cell is None for cell in listed):
        return first_reason(answer, PICTURES_NOT_PLACES)
    moved = picture_question_reason(question, places, len(options))
    if moved is not None:
        return first_reason(answer, moved)
    idx = str(require(row, "idx"))
    task = str(row.fields.get("task") or "")
    extra = {"source": "muirbench", "task": task}
    extra |= {key: kept(row.fields.get(key)) for key in ("image_relation", "image_type")}
    extra |= {"muirbench_idx": idx, "counterpart_idx": kept(row.fields.get("counterpart_idx"))}
    return Choice(
        item=f"muirbench-{idx}",
        task=task,
        question=question.strip(),
        candidates=listed[places:],
        context=listed[:places],
        answer=answer if isinstance(answer, int) else None,
        unanswered=answer if isinstance(answer, str) else None,
        replies=option_letters(len(options)),  # 26 at most: a larger N is skipped when written
        extra=extra,
    )


BENCHMARK = Benchmark(
    name="muirbench",
    title="MuirBench",
    choose=choose,
    hub="MUIRBENCH/MUIRBENCH",
    example="lad data muirbench MUIRBENCH/data --task 'Image-Text Matching' -n 4 "
    "--out muirbench-itm.jsonl",
    harness_keys=("idx", "question", "options", "answer", "image_list"),
    layout=(("questions", "data"),),
)


def import_muirbench(path: str | Path, out: str | Path, **options: Any) -> Written:
    """`lad data muirbench` (lad.data.released.convert; options: those of its Options)."""
    return convert(BENCHMARK, path, out, Options(**options))[1]
