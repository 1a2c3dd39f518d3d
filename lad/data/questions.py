"""A released benchmark's question files, row by row (`lad data mmiu|muirbench|blink`): Apache
Parquet a row group at a time (its task column first, so rows of other tasks are never decoded),
JSON Lines (`datasets`' to_json), JSON lists; and what describes a benchmark to them
(`Benchmark`)."""

from __future__ import annotations

import contextlib
import json
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lad.data.rules import Choice
from lad.errors import DataError
from lad.io.files import loads_json, note_input, read_text


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
    embedded:   True (a hub dataset's layout) when its pictures are bytes in the rows (written
                out to a pictures folder); False when the rows name picture files.
    one_task:   a conversion is of one task (a file of several needs --task).
    harness_keys: the keys an lmms-eval document of its task has (lad.harness.adapters; empty:
                no adapter).
    task_of:    a row's task from its fields (default: the task_field's value).
    hub, example, help, files: what --help says: the hub dataset (None: not one), a command
                line, the description (default: HUB_HELP's), the question files it reads.
    layout:     a suite's paths of its files below its root folder, by key (lad.suites.KINDS).
    """

    name: str
    title: str
    choose: Callable[[Row], Choice | str]
    task_field: str = "task"
    embedded: bool = True
    one_task: bool = False
    hub: str | None = None
    example: str = ""
    harness_keys: tuple[str, ...] = ()
    task_of: Callable[[dict[str, Any]], str] | None = None
    help: str = ""
    files: str = ""
    layout: tuple[tuple[str, str], ...] = (("questions", "."),)

    @property
    def description(self) -> str:
        return self.help or HUB_HELP.format(title=self.title, hub=self.hub)

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
    however many names it has), read row by row (the module docstring's formats)."""

    BATCH_ROWS = 16  # rows decoded at once: a few pictures each

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        if self.path.is_dir():
            self.files = _distinct(sorted(p for p in self.path.rglob("*.parquet") if p.is_file()))
            if not self.files:
                raise DataError(f"{self.path}: no .parquet file in this folder or below it")
        elif self.path.is_file():
            self.files = [self.path]
        else:
            raise DataError(f"{self.path}: no such question file")
        with self.files[0].open("rb") as f:
            parquet = f.read(4) == b"PAR1"
        self._json = None if parquet else _json_rows(self.path)
        for f in self.files:
            note_input(f)

    def tasks(self, benchmark: Benchmark) -> Counter[str]:
        """How many questions each task has."""
        if self._json is not None or benchmark.task_of is not None:
            # a task_of rule may read more than the column (MMIU: a null task is input.task)
            return Counter(benchmark.task(row.fields) for row in self.rows(benchmark, None))
        counts: Counter[str] = Counter()
        for path in self.files:
            pf = _open_parquet(path)
            if benchmark.task_field not in pf.schema_arrow.names:
                raise DataError(
                    f"{path}: no column {benchmark.task_field!r}; is this "
                    f"{benchmark.title}'s own file?"
                )
            for group in range(pf.metadata.num_row_groups):
                table = _read_group(pf, path, group, [benchmark.task_field])
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
                wanted = set(range(size))
                if task is not None and column in pf.schema_arrow.names:
                    names = _read_group(pf, path, group, [column]).column(column).to_pylist()
                    undecided = benchmark.task_of is not None  # a null: the row decides
                    wanted = {
                        k
                        for k, name in enumerate(names)
                        if str(name or "") == task or (name is None and undecided)
                    }
                rows = _group_rows(pf, path, group, self.BATCH_ROWS) if wanted else ()
                for k, obj in enumerate(rows):
                    if k in wanted:
                        yield Row(obj, f"{path}: row {start + k}: ")
                start += size


def _distinct(files: list[Path]) -> list[Path]:
    """Each file once: a symlink or hard link to a file already listed is the same file."""
    unique: dict[tuple[int, int], Path] = {}
    for f in files:
        with contextlib.suppress(OSError):
            st = f.stat()
            unique.setdefault((st.st_dev, st.st_ino), f)
    return list(unique.values())


@contextlib.contextmanager
def _parquet_errors(path: Path) -> Iterator[None]:
    import pyarrow as pa

    try:
        yield
    except (pa.ArrowException, OSError) as e:
        raise DataError(f"{path}: cannot read it as Parquet ({e})") from None


def _open_parquet(path: Path) -> Any:
    import pyarrow.parquet as pq

    with _parquet_errors(path):
        # Read as a stream, page by page, not a whole column chunk at once (lad.data's bound).
        return pq.ParquetFile(path, buffer_size=1 << 20, pre_buffer=False)


def _group_rows(pf: Any, path: Path, group: int, rows: int) -> Iterator[dict[str, Any]]:
    """A row group's rows, decoded `rows` at a time, read page by page (a group of large pictures
    is never held whole)."""
    with _parquet_errors(path):
        for batch in pf.iter_batches(batch_size=rows, row_groups=[group], use_threads=False):
            yield from batch.to_pylist()


def _read_group(pf: Any, path: Path, group: int, columns: list[str] | None) -> Any:
    with _parquet_errors(path):
        return pf.read_row_group(group, columns=columns, use_threads=False)


def _json_rows(path: Path) -> list[Row]:
    text = read_text(path, DataError, "JSON question file")  # UTF-8 only (lad.io.files' one rule)
    if text.lstrip().startswith("["):
        try:
            rows = loads_json(text, DataError, f"{path}: ")
        except json.JSONDecodeError as e:
            raise DataError(f"{path}: not valid JSON ({e.msg}, line {e.lineno})") from None
        if not isinstance(rows, list):
            raise DataError(f"{path}: expected a JSON list of questions")
        return [_row(obj, f"{path}: entry {i}: ") for i, obj in enumerate(rows)]
    questions = []
    for n, line in enumerate(text.split("\n"), 1):  # not splitlines(): U+2028 may be in text
        if not line.strip():
            continue
        try:
            obj = loads_json(line, DataError, f"{path}:{n}: ")
        except json.JSONDecodeError as e:
            raise DataError(
                f"{path}:{n}: not valid JSON ({e.msg}); expected a JSON list of questions, one "
                "question per line (JSON Lines), or a .parquet file"
            ) from None
        questions.append(_row(obj, f"{path}:{n}: "))
    return questions


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
        raise DataError(f"{row.where}{key!r} must be a list of strings, got {short_repr(value)}")
    return value


def short_repr(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
