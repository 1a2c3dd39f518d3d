"""MMIU as released (Meng et al., 2024) as lad items: the questions whose options are pictures.

The hub release (huggingface.co/datasets/FanqingM/MMIU-Benchmark) ships `all.parquet` and one zip
of pictures per relationship; the GitHub repository (github.com/OpenGVLab/MMIU) has the same
questions as JSON lists (`VLMEvalKit/all.json`, and one `metadata_info.json` per task). Read are
Parquet, JSON Lines (what `datasets`' to_json writes) and JSON lists, each question either flat:

    {"task": "image2image_retrieval", "visual_input_component": ..., "source": ...,
     "options": "A: The second image\\nB: The third image\\n...",
     "question": "Please retrieve the most similar scene to the query in the candidate.The query
                  image is the first image.",
     "context": "Select from the following choices.\\nA: The second image\\n...",
     "input_image_path": ["./High-level-obj-semantic/image2image_retrieval/
                           image2image_retrieval_0_0.jpg", ...],
     "output": "C"}

or nested as InternVL's MMIU evaluation writes it: {"input": {"question", "context",
"input_image_path"}, "output": {"output_text"}}, with `task` and `options` beside `input` or in
it (options missing: read from the context's "Select from the following choices." block).

Image paths are the release's (`./<relationship>/<task>/<task>_<q>_<i>.jpg`), relative to the folder
the zips were extracted in (`images_dir`); each is looked up there as written, then by its last
two parts and its file name, then beside the question file the same ways.

A question becomes an item when every option reads "the <ordinal> image" (any case, a final period
aside) and the options name different pictures. The pictures the options name are the candidates,
in MMIU's order; the answer is the one the correct option names. Pictures no option names (the
query picture of image2image_retrieval and the like) become context pictures, shown before the
candidates, which is where MMIU shows them, so the question's "the first image" still means them;
this needs them to be MMIU's first pictures. The item asks MMIU's question with its context's
instruction, in the order MMIU's own evaluation prompt puts them (question first for the tasks in
QUESTION_FIRST, context first for the rest), less the context's list of options: lad names the
candidates with its own labels, and shuffles them, so "A: the first image" would be wrong.

`output` is compared as MMIU's scorer compares answers: trimmed and case-insensitive. Questions
that cannot be used are skipped and counted per task, by reason (REASONS). Options are single
letters, so no question has more than 26 candidates, which the letter schemes can name.
"""

from __future__ import annotations

import ast
import contextlib
import re
from pathlib import Path
from typing import Any

from lad.data.items import Item
from lad.data.released import Converted, Row, Written, check_split, read_rows, write_split
from lad.errors import DataError

_ORDINALS = (
    "first", "second", "third", "fourth", "fifth", "sixth", "seventh", "eighth", "ninth",
    "tenth", "eleventh", "twelfth", "thirteenth", "fourteenth", "fifteenth", "sixteenth",
    "seventeenth", "eighteenth", "nineteenth", "twentieth",
)  # fmt: skip
_IMAGE_OPTION = re.compile(rf"the ({'|'.join(_ORDINALS)}) image", re.I)
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

NO_ANSWER = "no answer"  # output null or blank
ANSWER_NOT_AN_OPTION = "answer not an option"  # output names no option's letter
EMPTY_QUESTION = "empty question"  # neither question nor context instruction has text
OPTIONS_NOT_IMAGES = "options not images"  # an option is not "the <ordinal> image"
NOT_ONE_PER_IMAGE = "not one option per image"  # options name a picture twice or one not there
REFERENCE_NOT_FIRST = "reference pictures not first"  # unnamed pictures after a candidate
OTHER_N = "other N"  # another number of candidates than --num-candidates
MISSING_IMAGE = "missing image"  # a picture not on disk (with skip_missing)
REASONS = (
    NO_ANSWER, ANSWER_NOT_AN_OPTION, EMPTY_QUESTION, OPTIONS_NOT_IMAGES, NOT_ONE_PER_IMAGE,
    REFERENCE_NOT_FIRST, OTHER_N, MISSING_IMAGE,
)  # fmt: skip


def ordinal_image(text: str) -> int | None:
    """k for an option that reads "the <k+1-th ordinal> image" (any case, a final period aside)."""
    image = _IMAGE_OPTION.fullmatch(text.strip().rstrip(".").strip())
    return None if image is None else _ORDINALS.index(image.group(1).lower())


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
    for k, line in enumerate(lines):
        if _CHOICES.match(line.strip()):
            return "\n".join(lines[k + 1 :])
    return ""


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
        "task": str(source.get("task") or ""),
        "question": "" if source["question"] is None else str(source["question"]),
        "context": str(context),
        "options": str(options),
        "paths": _paths(source["input_image_path"], row.where),
        "output": source["output"],
    }


def _paths(value: Any, where: str) -> list[str]:
    """input_image_path as a list of strings (a list, or the text of one, as exports write)."""
    if isinstance(value, str) and value.strip().startswith("["):
        with contextlib.suppress(ValueError, SyntaxError):
            value = ast.literal_eval(value.strip())
    if not isinstance(value, list | tuple) or not all(isinstance(p, str) for p in value):
        raise DataError(f"{where}'input_image_path' must be a list of paths, got {value!r}")
    return list(value)


def _resolve(path: str, roots: list[Path]) -> Path | None:
    parts = Path(path).parts
    tails = [Path(path), Path(*parts[-3:]), Path(*parts[-2:]), Path(parts[-1])]
    for root in roots:
        for tail in tails:
            if (root / tail).is_file():
                return (root / tail).resolve()
    return None


def convert_question(
    fields: dict[str, Any], index: int, where: str, roots: list[Path], skip_missing: bool
) -> Item | str:
    """The item for one question (`index`: its position among its task's), or why it is skipped."""
    output = fields["output"]
    if output is None or not str(output).strip():
        return NO_ANSWER
    named = option_images(fields["options"])
    if named is None:
        return OPTIONS_NOT_IMAGES
    letters = [letter for letter, _ in named]
    answer_letter = str(output).strip().upper()
    if answer_letter not in letters:
        return ANSWER_NOT_AN_OPTION
    paths = fields["paths"]
    shown = [image for _, image in named]
    if len(set(letters)) != len(letters) or len(set(shown)) != len(shown) or len(shown) < 2:
        return NOT_ONE_PER_IMAGE
    if max(shown) >= len(paths):
        return NOT_ONE_PER_IMAGE
    context = [k for k in range(len(paths)) if k not in shown]
    if context != list(range(len(context))):
        return REFERENCE_NOT_FIRST
    task = fields["task"]
    asked = asked_text(task, fields["question"], fields["context"])
    if not asked:
        return EMPTY_QUESTION
    files = []
    for p in paths:
        resolved = _resolve(p, roots)
        if resolved is None:
            if skip_missing:
                return MISSING_IMAGE
            raise DataError(
                f"{where}image {p!r} is not under {' or '.join(map(str, roots))}; pass the folder "
                "MMIU's zips were extracted in with --images, or --skip-missing"
            )
        files.append(resolved)
    candidates = sorted(shown)  # MMIU's order of the pictures the options name
    answer = candidates.index(dict(named)[answer_letter])
    extra = {"source": "mmiu", "task": task, "mmiu_index": index}
    item = Item(f"{task}-{index:05d}", asked, [files[k] for k in candidates], answer, extra, asked)
    item.context_images = [files[k] for k in context]
    return item


def read_mmiu(
    path: str | Path,
    *,
    task: str | None = None,
    images_dir: str | Path | None = None,
    num_candidates: int | None = None,
    skip_missing: bool = False,
) -> tuple[str, Converted]:
    """(task, what converted and what was skipped) of one task of an MMIU question file."""
    path = Path(path)
    rows = read_rows(path)
    if not rows:
        raise DataError(f"{path}: no MMIU question in it")
    questions = [(row, flatten(row)) for row in rows]
    tasks = sorted({q["task"] for _, q in questions})
    if task is None:
        if len(tasks) > 1:
            counts = {t: sum(q["task"] == t for _, q in questions) for t in tasks}
            listed = ", ".join(f"{t} ({c})" for t, c in counts.items())
            raise DataError(f"{path} holds {len(tasks)} tasks; choose one with --task: {listed}")
        task = tasks[0]
    elif task not in tasks:
        raise DataError(f"{path}: no question of task {task!r}; its tasks: {tasks}")
    roots = [Path(images_dir)] if images_dir is not None else []
    if roots and not roots[0].is_dir():
        raise DataError(f"{roots[0]}: no such image folder")
    roots.append(path if path.is_dir() else path.parent)
    converted = Converted()
    mine = [(row, q) for row, q in questions if q["task"] == task]
    for k, (row, q) in enumerate(mine):
        made = convert_question(q, k, row.where, roots, skip_missing)
        if isinstance(made, str):
            converted.skip(task, made)
        elif num_candidates is not None and made.num_candidates != num_candidates:
            converted.skip(task, OTHER_N)
        else:
            converted.add(task, made)
    sizes = sorted({it.num_candidates for it in converted.items})
    if len(sizes) > 1:
        listed = ", ".join(
            f"N = {n} ({sum(it.num_candidates == n for it in converted.items)})" for n in sizes
        )
        raise DataError(
            f"{path}: task {task!r} has questions with different numbers of candidates ({listed}); "
            "choose one with --num-candidates"
        )
    return task, converted


def import_mmiu(
    path: str | Path,
    out: str | Path,
    *,
    task: str | None = None,
    images_dir: str | Path | None = None,
    num_candidates: int | None = None,
    items: int | None = None,
    calibration_items: int = 5,
    seed: int = 0,
    skip_missing: bool = False,
) -> tuple[str, Written]:
    """Convert one MMIU task into an items file `out`, calibration items and a summary beside it."""
    check_split(items, calibration_items)
    task, converted = read_mmiu(
        path,
        task=task,
        images_dir=images_dir,
        num_candidates=num_candidates,
        skip_missing=skip_missing,
    )
    written = write_split(
        converted,
        out,
        benchmark="mmiu",
        source=path,
        items=items,
        calibration_items=calibration_items,
        seed=seed,
    )
    return task, written
