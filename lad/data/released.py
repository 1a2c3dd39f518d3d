"""What the converters of released benchmarks share (`lad data mmiu|muirbench|blink`): reading
their question files (parquet, JSON Lines, JSON), pictures embedded as bytes written out to files,
the held-out calibration split, and the summary of what was converted and skipped, per task and
reason, printed and written beside the output (`<out stem>.summary.json`).
"""

from __future__ import annotations

import io
import json
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lad.data.builders import calibration_path_for, seeded_rng
from lad.data.items import Item, write_items
from lad.errors import DataError
from lad.io.files import read_text, write_bytes, write_text


@dataclass
class Row:
    """One question as its file holds it, and where: `where` names the file and row for errors."""

    fields: dict[str, Any]
    where: str


def read_rows(path: str | Path) -> list[Row]:
    """The rows of one question file, or of every .parquet file below a folder (sorted by path):
    Apache Parquet, JSON Lines (`datasets`' to_json) or a JSON list of objects."""
    path = Path(path)
    if path.is_dir():
        files = sorted(path.rglob("*.parquet"))
        if not files:
            raise DataError(f"{path}: no .parquet file in this folder or below it")
        return [row for f in files for row in _parquet(f)]
    if not path.is_file():
        raise DataError(f"{path}: no such question file")
    with path.open("rb") as f:
        head = f.read(4)
    if head == b"PAR1":
        return _parquet(path)
    text = _text(path)
    if text.lstrip().startswith("["):
        try:
            rows = json.loads(text)
        except json.JSONDecodeError as e:
            raise DataError(f"{path}: not valid JSON ({e.msg}, line {e.lineno})") from None
        return [_row(obj, f"{path}: entry {i}: ") for i, obj in enumerate(rows)]
    return [
        _row(_json_line(line, path, n), f"{path}:{n}: ")
        for n, line in enumerate(text.splitlines(), 1)
        if line.strip()
    ]


def _text(path: Path) -> str:
    """A JSON or JSON Lines question file's text: UTF-8 only (lad.io.files' one rule)."""
    return read_text(path, DataError, "JSON question file")


def _json_line(line: str, path: Path, n: int) -> Any:
    try:
        return json.loads(line)
    except json.JSONDecodeError as e:
        raise DataError(
            f"{path}:{n}: not valid JSON ({e.msg}); expected a JSON list of questions, one "
            "question per line (JSON Lines), or a .parquet file"
        ) from None


def _row(obj: Any, where: str) -> Row:
    if not isinstance(obj, dict):
        raise DataError(f"{where}expected a JSON object per question, got {type(obj).__name__}")
    return Row(obj, where)


def _parquet(path: Path) -> list[Row]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except (pa.ArrowException, OSError) as e:
        raise DataError(f"{path}: cannot read it as Parquet ({e})") from None
    return [Row(obj, f"{path}: row {i}: ") for i, obj in enumerate(table.to_pylist())]


def require(row: Row, key: str) -> Any:
    """The field `key` of `row`, which the benchmark's schema always has (else an error)."""
    if key not in row.fields:
        raise DataError(f"{row.where}missing field {key!r}; is this the benchmark's own file?")
    return row.fields[key]


def text_or_none(value: Any) -> str | None:
    """A string field's text trimmed, None when null or blank."""
    if value is None:
        return None
    text = str(value).strip()
    return text or None


# ----------------------------------------------------------------------------- pictures


def picture_bytes(value: Any, where: str) -> bytes | None:
    """The encoded bytes of a `datasets` Image cell ({"bytes", "path"}), None when empty."""
    if value is None:
        return None
    if isinstance(value, dict) and isinstance(value.get("bytes"), bytes | bytearray):
        return bytes(value["bytes"])
    if isinstance(value, bytes | bytearray):
        return bytes(value)
    raise DataError(f"{where}expected a picture stored as bytes, got {str(value)[:60]!r}")


def safe_name(text: str) -> str:
    """`text` usable in a file name: letters, digits, '-' and '_' kept, the rest '_'."""
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in text)


def save_picture(data: bytes, folder: Path, stem: str, where: str) -> Path:
    """Write a picture's bytes unchanged to `folder/stem.<its format's suffix>`."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(data)) as image:
            kind = (image.format or "").lower()
    except (UnidentifiedImageError, OSError):
        raise DataError(f"{where}a picture's bytes are not an image PIL can read") from None
    suffix = {"jpeg": ".jpg", "png": ".png", "webp": ".webp", "gif": ".gif", "bmp": ".bmp"}
    path = folder / f"{stem}{suffix.get(kind, '.' + kind if kind else '.img')}"
    if not (path.is_file() and path.read_bytes() == data):
        path.parent.mkdir(parents=True, exist_ok=True)
        write_bytes(path, data)
    return path


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
    rows: list[Row],
    convert: Callable[[Row], Item | str],
    *,
    task_of: Callable[[Row], str],
    task: str | None,
    num_candidates: int | None,
    source: str | Path,
) -> Converted:
    """Every row of `task` (None: of every task) through `convert` (an item or the reason it is
    skipped), keeping the items of `num_candidates` candidates (None: of the one N there is)."""
    tasks = sorted({task_of(row) for row in rows})
    if task is not None and task not in tasks:
        raise DataError(f"{source}: no question of task {task!r}; its tasks: {tasks}")
    converted = Converted()
    for row in rows:
        name = task_of(row)
        if task is not None and name != task:
            continue
        made = convert(row)
        if isinstance(made, str):
            converted.skip(name, made)
        elif num_candidates is not None and made.num_candidates != num_candidates:
            converted.skip(name, OTHER_N)
        else:
            converted.add(name, made)
    sizes = Counter(it.num_candidates for it in converted.items)
    if len(sizes) > 1:
        listed = ", ".join(f"N = {n} ({c})" for n, c in sorted(sizes.items()))
        raise DataError(
            f"{source}: the questions converted have different numbers of candidates ({listed}); "
            "choose one with --num-candidates (and a task with --task)"
        )
    return converted


OTHER_N = "other N"  # another number of candidates than --num-candidates


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


def convert_parquet(
    path: str | Path,
    out: str | Path,
    *,
    benchmark: str,
    convert_row: Callable[[Row, Path], Item | str],
    task_field: str,
    pictures: str | Path | None = None,
    task: str | None = None,
    num_candidates: int | None = None,
    items: int | None = None,
    calibration_items: int = 5,
    seed: int = 0,
) -> Written:
    """A benchmark whose pictures are bytes in its parquet files (a file, or a folder searched
    for *.parquet) into an items file `out`, calibration items and a summary beside it; each row
    through `convert_row(row, folder)`, its pictures written to `pictures_folder(out, pictures)`;
    `task_field` names a row's task."""
    check_split(items, calibration_items)
    folder = pictures_folder(out, pictures)
    converted = collect(
        read_rows(path),
        lambda row: convert_row(row, folder),
        task_of=lambda row: str(require(row, task_field)),
        task=task,
        num_candidates=num_candidates,
        source=path,
    )
    return write_split(
        converted,
        out,
        benchmark=benchmark,
        source=path,
        items=items,
        calibration_items=calibration_items,
        seed=seed,
    )


def _reasons(converted: Converted) -> str:
    total: Counter[str] = Counter()
    for counts in converted.skipped.values():
        total.update(counts)
    return ", ".join(f"{r}: {c}" for r, c in sorted(total.items())) or "none skipped"


def summary_lines(written: Written) -> Iterator[str]:
    """What `lad data` prints: the files written, then per task what was converted and skipped."""
    yield f"Wrote {written.items} items to {written.items_path}"
    if written.calibration_path is not None:
        yield f"Wrote {written.calibration_items} calibration items to {written.calibration_path}"
    for task, counts in written.summary["tasks"].items():
        skipped = counts["skipped"]
        reasons = ", ".join(f"{r}: {c}" for r, c in skipped.items())
        tail = f"; skipped {sum(skipped.values())} ({reasons})" if skipped else ""
        yield f"  {task}: converted {counts['converted']}{tail}"
    yield f"Summary written to {written.summary_path}"


def ordinal_letters(count: int) -> Sequence[str]:
    """The option letters A, B, … of `count` options."""
    return [chr(ord("A") + k) for k in range(count)]
