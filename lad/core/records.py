"""Records: one per (item, ordering), the unit every method and metric is computed from.

The format is docs/formats.md's; see `Record` for each field. `RecordSet` is the columnar
form methods and metrics work on; `read_records` / `write_records` move it to and from `.jsonl`
(one JSON object per line) or `.parquet` (its columns in `lad.core.parquet`), chosen by the
file's extension. A method's choices per record are `lad.core.predictions`.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from lad.core.parquet import read_columns, row_where, write_parquet
from lad.errors import RecordError, at
from lad.io.files import check_destination, drop_partial_line, named, note_input, replacing


@dataclass
class Record:
    """The model's evidence for one item shown in one ordering.

    item:      the benchmark item's id.
    ordering:  which ordering of the item (shuffle index t, or cyclic shift s for calibration and
               permutation-averaging records).
    order:     (N,) order[p] is the index into the item's images shown at position p.
    answer:    position (0-based) of the correct image in this ordering.
    logprobs:  (N,) logprobs[p] = log P(c_{p+1} | x), exact over the label set (sums to 1 in prob).
    attention: (L, N) attention[l][p] = a^(l)_p(x), Eq. 6: the last prompt token's head-averaged
               attention mass on image p's tokens in decoder layer l.
    extra:     anything else (generated replies, token counts); kept, ignored by methods.
    """

    item: str
    ordering: int
    order: list[int]
    answer: int
    logprobs: list[float]
    attention: list[list[float]]
    extra: dict[str, Any] = field(default_factory=dict)


RECORD_KEYS = ("item", "ordering", "order", "answer", "logprobs", "attention", "extra")
_ARRAYS = ("items", "ordering", "order", "answer", "logprobs", "attention")  # RecordSet's arrays


@dataclass
class RecordSet:
    """Many records as arrays (R records, N candidates, L layers), Record's fields stacked:
    items (R,) str, ordering and answer (R,) int, order (R, N) int, logprobs (R, N) and
    attention (R, L, N) float64, extra R dicts."""

    items: np.ndarray
    ordering: np.ndarray
    order: np.ndarray
    answer: np.ndarray
    logprobs: np.ndarray
    attention: np.ndarray
    extra: list[dict[str, Any]]

    def __len__(self) -> int:
        return len(self.items)

    @property
    def num_candidates(self) -> int:
        return int(self.logprobs.shape[1])

    @property
    def num_layers(self) -> int:
        return int(self.attention.shape[1])

    @classmethod
    def empty(cls, num_candidates: int = 0, num_layers: int = 0) -> RecordSet:
        return cls(
            items=np.array([], dtype=str),
            ordering=np.zeros(0, dtype=np.int64),
            order=np.zeros((0, num_candidates), dtype=np.int64),
            answer=np.zeros(0, dtype=np.int64),
            logprobs=np.zeros((0, num_candidates)),
            attention=np.zeros((0, num_layers, num_candidates)),
            extra=[],
        )

    @classmethod
    def from_records(cls, records: Iterable[Record]) -> RecordSet:
        """Validate and stack records (in memory; see `read_records` for files)."""
        rows = [{key: getattr(r, key) for key in RECORD_KEYS} for r in records]
        return _from_objects(rows, lambda i: f"record {i + 1}: ")

    def to_records(self) -> list[Record]:
        columns = [getattr(self, name).tolist() for name in _ARRAYS]  # Record's field order
        return [Record(*row, extra=dict(e)) for *row, e in zip(*columns, self.extra, strict=True)]

    def select(self, which: np.ndarray | Sequence[int] | Sequence[bool]) -> RecordSet:
        """The records at these indices, or where this boolean mask is true."""
        idx = np.asarray(which)
        if idx.dtype == bool:
            if idx.shape != (len(self),):
                raise RecordError(f"a mask must have one entry per record ({len(self)})")
            idx = np.flatnonzero(idx)
        idx = idx.astype(np.int64, copy=False)
        arrays = {name: getattr(self, name)[idx] for name in _ARRAYS}
        return RecordSet(**arrays, extra=[self.extra[i] for i in idx])

    @staticmethod
    def concat(sets: Sequence[RecordSet]) -> RecordSet:
        """One RecordSet holding the records of all `sets`, in order; N and L must agree."""
        sets = [s for s in sets if len(s)]
        if not sets:
            return RecordSet.empty()
        shapes = {(s.num_candidates, s.num_layers) for s in sets}
        if len(shapes) > 1:
            raise RecordError(f"cannot concatenate records with different (N, L): {sorted(shapes)}")
        arrays = {name: np.concatenate([getattr(s, name) for s in sets]) for name in _ARRAYS}
        return RecordSet(**arrays, extra=[e for s in sets for e in s.extra])

    def keys(self) -> list[tuple[str, int]]:
        """(item, ordering) of every record: what a prediction refers to."""
        return list(zip(self.items.tolist(), self.ordering.tolist(), strict=True))

    def answer_image(self) -> np.ndarray:
        """(R,) index into the item's images of the correct image."""
        return np.take_along_axis(self.order, self.answer[:, None], axis=1)[:, 0]


concat = RecordSet.concat


# ---------------------------------------------------------------------------------------------
# Validation shared by jsonl, parquet and in-memory records.


def _fault(obj: Any, n: int | None = None, nl: int | None = None) -> str | None:
    """What is wrong with one record object's keys and types, and, given N and L, its lengths
    (None: nothing); its numbers are checked afterwards, vectorised, and its attention rows' only
    when they cannot be stacked (`_row_fault`)."""
    if not isinstance(obj, dict):
        return f"expected a JSON object, got {type(obj).__name__}"
    for key in RECORD_KEYS[:-1]:
        if key not in obj:
            return f"missing key {key!r} (a record has keys {list(RECORD_KEYS)})"
    unknown = obj.keys() - RECORD_KEYS
    if unknown:
        return (
            f"unknown key(s) {sorted(unknown)}; a record has keys {list(RECORD_KEYS)} "
            "(put anything else under 'extra')"
        )
    if not isinstance(obj["item"], str):
        return f"'item' must be a string, got {obj['item']!r}"
    for key in ("ordering", "answer"):
        if not isinstance(obj[key], int) or isinstance(obj[key], bool):
            return f"{key!r} must be an integer, got {obj[key]!r}"
    for key in ("order", "logprobs", "attention"):
        if not isinstance(obj[key], list):
            return f"{key!r} must be a list, got {type(obj[key]).__name__}"
    if not isinstance(obj.get("extra", {}), dict):
        return f"'extra' must be an object, got {obj['extra']!r}"
    if n is None:
        return None
    if len(obj["order"]) != n or len(obj["logprobs"]) != n:
        return (
            f"'order' and 'logprobs' must have N = {n} entries like the first record, "
            f"got {len(obj['order'])} and {len(obj['logprobs'])}"
        )
    if len(obj["attention"]) != nl:
        got = len(obj["attention"])
        return f"'attention' must have L = {nl} layers like the first record, got {got}"
    if not all(type(x) is int for x in obj["order"]):
        return _row_fault(obj, n) or "'order' must hold only integers"
    return None


def _row_fault(obj: dict, n: int) -> str | None:
    for layer, row in enumerate(obj["attention"]):
        if not isinstance(row, list) or len(row) != n:
            return f"attention[{layer}] must be a list of N = {n} numbers"
    return None


def _as_floats(objs: list[dict], name: str, where_of, n: int) -> np.ndarray:
    """Stack the records' `name` numbers as float64; a string among them, or a layer of other
    than N numbers, is an error naming the record."""
    values = [o[name] for o in objs]
    try:
        arr = np.array(values)
        if arr.dtype.kind in "iuf":
            return arr.astype(np.float64, copy=False)
    except (TypeError, ValueError):
        pass
    # Slow path, only for a bad file: a record with ragged layers is the likelier fault, then
    # the first record whose values are not all numbers.
    for i, obj in enumerate(objs):
        if name == "attention" and (fault := _row_fault(obj, n)):
            raise RecordError(where_of(i) + fault)
    for i, v in enumerate(values):
        flat = [x for row in v for x in (row if isinstance(row, list) else [row])]
        if not all(type(x) in (int, float) for x in flat):
            raise RecordError(f"{where_of(i)}{name!r} must hold only numbers")
    raise RecordError(f"{where_of(0)}{name!r} could not be read as numbers")


def _from_objects(objs: list[dict], where_of) -> RecordSet:
    """Validate parsed record objects and stack them; `where_of(i)` prefixes messages."""
    if not objs:
        return RecordSet.empty()
    if fault := _fault(objs[0]):
        raise RecordError(where_of(0) + fault)
    n, nl = len(objs[0]["logprobs"]), len(objs[0]["attention"])
    if n < 2:
        raise RecordError(f"{where_of(0)}a record needs at least 2 candidates, got {n}")
    if nl < 1:
        raise RecordError(f"{where_of(0)}'attention' must have at least one layer")
    for i, obj in enumerate(objs):
        if fault := _fault(obj, n, nl):
            raise RecordError(where_of(i) + fault)
    attention = _as_floats(objs, "attention", where_of, n)  # before logprobs: its faults first
    records = RecordSet(
        items=np.array([o["item"] for o in objs], dtype=str),
        ordering=np.array([o["ordering"] for o in objs], dtype=np.int64),
        order=np.array([o["order"] for o in objs], dtype=np.int64),
        answer=np.array([o["answer"] for o in objs], dtype=np.int64),
        logprobs=_as_floats(objs, "logprobs", where_of, n),
        attention=attention,
        extra=[o.get("extra", {}) for o in objs],
    )
    validate(records, where_of)
    return records


def validate(records: RecordSet, where_of) -> None:
    """Check the numbers of a RecordSet: permutations, answers in range, finite values,
    non-negative attention, unique (item, ordering), one answer image per item (`where_of(i)`:
    the prefix of a message about record i)."""
    n = records.num_candidates
    checks = [
        (
            (np.sort(records.order, axis=1) != np.arange(n)).any(axis=1),
            lambda i: f"'order' {records.order[i].tolist()} is not a permutation of 0..{n - 1}",
        ),
        (
            (records.answer < 0) | (records.answer >= n),
            lambda i: f"'answer' {records.answer[i]} is not a position in 0..{n - 1}",
        ),
        (
            ~np.isfinite(records.logprobs).all(axis=1),
            lambda i: "'logprobs' must be finite numbers (no NaN or infinity)",
        ),
        (
            ~np.isfinite(records.attention).all(axis=(1, 2)),
            lambda i: "'attention' must be finite numbers (no NaN or infinity)",
        ),
        (
            (records.attention < 0).any(axis=(1, 2)),
            lambda i: "'attention' is attention mass and must be >= 0",
        ),
    ]
    for bad, message in checks:
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise RecordError(f"{where_of(i)}{message(i)}")
    seen: dict[tuple[str, int], int] = {}
    for i, key in enumerate(records.keys()):
        if key in seen:
            raise RecordError(
                f"{where_of(i)}duplicate record for item {key[0]!r}, ordering {key[1]} "
                f"(first at {where_of(seen[key]).rstrip(': ')})"
            )
        seen[key] = i
    # Every ordering of an item must put the answer on the same image.
    _, first, inverse = np.unique(records.items, return_index=True, return_inverse=True)
    image = records.answer_image()
    bad = image != image[first[inverse]]
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        j = int(first[inverse[i]])
        raise RecordError(
            f"{where_of(i)}item {str(records.items[i])!r}: the answer is image {image[i]} here but "
            f"image {image[j]} at {where_of(j).rstrip(': ')}; 'answer' must follow 'order'"
        )


# ---------------------------------------------------------------------------------------------
# Files.


def _is_parquet(path: Path) -> bool:
    return path.suffix.lower() in (".parquet", ".pq")


def read_records(path: str | Path, *, missing_ok: bool = False) -> RecordSet:
    """Read and validate a `.jsonl` or `.parquet` records file (a bad record: a RecordError
    naming the file and line or row); `missing_ok`: no file is no records (resuming a run)."""
    path = Path(path)
    if not path.is_file():
        if missing_ok:
            return RecordSet.empty()
        raise RecordError(f"{path}: no such records file")
    note_input(path)
    if _is_parquet(path):
        columns = read_columns(path, RECORD_KEYS)
        if columns is None:
            return RecordSet.empty()
        records = RecordSet(**columns)
        validate(records, row_where(path))
        return records
    rows = list(jsonl_objects(path))
    return _from_objects([obj for _, obj in rows], lambda i: at(path, rows[i][0]))


def jsonl_objects(path: Path) -> Iterator[tuple[int, Any]]:
    """(line number, parsed JSON) of each non-blank line of a `.jsonl` file; bad JSON is a
    RecordError naming the line."""
    with path.open("rb") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                obj = orjson.loads(line)
            except orjson.JSONDecodeError as e:
                raise RecordError(f"{at(path, lineno)}not valid JSON ({e})") from None
            yield lineno, obj


def _record_object(r: Record) -> dict[str, Any]:
    return {
        **vars(r),
        "ordering": int(r.ordering),
        "order": [int(x) for x in r.order],
        "answer": int(r.answer),
        "logprobs": [float(x) for x in r.logprobs],
        "attention": [[float(x) for x in row] for row in r.attention],
    }


def dumps(obj: Any) -> bytes:
    return orjson.dumps(obj, option=orjson.OPT_SERIALIZE_NUMPY)


def write_records(path: str | Path, records: RecordSet | Iterable[Record]) -> None:
    """Write records to `.jsonl` or `.parquet` (by extension), replacing the file."""
    path = Path(path)
    with replacing(path) as tmp:
        if _is_parquet(path):
            rs = records if isinstance(records, RecordSet) else RecordSet.from_records(records)
            write_parquet(tmp, rs)
        else:
            rows = records.to_records() if isinstance(records, RecordSet) else records
            with tmp.open("wb") as f:
                for r in rows:
                    f.write(dumps(_record_object(r)) + b"\n")


class RecordWriter:
    """Append records to a `.jsonl` file one line at a time, flushing each (for long runs).

    Opening a file whose last line is incomplete (a run killed mid-write) drops that partial
    line first, so the file stays valid and the run can resume.

        with RecordWriter("run/records.jsonl") as w:
            w.write(record)
    """

    def __init__(self, path: str | Path):
        self.path = Path(path)
        if _is_parquet(self.path):
            raise RecordError(f"{self.path}: RecordWriter appends jsonl; use write_records")
        self._file = None

    def __enter__(self) -> RecordWriter:
        check_destination(self.path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        drop_partial_line(self.path)
        self._file = self.path.open("ab")
        return self

    def write(self, record: Record) -> None:
        if self._file is None:
            raise RecordError("RecordWriter is not open; use it as `with RecordWriter(path) as w`")
        try:
            self._file.write(dumps(_record_object(record)) + b"\n")
            self._file.flush()
        except OSError as e:  # e.g. a full disk: the partial line is dropped on resume
            raise named(e, self.path) from None

    def __exit__(self, exc_type: object, *exc: object) -> None:
        file, self._file = self._file, None
        if file is None:
            return
        try:
            file.close()
        except OSError as e:
            if exc_type is None:  # else the error already in flight says more
                raise named(e, self.path) from None
