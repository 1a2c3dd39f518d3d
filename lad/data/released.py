"""What the converters of released benchmarks share (`lad data mmiu|muirbench|blink`): each row of
a question file (lad.data.questions) through its benchmark's rule, its pictures written out by
content or found inside the dataset folder, the held-out calibration split (lad.data.heldout),
and the summary of what was converted and skipped per task, (task, N) cell and reason.
"""

from __future__ import annotations

import contextlib
import json
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from itertools import takewhile
from pathlib import Path
from typing import Any

from lad.data.builders import check_split, seeded_rng, write_split_items
from lad.data.heldout import cell_lines, cell_rows, held_out, skipped_text
from lad.data.items import Item, ItemRuleError, check_item, item_object
from lad.data.questions import Benchmark, Questions, Row, short_repr
from lad.data.rules import (
    DUPLICATE_ID,
    MISSING_IMAGE,
    OTHER_N,
    OUTSIDE_ROOT,
    UNDECODED,
    Choice,
)
from lad.errors import DataError, LadError
from lad.io.files import (
    check_output_dir,
    content_path,
    inside,
    outside,
    remove_stale_temporaries,
    write_once,
    write_text,
)
from lad.io.images import UndecodedPicture, picture_suffix

# ----------------------------------------------------------------------------- pictures


def picture_bytes(value: Any, where: str) -> bytes:
    """The encoded bytes of a `datasets` Image cell ({"bytes", "path"}); an empty one is refused."""
    if value is None:
        raise DataError(f"{where}a picture the question shows is empty")
    data = value.get("bytes") if isinstance(value, dict) else value
    if isinstance(data, bytes | bytearray):
        return bytes(data)
    raise DataError(f"{where}expected a picture stored as bytes, got {short_repr(value)[:60]}")


class _Pictures:
    """Where a conversion's pictures are: embedded bytes written to `folder` (--pictures, else
    the -pictures sibling of `out`, the items file to be), each named by its content
    (lad.io.files.content_path), or files the rows name under `roots` (--images, then the question
    file's folder; lad.io.files.inside). `base`: the folder of `out` (None: of the question file),
    which picture paths are written relative to. `undo` removes what this conversion wrote, and
    the folders it made for them."""

    def __init__(
        self, benchmark: Benchmark, questions: Questions, options: Options, out: str | Path | None
    ) -> None:
        self.folder: Path | None = None
        self.roots: list[Path] = []
        self.skip_missing = options.skip_missing
        self.pending: dict[Path, bytes] = {}
        self.created: list[Path] = []
        self.new_folders: list[Path] = []  # deepest first
        beside = Path(out if out is not None else questions.path)  # the items file to be
        if benchmark.embedded:
            self.folder = folder = pictures_folder(beside, options.pictures)
            check_output_dir(folder, "--pictures")
            self.new_folders = list(takewhile(lambda p: not p.exists(), [folder, *folder.parents]))
            if folder.is_dir():
                remove_stale_temporaries(folder)
        else:
            roots = [Path(options.images)] if options.images is not None else []
            if roots and not roots[0].is_dir():
                raise DataError(f"{roots[0]}: no such image folder")
            path = questions.path
            self.roots = [*roots, path if path.is_dir() else path.parent]
        self.base = beside.absolute().parent.resolve()

    def locate(self, refs: list[Any], where: str) -> list[Path] | str:
        """The files of a question's pictures (given in the order its row lists them), or why
        it is skipped (lad.data.rules)."""
        if self.folder is not None:
            found = []
            self.pending = {}  # a question skipped after `locate` writes nothing
            for cell in refs:
                data = picture_bytes(cell, where)
                try:
                    suffix = picture_suffix(data, where)
                except UndecodedPicture:
                    return UNDECODED  # that question alone: skipped and counted
                path = content_path(self.folder, data, suffix)
                self.pending[path] = data
                found.append(path)
            return found
        paths = [self._on_disk(p, where) for p in refs]
        reasons = [p for p in paths if isinstance(p, str)]
        return reasons[0] if reasons else [p for p in paths if isinstance(p, Path)]

    def _on_disk(self, path: str, where: str) -> Path | str:
        """A picture the row names, looked up under each root as written, then by its last
        three and two parts and its file name (older releases' layouts); never outside a root."""
        parts = Path(path).parts
        tails = [path, *(str(Path(*parts[-k:])) for k in (3, 2, 1))] if parts else []
        escaped = False
        for root in self.roots:
            for tail in tails:
                found = inside(root, tail)
                if found is not None:
                    return found
                escaped = escaped or outside(root, tail)
        if escaped:
            return OUTSIDE_ROOT
        if self.skip_missing:
            return MISSING_IMAGE
        raise DataError(
            f"{where}image {path!r} is not under {' or '.join(map(str, self.roots))}; pass the "
            "folder the benchmark's pictures were extracted in with --images, or --skip-missing"
        )

    def commit(self, files: list[Path]) -> None:
        for path in files:
            data = self.pending.pop(path, None)
            if data is not None and write_once(path, data, DataError):
                self.created.append(path)

    def undo(self) -> None:
        for path in self.created:
            with contextlib.suppress(OSError):
                path.unlink()
        for folder in self.new_folders:
            with contextlib.suppress(OSError):
                folder.rmdir()


# ----------------------------------------------------------------------------- output


@dataclass
class Converted:
    """One conversion: the items made (and the (task, N) cell of each) and, per task and per
    cell, the questions skipped per reason (a cell's N is None when it was never known)."""

    items: list[Item] = field(default_factory=list)
    skipped: dict[str, Counter[str]] = field(default_factory=dict)
    converted: Counter[str] = field(default_factory=Counter)
    cells: list[tuple[str, int]] = field(default_factory=list)
    cell_skipped: dict[tuple[str, int | None], Counter[str]] = field(default_factory=dict)

    def skip(self, task: str, reason: str, num_candidates: int | None = None) -> None:
        self.skipped.setdefault(task, Counter())[reason] += 1
        self.cell_skipped.setdefault((task, num_candidates), Counter())[reason] += 1

    def add(self, task: str, item: Item) -> None:
        self.items.append(item)
        self.converted[task] += 1
        self.cells.append((task, item.num_candidates))

    def tasks(self) -> list[str]:
        return sorted(set(self.converted) | set(self.skipped))


@dataclass
class Written:
    items_path: Path
    calibration_path: Path | None
    summary_path: Path
    summary: dict[str, Any]  # its "items" and "calibration_items": how many were written


def collect(
    benchmark: Benchmark,
    questions: Questions,
    pictures: _Pictures,
    task: str | None,
    options: Options,
) -> Converted:
    """Every row of `task` (None: of every task) through the benchmark's rule, keeping the
    questions of `options.num_candidates` candidates (None: of every N; of the one N there must
    be when a conversion is of one task) whose item the items reader accepts and whose id no
    earlier question has; each item keeps its task under "task" (lad eval's cells)."""
    converted = Converted()
    seen: set[str] = set()
    for row in questions.rows(benchmark, task):
        made = benchmark.choose(row)
        name = made.task if isinstance(made, Choice) else benchmark.task(row.fields)
        why = _why_skipped(made, row, pictures, options.num_candidates, seen)
        if isinstance(why, str):
            converted.skip(name, why, made.num_candidates if isinstance(made, Choice) else None)
        else:
            seen.add(why.id)
            if name and "task" not in why.extra:
                why.extra = {**why.extra, "task": name}
            converted.add(name, why)
    sizes = Counter(it.num_candidates for it in converted.items)
    if len(sizes) > 1 and benchmark.one_task and not options.whole:
        listed = ", ".join(f"N = {n} ({c})" for n, c in sorted(sizes.items()))
        raise DataError(  # one task: read resolved it
            f"{questions.path}: task {task!r} has questions with different numbers of candidates "
            f"({listed}); choose one with --num-candidates"
        )
    return converted


def _why_skipped(
    made: Choice | str,
    row: Row,
    pictures: _Pictures,
    num_candidates: int | None,
    seen: set[str],
) -> Item | str:
    """The item of a row's choice, its pictures in place; or why it is skipped."""
    if isinstance(made, str):
        return made
    if made.unanswered is not None:
        return made.unanswered
    if num_candidates is not None and made.num_candidates != num_candidates:
        return OTHER_N
    if made.item in seen:
        return DUPLICATE_ID
    files = pictures.locate([*made.context, *made.candidates], row.where)
    if isinstance(files, str):
        return files
    context, candidates = files[: len(made.context)], files[len(made.context) :]
    assert made.answer is not None  # answered
    item = Item(made.item, made.question, candidates, made.answer, made.extra, made.question)
    item.context_images = context
    try:  # what lad writes, its own reader reads
        check_item(item_object(item, pictures.base), row.where)
    except ItemRuleError as e:
        return e.reason
    pictures.commit(files)
    return item


def write_split(
    converted: Converted, out: str | Path, benchmark: str, source: str | Path, options: Options
) -> Written:
    """Hold out `options.calibration_items` converted questions of each N (a seeded choice across
    its tasks, lad.data.heldout) to OUT's .calibration.jsonl sibling, write the first
    `options.items` of the rest to OUT, and the summary (per task, and per (task, N) cell)."""
    made, calibration_items = converted.items, options.calibration_items
    if len(made) <= calibration_items:
        total = sum(converted.skipped.values(), Counter())
        reasons = ", ".join(f"{r}: {c}" for r, c in sorted(total.items())) or "none skipped"
        raise DataError(
            f"{source}: {len(made)} questions converted ({reasons}), too few to hold "
            f"out --calibration-items {calibration_items} and evaluate on the rest"
        )
    rng = seeded_rng(options.seed, benchmark, *converted.tasks())
    held = held_out(converted.cells, calibration_items, rng, source)
    calibration = [it for k, it in enumerate(made) if k in held]
    kept = [k for k in range(len(made)) if k not in held][: options.items]
    evaluation = [made[k] for k in kept]
    out = Path(out)
    cal_path = write_split_items(out, evaluation, calibration)
    summary = {
        "benchmark": benchmark,
        "source": str(source),
        "items": len(evaluation),
        "calibration_items": len(calibration),
        "tasks": {
            task: {
                "converted": converted.converted[task],
                "skipped": dict(sorted(converted.skipped.get(task, Counter()).items())),
            }
            for task in converted.tasks()
        },
        "cells": cell_rows(converted.cells, held, set(kept), converted.cell_skipped),
    }
    summary_path = summary_path_for(out)
    write_text(summary_path, json.dumps(summary, indent=1) + "\n")
    return Written(out, cal_path, summary_path, summary)


def summary_path_for(out: Path) -> Path:
    """`mmiu.jsonl` -> `mmiu.summary.json`: what was converted and skipped, per task and cell."""
    return out.with_name(out.stem + ".summary.json")


def pictures_folder(out: str | Path, pictures: str | Path | None) -> Path:
    """Where a converter writes the pictures it extracts: `pictures`, else OUT's -pictures
    sibling (`x.jsonl` -> `x-pictures/`)."""
    out = Path(out)
    return Path(pictures) if pictures is not None else out.with_name(out.stem + "-pictures")


@dataclass
class Options:
    """How `convert` converts (each a `lad data` flag). `images`: the folder a benchmark's picture
    files were extracted in (its question file's own folder is searched after it); `task` None:
    every task, or a one-task benchmark's only one; `num_candidates` None: every N (MMIU: the one
    N there must be); `items` None: all; `whole`: every task and N even of a benchmark whose
    library readers take one task (MMIU's), as `lad data` converts a whole benchmark."""

    pictures: str | Path | None = None
    images: str | Path | None = None
    task: str | None = None
    num_candidates: int | None = None
    items: int | None = None
    calibration_items: int = 5
    seed: int = 0
    skip_missing: bool = False
    whole: bool = False


def read(
    benchmark: Benchmark, path: str | Path, options: Options, out: str | Path | None = None
) -> tuple[str | None, Converted, _Pictures]:
    """(the task converted, what converted and what was skipped, the pictures placed) of a
    benchmark's question file; `out` (the items file to be) says where pictures go."""
    questions = Questions(path)
    tasks = questions.tasks(benchmark)
    if not tasks:
        raise DataError(f"{path}: no {benchmark.title} question in it")
    task = options.task
    if task is None and benchmark.one_task and not options.whole:
        if len(tasks) > 1:
            listed = ", ".join(f"{t} ({c})" for t, c in sorted(tasks.items()))
            raise DataError(f"{path} holds {len(tasks)} tasks; choose one with --task: {listed}")
        task = next(iter(tasks))
    elif task is not None and task not in tasks:
        raise DataError(f"{path}: no question of task {task!r}; its tasks: {sorted(tasks)}")
    pictures = _Pictures(benchmark, questions, options, out)
    try:
        converted = collect(benchmark, questions, pictures, task, options)
    except LadError:  # a refusal; an interrupted conversion keeps what it wrote (a rerun reuses it)
        pictures.undo()
        raise
    return task, converted, pictures


def convert(
    benchmark: Benchmark, path: str | Path, out: str | Path, options: Options | None = None
) -> tuple[str | None, Written]:
    """Convert a benchmark's question file (a file, or a folder searched for *.parquet) into an
    items file `out`, calibration items and a summary beside it; returns the task converted
    (None: every task) and what was written. A refusal leaves no file of its own behind."""
    options = options or Options()
    check_split(options.items, options.calibration_items)
    task, converted, pictures = read(benchmark, path, options, out)
    try:
        written = write_split(converted, out, benchmark.name, path, options)
    except LadError:
        pictures.undo()
        raise
    return task, written


def summary_lines(written: Written, *, per_task: bool = True) -> Iterator[str]:
    """What `lad data` prints: the files written, then per task (per (task, N) cell where the
    items have several N) what was converted and skipped (unless not `per_task`)."""
    made = written.summary  # what was converted, held out and written
    yield f"Wrote {made['items']} items to {written.items_path}"
    if written.calibration_path is not None:
        yield f"Wrote {made['calibration_items']} calibration items to {written.calibration_path}"
    rows = made["cells"]
    if per_task and len({r["num_candidates"] for r in rows if r["converted"]}) > 1:
        yield from cell_lines(rows)
        per_task = False
    for task, counts in made["tasks"].items() if per_task else ():
        tail = skipped_text(counts["skipped"])
        yield f"  {task}: converted {counts['converted']}" + (f"; {tail}" if tail else "")
    yield f"Summary written to {written.summary_path}"
