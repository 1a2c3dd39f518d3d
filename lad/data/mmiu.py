"""MMIU's released question files (Meng et al., 2024) as lad items: the tasks whose options are the
images themselves, as in the paper's Table 5.

MMIU keeps its questions as JSON lists (one per task, `<task>/.../metadata_info.json`, and all
tasks together in `VLMEvalKit/all.json` of its repository), one object per question:

    {"task": "forensic_detection_forgerynet", "visual_input_component": ..., "source": ...,
     "options": "A: the first image\\nB: the second image\\n...", "question": "Which image is ...?",
     "context": ..., "input_image_path": ["./Low-level-semantic/<task>/<task>_0_0.jpg", ...],
     "output": "B"}

Image paths are relative to the folder MMIU was unpacked in; each is looked up under the given
image folder, then beside the question file, as written and then by file name.

A question becomes an item when its options name the images one each: every option reads
"the <ordinal> image" (any case, a final period aside) and the options name every input image
exactly once. The item asks MMIU's `question` (its `question` and `query`), its images are the
input images in their order, and its answer is the image that the correct option names. Every
other question is skipped and counted by reason:

    options not images        an option is not an image, e.g. q_bench+'s "A: Yes"
    not one option per image  the options leave an image out or name one twice, e.g.
                              image2image_retrieval, whose first image is the query
    other N                   it has another number of images than --num-candidates
    missing image             an image is not on disk (only with skip_missing; else an error)

Calibration items come from the same task, held out: a seeded choice of converted questions,
written beside the output as `*.calibration.jsonl` (as `lad data coco` does) and never among the
evaluation items.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lad.data.builders import calibration_path_for, seeded_rng
from lad.data.coco import read_json
from lad.data.items import Item, write_items
from lad.errors import DataError

_ORDINALS = (
    "first", "second", "third", "fourth", "fifth", "sixth", "seventh", "eighth", "ninth",
    "tenth", "eleventh", "twelfth", "thirteenth", "fourteenth", "fifteenth", "sixteenth",
    "seventeenth", "eighteenth", "nineteenth", "twentieth",
)  # fmt: skip
_IMAGE_OPTION = re.compile(rf"the ({'|'.join(_ORDINALS)}) image", re.I)
_OPTION_LINE = re.compile(r"([A-Z])\s*[:.]\s*(.*\S)")

OPTIONS_NOT_IMAGES = "options not images"
NOT_ONE_PER_IMAGE = "not one option per image"
OTHER_N = "other N"
MISSING_IMAGE = "missing image"


@dataclass
class MmiuResult:
    """What a conversion wrote and what it left out."""

    task: str
    items_path: Path
    calibration_path: Path | None
    items: int
    calibration_items: int
    skipped: dict[str, int] = field(default_factory=dict)


def option_images(options: str) -> list[tuple[str, int]] | None:
    """[(letter, image index)] for options that are all "the <ordinal> image", else None."""
    named = []
    for line in options.splitlines():
        if not line.strip():
            continue
        match = _OPTION_LINE.fullmatch(line.strip())
        if match is None:
            return None
        text = match.group(2).rstrip(".").strip()
        image = _IMAGE_OPTION.fullmatch(text)
        if image is None:
            return None
        named.append((match.group(1), _ORDINALS.index(image.group(1).lower())))
    return named or None


def _field(entry: dict, key: str, kind: type, where: str) -> Any:
    if key not in entry:
        raise DataError(f"{where}missing key {key!r}")
    value = entry[key]
    if not isinstance(value, kind):
        raise DataError(f"{where}{key!r} must be a {kind.__name__}, got {value!r}")
    return value


def _resolve(path: str, roots: list[Path]) -> Path | None:
    for root in roots:
        for candidate in (root / path, root / Path(path).name):
            if candidate.is_file():
                return candidate.resolve()
    return None


def _convert(
    entry: dict, index: int, where: str, roots: list[Path], skip_missing: bool
) -> Item | str:
    """The item for one question of the task, or the reason it is skipped."""
    question = _field(entry, "question", str, where)
    options = _field(entry, "options", str, where)
    paths = _field(entry, "input_image_path", list, where)
    output = _field(entry, "output", str, where).strip()
    if not all(isinstance(p, str) for p in paths):
        raise DataError(f"{where}'input_image_path' must be a list of paths")
    named = option_images(options)
    if named is None:
        return OPTIONS_NOT_IMAGES
    letters = [letter for letter, _ in named]
    if len(set(letters)) != len(letters):
        raise DataError(f"{where}option letters repeat in {options!r}")
    if output not in letters:
        raise DataError(f"{where}'output' {output!r} is not one of the options {letters}")
    if sorted(image for _, image in named) != list(range(len(paths))) or len(paths) < 2:
        return NOT_ONE_PER_IMAGE
    images = []
    for p in paths:
        resolved = _resolve(p, roots)
        if resolved is None:
            if skip_missing:
                return MISSING_IMAGE
            raise DataError(
                f"{where}image {p!r} is not under {' or '.join(map(str, roots))}; pass the MMIU "
                "folder with --images, or --skip-missing"
            )
        images.append(resolved)
    answer = dict(named)[output]
    task = str(entry.get("task", ""))
    extra = {"source": "mmiu", "task": task, "mmiu_index": index}
    return Item(f"{task}-{index:05d}", question.strip(), images, answer, extra, question.strip())


def read_mmiu(
    path: str | Path,
    *,
    task: str | None = None,
    images_dir: str | Path | None = None,
    num_candidates: int | None = None,
    skip_missing: bool = False,
) -> tuple[str, list[Item], Counter[str]]:
    """(task, items, skipped reasons) of one task of an MMIU question file, in file order."""
    path = Path(path)
    entries = read_json(path)
    if not isinstance(entries, list) or not entries:
        raise DataError(f"{path}: expected a non-empty JSON list of MMIU questions")
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict):
            raise DataError(f"{path}: entry {i}: expected an object, got {type(entry).__name__}")
    tasks = Counter(str(e.get("task", "")) for e in entries)
    if task is None:
        if len(tasks) > 1:
            listed = ", ".join(f"{t} ({c})" for t, c in sorted(tasks.items()))
            raise DataError(f"{path} holds {len(tasks)} tasks; choose one with --task: {listed}")
        task = next(iter(tasks))
    elif task not in tasks:
        raise DataError(f"{path}: no question of task {task!r}; its tasks: {sorted(tasks)}")
    roots = [Path(images_dir)] if images_dir is not None else []
    if roots and not roots[0].is_dir():
        raise DataError(f"{roots[0]}: no such image folder")
    roots.append(path.parent)
    items: list[Item] = []
    skipped: Counter[str] = Counter()
    mine = [(i, e) for i, e in enumerate(entries) if str(e.get("task", "")) == task]
    for k, (i, entry) in enumerate(mine):
        made = _convert(entry, k, f"{path}: entry {i}: ", roots, skip_missing)
        if isinstance(made, str):
            skipped[made] += 1
        elif num_candidates is not None and made.num_candidates != num_candidates:
            skipped[OTHER_N] += 1
        else:
            items.append(made)
    sizes = Counter(it.num_candidates for it in items)
    if len(sizes) > 1:
        listed = ", ".join(f"N = {n} ({c})" for n, c in sorted(sizes.items()))
        raise DataError(
            f"{path}: task {task!r} has questions with different numbers of images ({listed}); "
            "choose one with --num-candidates"
        )
    return task, items, skipped


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
) -> MmiuResult:
    """Convert one MMIU task into an items file `out` and calibration items beside it."""
    if calibration_items < 0 or (items is not None and items < 1):
        raise DataError("--items must be at least 1 and --calibration-items at least 0")
    task, converted, skipped = read_mmiu(
        path,
        task=task,
        images_dir=images_dir,
        num_candidates=num_candidates,
        skip_missing=skip_missing,
    )
    if len(converted) <= calibration_items:
        reasons = ", ".join(f"{r}: {c}" for r, c in sorted(skipped.items())) or "none skipped"
        raise DataError(
            f"{path}: {len(converted)} questions of task {task!r} have one image per option "
            f"({reasons}), too few to hold out --calibration-items {calibration_items} and "
            "evaluate on the rest"
        )
    rng = seeded_rng(seed, "mmiu", task)
    held = set(rng.choice(len(converted), calibration_items, replace=False).tolist())
    calibration = [it for k, it in enumerate(converted) if k in held]
    evaluation = [it for k, it in enumerate(converted) if k not in held][:items]
    out = Path(out)
    write_items(out, evaluation)
    cal_path = None
    if calibration:
        cal_path = calibration_path_for(out)
        write_items(cal_path, calibration)
    return MmiuResult(
        task, out, cal_path, len(evaluation), len(calibration), dict(sorted(skipped.items()))
    )
