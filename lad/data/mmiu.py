"""MMIU as released (Meng et al., 2024) as lad items: the questions whose options are pictures
(docs/data.md, "MMIU", has the formats, an example row and every rule).

Read are the hub release's `all.parquet`, JSON Lines exports and the GitHub repository's JSON
lists (`all.json`, a task's `metadata_info.json`), each question flat or nested as InternVL's MMIU
evaluation writes it ({"input": {...}, "output": {"output_text"}}). Image paths are the release's,
looked up under `images_dir` and then beside the question file (lad.data.released), never outside.
A question becomes an item when every option reads "the <ordinal> image" and the options name
different pictures: those are the candidates, in MMIU's order; pictures no option names become
context pictures, shown first, where MMIU shows them. The item asks MMIU's question with its
context's instruction in MMIU's own prompt order (QUESTION_FIRST), less the context's list of
options: lad names and shuffles the candidates itself, so "A: the first image" would be wrong.
`output` is compared as MMIU's scorer compares answers: trimmed and case-insensitive.
"""

from __future__ import annotations

import ast
import contextlib
import re
from pathlib import Path
from typing import Any

from lad.data.questions import Benchmark, Row
from lad.data.released import Converted, Options, Written, convert, read
from lad.data.rules import (
    EMPTY_QUESTION,
    NO_ANSWER,
    NOT_ONE_PER_IMAGE,
    OPTIONS_NOT_IMAGES,
    Choice,
    answer_position,
    named_choice,
    ordinal_image,
    pictures_named,
)
from lad.errors import DataError

_OPTION_LINE = re.compile(r"([A-Za-z])\s*[:.]\s*(.*\S)")
_CHOICES = re.compile(r"select from the following choices\W*$", re.I)

# MMIU's evaluation script (VLMEvalKit/test_*.py in its repository) asks these tasks as
# question + "\n" + context and every other task as context + "\n" + question.
QUESTION_FIRST = frozenset((
    "person_reid", "multiple_image_captioning", "spot_the_similarity", "face_retrieval",
    "sketch2image_retrieval", "handwritten_retrieval", "spot_the_diff", "image2image_retrieval",
    "vehicle_retrieval", "text2image_retrieval", "general_action_recognition", "video_captioning",
    "next_img_prediction", "temporal_ordering", "meme_vedio_understanding",
    "action_quality_assessment", "temporal_localization", "mevis", "ravens_progressive_matrices",
    "threed_indoor_recognition", "point_tracking", "threed_cad_recognition",
    "single_object_tracking",
))  # fmt: skip


def option_images(options: str) -> list[tuple[str, int]] | None:
    """[(letter, image index)] for options that are all "the <ordinal> image", else None."""
    named = []
    for line in options.splitlines():
        if not line.strip():
            continue
        match = _OPTION_LINE.fullmatch(line.strip())
        image = None if match is None else ordinal_image(match.group(2))
        if image is None:
            return None
        named.append((match.group(1).upper(), image))
    return named or None


def instruction(context: str) -> str:
    """MMIU's context less its trailing list of options ("Select from the following choices."
    and the option lines after it)."""
    lines = context.rstrip().splitlines()
    while lines and (not lines[-1].strip() or _OPTION_LINE.fullmatch(lines[-1].strip())):
        lines.pop()
    if lines and _CHOICES.match(lines[-1].strip()):
        lines.pop()
    return "\n".join(lines).strip()


def _options_in(context: str) -> str:
    """The option lines after "Select from the following choices." in a context."""
    lines = context.splitlines()
    k = next((k for k, line in enumerate(lines) if _CHOICES.match(line.strip())), len(lines))
    return "\n".join(lines[k + 1 :])  # "" when there is none


def asked_text(task: str, question: str, context: str) -> str:
    """What the item asks: MMIU's question and its context's instruction, in MMIU's order."""
    parts = [question.strip(), instruction(context)]
    if task not in QUESTION_FIRST:
        parts.reverse()
    return "\n".join(p for p in parts if p)


def flatten(row: Row) -> dict[str, Any]:
    """A question's fields from the flat or the nested layout: task, question, context, options,
    input_image_path, output."""
    f = row.fields
    nested = f.get("input")
    if isinstance(nested, dict):
        source = {**nested, **{k: v for k, v in f.items() if k not in ("input", "output")}}
        out = f.get("output")
        source["output"] = out.get("output_text") if isinstance(out, dict) else out
    else:
        source = f
    for key in ("question", "input_image_path", "output"):
        if key not in source:
            raise DataError(
                f"{row.where}missing field {key!r}; expected an MMIU question (flat, or nested as "
                '{"input": {question, context, input_image_path}, "output": {"output_text"}})'
            )
    context = source.get("context") or ""
    options = source.get("options") or _options_in(str(context))
    return {
        "task": _task_of(f),  # a null top-level task falls back to the nested one
        "question": "" if source["question"] is None else str(source["question"]),
        "context": str(context),
        "options": str(options),
        "paths": _paths(source["input_image_path"], row.where),
        "output": source["output"],
    }


def _paths(value: Any, where: str) -> list[str]:
    """input_image_path as a list of strings (a list, or the text of one, as exports write)."""
    if isinstance(value, str) and value.strip().startswith("["):
        with contextlib.suppress(ValueError, SyntaxError, RecursionError, MemoryError):
            value = ast.literal_eval(value.strip())
    if not isinstance(value, list | tuple) or not all(isinstance(p, str) for p in value):
        raise DataError(f"{where}'input_image_path' must be a list of paths, got {value!r}")
    return list(value)


def choose(row: Row) -> Choice | str:
    """MMIU's rule: a question whose options all name its pictures, or why it is skipped; its
    pictures are the paths the row names (`index`: its position among its task's questions)."""
    fields = flatten(row)
    output = fields["output"]
    if output is None or not str(output).strip():
        return NO_ANSWER
    named = option_images(fields["options"])
    if named is None:
        return OPTIONS_NOT_IMAGES
    letters = [letter for letter, _ in named]
    answer = answer_position(output, letters, wrapped=False)
    if isinstance(answer, str):
        return answer
    if len(set(letters)) != len(letters):
        return NOT_ONE_PER_IMAGE
    paths = fields["paths"]
    shown = [image for _, image in named]
    placed = pictures_named(shown, len(paths), NOT_ONE_PER_IMAGE)
    if isinstance(placed, str):
        return placed
    task = fields["task"]
    asked = asked_text(task, fields["question"], fields["context"])
    if not asked:
        return EMPTY_QUESTION
    return named_choice(
        paths,
        placed,
        shown,
        letters,
        answer,
        item=f"{task}-{row.index:05d}",
        task=task,
        question=asked,
        extra={"source": "mmiu", "task": task, "mmiu_index": row.index},
    )


def _task_of(fields: dict[str, Any]) -> str:
    nested = fields.get("input")
    task = fields.get("task")
    if task is None and isinstance(nested, dict):
        task = nested.get("task")
    return str(task or "")


BENCHMARK = Benchmark(
    name="mmiu",
    title="MMIU",
    choose=choose,
    embedded=False,
    one_task=True,
    hub="FanqingM/MMIU-Benchmark",
    example="lad data mmiu MMIU/all.parquet --task forensic_detection_forgerynet --images MMIU "
    "--out forgerynet.jsonl",
    task_of=_task_of,
    help="Convert one MMIU task (all.parquet, a JSON Lines export, all.json or a task's "
    "metadata_info.json) into items with their own question, for the questions whose options "
    "are pictures (paper Table 5); a query picture no option names becomes a context picture. "
    "Other questions are skipped and counted per reason in OUT's .summary.json sibling.",
    files="all.parquet, .jsonl, all.json or a metadata_info.json",
    layout=(("questions", "all.parquet"), ("images", ".")),
)


def read_mmiu(
    path: str | Path, *, images_dir: str | Path | None = None, **options: Any
) -> tuple[str, Converted]:
    """(task, what converted and what was skipped) of one task of an MMIU question file;
    options: task, num_candidates, skip_missing (lad.data.released.Options)."""
    chosen, converted, _ = read(BENCHMARK, path, Options(images=images_dir, **options))
    assert chosen is not None  # one task
    return chosen, converted


def import_mmiu(
    path: str | Path, out: str | Path, *, images_dir: str | Path | None = None, **options: Any
) -> tuple[str, Written]:
    """Convert one MMIU task into an items file `out`, calibration items and a summary beside
    it; options: those of lad.data.released.Options (task, num_candidates, items, ...)."""
    chosen, written = convert(BENCHMARK, path, out, Options(images=images_dir, **options))
    assert chosen is not None  # one task
    return chosen, written
