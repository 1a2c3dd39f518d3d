"""What the converters of released benchmarks share (`lad data mmiu|muirbench|blink`): reading
their question files (parquet, JSON Lines, JSON), pictures embedded as bytes written out to files,
the held-out calibration split, and the summary of what was converted and skipped, per task and
reason, printed and written beside the output (`<out stem>.summary.json`).
"""

from __future__ import annotations

import contextlib
import json
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lad.data.builders import calibration_path_for, seeded_rng
from lad.data.items import Item, ItemRuleError, check_item, item_object, write_items
from lad.data.rules import DUPLICATE_ID, MISSING_IMAGE, OTHER_N, OUTSIDE_ROOT, Choice
from lad.errors import DataError, LadError
from lad.files import (
    check_output_dir,
    content_path,
    inside,
    loads_json,
    note_input,
    outside,
    read_text,
    remove_stale_temporaries,
    write_once,
    write_text,
)
from lad.images import picture_suffix


@dataclass
class Row:
    """One question as its file holds it, and where: `where` names the file and row for errors;
    `index` is its position among its task's rows (MMIU numbers its items by it)."""

    fields: dict[str, Any]
    where: str
    index: int = 0


@dataclass(frozen=True)
class Benchmark:
    """A released benchmark `lad data` converts: its module's rule and how its files are laid out.
    A new benchmark is one module defining one of these, registered in lad.data.benchmarks.

    name:       the command (`lad data <name>`) and the summary's "benchmark".
    title:      how its docs name it.
    choose:     the module's rule, a row to a Choice or the reason it is skipped (lad.data.rules).
    task_field: the field naming a row's task: rows of other tasks are passed over before any
                picture of theirs is decoded.
    embedded:   True when its pictures are bytes in the rows (written out to a pictures folder);
                False when the rows name picture files under the dataset folder.
    one_task:   a conversion is of one task (a file of several needs --task).
    hub:        the hub dataset (for --help), None when it is not one.
    example:    a command line for --help.
    harness_keys: the keys an lmms-eval document of its task has (lad.harness.adapters; empty:
                no adapter).
    task_of:    a row's task from its fields (default: the task_field's value).
    help:       the command's description (--help).
    files:      the question files it reads, for --help (rows that name picture files).
    """

    name: str
    title: str
    choose: Callable[[Row], Choice | str]
    task_field: str
    embedded: bool
    one_task: bool = False
    hub: str | None = None
    example: str = ""
    harness_keys: tuple[str, ...] = ()
    task_of: Callable[[dict[str, Any]], str] | None = None
    help: str = ""
    files: str = ""

    def task(self, fields: dict[str, Any]) -> str:
        if self.task_of is not None:
            return self.task_of(fields)
        return str(fields.get(self.task_field) or "")


HUB_HELP = (
    "Convert {title} as published on the hub ({hub}: its parquet files, downloaded by you) into "
    "items, for the questions whose options are pictures; the question's own pictures become "
    "context pictures. Pictures are written out to a folder, each named by its content; other "
    "questions are skipped and counted per reason in OUT's .summary.json sibling."
)


class Questions:
    """A question file, or every .parquet file below a folder (sorted by path, each file once
    however many names it has), read row by row: Apache Parquet a row group at a time (the task
    column first, so rows of other tasks are never decoded), JSON Lines (`datasets`' to_json)
    or a JSON list of objects."""

    BATCH_ROWS = 16  # rows decoded at once: a few pictures each

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        if self.path.is_dir():
            self.files = _distinct(sorted(self.path.rglob("*.parquet")))
            if not self.files:
                raise DataError(f"{self.path}: no .parquet file in this folder or below it")
        elif self.path.is_file():
            self.files = [self.path]
        else:
            raise DataError(f"{self.path}: no such question file")
        self._json: list[Row] | None = None
        if not self._parquet(self.files[0]):
            self._json = _json_rows(self.path)
        for f in self.files:
            note_input(f)

    @staticmethod
    def _parquet(path: Path) -> bool:
        with path.open("rb") as f:
            return f.read(4) == b"PAR1"

    def tasks(self, benchmark: Benchmark) -> Counter[str]:
        """How many questions each task has."""
        if self._json is not None:
            return Counter(benchmark.task(row.fields) for row in self._json)
        counts: Counter[str] = Counter()
        for path in self.files:
            pf = _open_parquet(path)
            has = benchmark.task_field in pf.schema_arrow.names
            if not has and benchmark.task_of is None:
                raise DataError(
                    f"{path}: no column {benchmark.task_field!r}; is this "
                    f"{benchmark.title}'s own file?"
                )
            for group in range(pf.metadata.num_row_groups):
                table = _read_group(pf, path, group, [benchmark.task_field] if has else None)
                counts.update(benchmark.task(r) for r in table.to_pylist())
        return counts

    def rows(self, benchmark: Benchmark, task: str | None) -> Iterator[Row]:
        """The rows of `task` (None: every row), in file order, each knowing its index among its
        task's rows."""
        seen: Counter[str] = Counter()
        for row in self._json if self._json is not None else self._parquet_rows(benchmark, task):
            name = benchmark.task(row.fields)
            if task is None or name == task:
                yield Row(row.fields, row.where, seen[name])
                seen[name] += 1

    def _parquet_rows(self, benchmark: Benchmark, task: str | None) -> Iterator[Row]:
        """A row group at a time (its task column first: a group without the task is never
        read further), handed out BATCH_ROWS rows at a time."""
        column = benchmark.task_field
        for path in self.files:
            pf = _open_parquet(path)
            start = 0
            for group in range(pf.metadata.num_row_groups):
                size = pf.metadata.row_group(group).num_rows
                keep = list(range(size))
                if task is not None and column in pf.schema_arrow.names:
                    names = _read_group(pf, path, group, [column]).column(column).to_pylist()
                    keep = [k for k, name in enumerate(names) if str(name or "") == task]
                if keep:
                    table = _read_group(pf, path, group, None)
                    for at in range(0, len(keep), self.BATCH_ROWS):
                        rows = keep[at : at + self.BATCH_ROWS]
                        for k, obj in zip(rows, table.take(rows).to_pylist(), strict=True):
                            yield Row(obj, f"{path}: row {start + k}: ")
                start += size


def _distinct(files: list[Path]) -> list[Path]:
    """Each file once: a symlink or hard link to a file already listed is the same file."""
    seen: set[tuple[int, int]] = set()
    out = []
    for f in files:
        try:
            st = f.stat()
        except OSError:
            continue
        if (st.st_dev, st.st_ino) not in seen:
            seen.add((st.st_dev, st.st_ino))
            out.append(f)
    return out


def _open_parquet(path: Path) -> Any:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        return pq.ParquetFile(path)
    except (pa.ArrowException, OSError) as e:
        raise DataError(f"{path}: cannot read it as Parquet ({e})") from None


def _read_group(pf: Any, path: Path, group: int, columns: list[str] | None) -> Any:
    import pyarrow as pa

    try:
        return pf.read_row_group(group, columns=columns, use_threads=False)
    except (pa.ArrowException, OSError) as e:
        raise DataError(f"{path}: cannot read it as Parquet ({e})") from None


def _json_rows(path: Path) -> list[Row]:
    text = read_text(path, DataError, "JSON question file")  # UTF-8 only (lad.files' one rule)
    if text.lstrip().startswith("["):
        try:
            rows = loads_json(text, DataError, f"{path}: ")
        except json.JSONDecodeError as e:
            raise DataError(f"{path}: not valid JSON ({e.msg}, line {e.lineno})") from None
        if not isinstance(rows, list):
            raise DataError(f"{path}: expected a JSON list of questions")
        return [_row(obj, f"{path}: entry {i}: ") for i, obj in enumerate(rows)]
    return [
        _row(_json_line(line, path, n), f"{path}:{n}: ")
        for n, line in enumerate(text.splitlines(), 1)
        if line.strip()
    ]


def _json_line(line: str, path: Path, n: int) -> Any:
    try:
        return loads_json(line, DataError, f"{path}:{n}: ")
    except json.JSONDecodeError as e:
        raise DataError(
            f"{path}:{n}: not valid JSON ({e.msg}); expected a JSON list of questions, one "
            "question per line (JSON Lines), or a .parquet file"
        ) from None


def _row(obj: Any, where: str) -> Row:
    if not isinstance(obj, dict):
        raise DataError(f"{where}expected a JSON object per question, got {type(obj).__name__}")
    return Row(obj, where)


def require(row: Row, key: str) -> Any:
    """The field `key` of `row`, which the benchmark's schema always has (else an error)."""
    if key not in row.fields:
        raise DataError(f"{row.where}missing field {key!r}; is this the benchmark's own file?")
    return row.fields[key]


def strings(row: Row, key: str) -> list[str]:
    """The field `key` of `row`, a list of strings (else an error naming the row)."""
    value = require(row, key)
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise DataError(f"{row.where}{key!r} must be a list of strings, got {_short(value)}")
    return value


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


# ----------------------------------------------------------------------------- pictures


def picture_bytes(value: Any, where: str) -> bytes | None:
    """The encoded bytes of a `datasets` Image cell ({"bytes", "path"}), None when empty."""
    if value is None:
        return None
    if isinstance(value, dict) and isinstance(value.get("bytes"), bytes | bytearray):
        return bytes(value["bytes"])
    if isinstance(value, bytes | bytearray):
        return bytes(value)
    raise DataError(f"{where}expected a picture stored as bytes, got {_short(value)[:60]}")


class _Pictures:
    """Where a conversion's pictures are: embedded bytes written to `folder`, each named by its
    content (lad.files.content_path), or files the rows name under `roots` (lad.files.inside).
    `undo` removes what this conversion wrote, and the folders it made for them."""

    def __init__(self, folder: Path | None, roots: list[Path], skip_missing: bool) -> None:
        self.folder, self.roots, self.skip_missing = folder, roots, skip_missing
        self.pending: dict[Path, bytes] = {}
        self.created: list[Path] = []
        self.new_folders: list[Path] = []
        if folder is not None:
            probe = folder
            while not probe.exists() and probe.parent != probe:
                self.new_folders.append(probe)
                probe = probe.parent
            if folder.is_dir():
                remove_stale_temporaries(folder)

    def locate(self, refs: list[Any], where: str) -> list[Path] | str:
        """The files of a question's pictures (given in the order its row lists them), or why
        it is skipped (lad.data.rules)."""
        if self.folder is not None:
            found = []
            for cell in refs:
                data = picture_bytes(cell, where)
                if data is None:
                    raise DataError(f"{where}a picture the question shows is empty")
                path = content_path(self.folder, data, picture_suffix(data, where))
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
        self.pending.clear()

    def undo(self) -> None:
        for path in self.created:
            with contextlib.suppress(OSError):
                path.unlink()
        for folder in self.new_folders:  # deepest first
            with contextlib.suppress(OSError):
                folder.rmdir()


# ----------------------------------------------------------------------------- output


@dataclass
class Converted:
    """One conversion: the items made and, per task, the questions skipped per reason."""

    items: list[Item] = field(default_factory=list)
    skipped: dict[str, Counter[str]] = field(default_factory=dict)
    converted: Counter[str] = field(default_factory=Counter)

    def skip(self, task: str, reason: str) -> None:
        self.skipped.setdefault(task, Counter())[reason] += 1

    def add(self, task: str, item: Item) -> None:
        self.items.append(item)
        self.converted[task] += 1

    def tasks(self) -> list[str]:
        return sorted(set(self.converted) | set(self.skipped))


@dataclass
class Written:
    """What a conversion wrote."""

    items_path: Path
    calibration_path: Path | None
    summary_path: Path
    items: int
    calibration_items: int
    summary: dict[str, Any]


def collect(
    benchmark: Benchmark,
    questions: Questions,
    pictures: _Pictures,
    *,
    task: str | None,
    num_candidates: int | None,
    base: Path,
) -> Converted:
    """Every row of `task` (None: of every task) through the benchmark's rule, keeping the
    questions of `num_candidates` candidates (None: of the one N there is) whose item the items
    reader accepts and whose id no earlier question has; `base`: the output's folder."""
    converted = Converted()
    seen: set[str] = set()
    for row in questions.rows(benchmark, task):
        made = benchmark.choose(row)
        name = made.task if isinstance(made, Choice) else benchmark.task(row.fields)
        why = _why_skipped(made, row, pictures, num_candidates, seen, base)
        if isinstance(why, str):
            converted.skip(name, why)
        else:
            seen.add(why.id)
            converted.add(name, why)
    sizes = Counter(it.num_candidates for it in converted.items)
    if len(sizes) > 1:
        listed = ", ".join(f"N = {n} ({c})" for n, c in sorted(sizes.items()))
        which = (
            "the questions converted have" if task is None else f"task {task!r} has questions with"
        )
        also = " (and a task with --task)" if task is None else ""
        raise DataError(
            f"{questions.path}: {which} different numbers of candidates ({listed}); "
            f"choose one with --num-candidates{also}"
        )
    return converted


def _why_skipped(
    made: Choice | str,
    row: Row,
    pictures: _Pictures,
    num_candidates: int | None,
    seen: set[str],
    base: Path,
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
        check_item(item_object(item, base), row.where)
    except ItemRuleError as e:
        return e.reason
    pictures.commit(files)
    return item


def check_split(items: int | None, calibration_items: int) -> None:
    if calibration_items < 0 or (items is not None and items < 1):
        raise DataError("--items must be at least 1 and --calibration-items at least 0")


def write_split(
    converted: Converted,
    out: str | Path,
    *,
    benchmark: str,
    source: str | Path,
    items: int | None,
    calibration_items: int,
    seed: int,
) -> Written:
    """Hold out `calibration_items` converted questions (a seeded choice) to OUT's
    .calibration.jsonl sibling, write the first `items` of the rest to OUT, and the summary."""
    made = converted.items
    if len(made) <= calibration_items:
        raise DataError(
            f"{source}: {len(made)} questions converted ({_reasons(converted)}), too few to hold "
            f"out --calibration-items {calibration_items} and evaluate on the rest"
        )
    rng = seeded_rng(seed, benchmark, *converted.tasks())
    held = set(rng.choice(len(made), calibration_items, replace=False).tolist())
    calibration = [it for k, it in enumerate(made) if k in held]
    evaluation = [it for k, it in enumerate(made) if k not in held][:items]
    out = Path(out)
    write_items(out, evaluation)
    cal_path = None
    if calibration:
        cal_path = calibration_path_for(out)
        write_items(cal_path, calibration)
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
    }
    summary_path = out.with_name(out.stem + ".summary.json")
    write_text(summary_path, json.dumps(summary, indent=1) + "\n")
    return Written(out, cal_path, summary_path, len(evaluation), len(calibration), summary)


def pictures_folder(out: str | Path, pictures: str | Path | None) -> Path:
    """Where a converter writes the pictures it extracts: `pictures`, else OUT's -pictures
    sibling (`x.jsonl` -> `x-pictures/`)."""
    out = Path(out)
    return Path(pictures) if pictures is not None else out.with_name(out.stem + "-pictures")


@dataclass
class Options:
    """How `convert` converts (each a `lad data` flag).

    pictures: the folder embedded pictures are written to (default: OUT's -pictures sibling).
    images:   the folder the benchmark's picture files were extracted in (rows that name files;
              the question file's own folder is searched after it).
    task:     the task to convert (None: every task, or the only one of a one-task benchmark).
    num_candidates: keep only the questions of this N (None: the one N there must be).
    items:    evaluation items written (None: all); calibration_items held out; seed of that.
    skip_missing: skip a question whose picture file is missing (else an error).
    """

    pictures: str | Path | None = None
    images: str | Path | None = None
    task: str | None = None
    num_candidates: int | None = None
    items: int | None = None
    calibration_items: int = 5
    seed: int = 0
    skip_missing: bool = False


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
    if task is None and benchmark.one_task:
        if len(tasks) > 1:
            listed = ", ".join(f"{t} ({c})" for t, c in sorted(tasks.items()))
            raise DataError(f"{path} holds {len(tasks)} tasks; choose one with --task: {listed}")
        task = next(iter(tasks))
    elif task is not None and task not in tasks:
        raise DataError(f"{path}: no question of task {task!r}; its tasks: {sorted(tasks)}")
    base = Path(out if out is not None else path).absolute().parent
    pictures = _Pictures(*_places(benchmark, questions, options, out), options.skip_missing)
    try:
        converted = collect(
            benchmark,
            questions,
            pictures,
            task=task,
            num_candidates=options.num_candidates,
            base=base.resolve(),
        )
    except BaseException:
        pictures.undo()
        raise
    return task, converted, pictures


def _places(
    benchmark: Benchmark, questions: Questions, options: Options, out: str | Path | None
) -> tuple[Path | None, list[Path]]:
    """(the pictures folder, None where the rows name files; the folders those files may be in)."""
    if benchmark.embedded:
        where = out if out is not None else questions.path
        folder = pictures_folder(where, options.pictures)
        check_output_dir(folder, "--pictures" if options.pictures is not None else "--out")
        return folder, []
    roots = [Path(options.images)] if options.images is not None else []
    if roots and not roots[0].is_dir():
        raise DataError(f"{roots[0]}: no such image folder")
    path = questions.path
    return None, [*roots, path if path.is_dir() else path.parent]


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
        written = write_split(
            converted,
            out,
            benchmark=benchmark.name,
            source=path,
            items=options.items,
            calibration_items=options.calibration_items,
            seed=options.seed,
        )
    except LadError:
        pictures.undo()
        raise
    return task, written


def _reasons(converted: Converted) -> str:
    total: Counter[str] = Counter()
    for counts in converted.skipped.values():
        total.update(counts)
    return ", ".join(f"{r}: {c}" for r, c in sorted(total.items())) or "none skipped"


def summary_lines(written: Written, *, per_task: bool = True) -> Iterator[str]:
    """What `lad data` prints: the files written, then per task what was converted and skipped
    (unless not `per_task`)."""
    yield f"Wrote {written.items} items to {written.items_path}"
    if written.calibration_path is not None:
        yield f"Wrote {written.calibration_items} calibration items to {written.calibration_path}"
    for task, counts in written.summary["tasks"].items() if per_task else ():
        skipped = counts["skipped"]
        reasons = ", ".join(f"{r}: {c}" for r, c in skipped.items())
        tail = f"; skipped {sum(skipped.values())} ({reasons})" if skipped else ""
        yield f"  {task}: converted {counts['converted']}{tail}"
    yield f"Summary written to {written.summary_path}"
