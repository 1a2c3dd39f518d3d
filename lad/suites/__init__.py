"""Suites: a small TOML file naming benchmarks, their (task, N, setting) cells, the run settings,
the methods and the models, and the paper's published numbers for its models
(docs/suites.md). The paper's own suites ship beside this module (table1, table5, blink,
muirbench); `lad suite run NAME|FILE` runs every cell (lad.evaluate.run_suite) and prints one
table (lad.suites.table).

One run directory per (model, cell): the paper calibrates each cell of its tables on that cell's
own held-out items (Table 3 shows what a calibration carried to other data costs), and a cell's
run directory is then exactly a `lad eval` run, resumed, only rescored when finished, and read by
`lad report`/`lad ablate` as any other.
"""

from __future__ import annotations

import dataclasses
import re
import sys
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tomllib

from lad.core.methods import MethodOptions, broken_bound
from lad.data.benchmarks import BENCHMARKS
from lad.errors import DataError, LadError
from lad.io.files import below, child, read_text
from lad.run.config import FIELDS, OPTION_FIELDS, EvalConfig
from lad.run.spec import RecordSpec

BUILT_IN = Path(__file__).resolve().parent
# Where a benchmark's data sit, per kind: the keys a [benchmarks.NAME] table may set, each a path
# below the benchmark's root folder (defaults in parentheses' place: the released layouts).
KINDS: dict[str, dict[str, str]] = {
    **{name: dict(b.layout) for name, b in BENCHMARKS.items()},  # lad data's converters
    "coco": {
        "images": "val2014",
        "captions": "annotations/captions_val2014.json",
        "instances": "annotations/instances_val2014.json",
    },
    "flickr8k": {"images": "Flicker8k_Dataset", "captions": "Flickr8k.token.txt"},
    "shapes": {},  # drawn by lad itself: no folder
}
# Run settings a suite may not set: each cell sets them.
PER_CELL = ("model", "data", "num_candidates", "setting", "calibration_data", "calibration")
CELL_KEYS = ("id", "benchmark", "task", "num_candidates", "setting")
# Each run setting's field (RecordSpec's, EvalConfig's, MethodOptions'): its type, its bound.
SETTING_CLASSES = (RecordSpec, EvalConfig, MethodOptions)
SETTING_FIELDS = {f.name: f for cls in SETTING_CLASSES for f in dataclasses.fields(cls)}
HINTS = {k: v for cls in SETTING_CLASSES for k, v in typing.get_type_hints(cls).items()}
LAYOUTS = ("cells", "methods")
METRICS = ("acc", "acc_std", "rstd", "delta_rstd", "cons")


@dataclass(frozen=True)
class Benchmark:
    name: str
    kind: str
    folder: str  # its root's name below a common --data-root
    paths: dict[str, str]
    root: Path | None = None  # where the suite file says it lives (--data-root NAME=DIR wins)
    options: dict[str, Any] = field(default_factory=dict)  # e.g. clip for adversarial COCO


@dataclass(frozen=True)
class SuiteCell:
    """One cell: a benchmark's task (None: the benchmark has one) at N candidates (None: the
    task's one N) under a setting (coco, flickr8k, shapes), with its own run settings."""

    id: str
    benchmark: str
    task: str | None
    num_candidates: int | None
    setting: str = "random"
    settings: dict[str, Any] = field(default_factory=dict)

    @property
    def slug(self) -> str:
        return slug(self.id)


@dataclass(frozen=True)
class Model:
    name: str  # the paper's name for it (its published numbers are keyed by it)
    path: str


@dataclass(frozen=True)
class Column:
    title: str
    metric: str
    method: str | None = None  # layout "cells": the method of the column


@dataclass(frozen=True)
class Suite:
    name: str
    source: Path
    title: str
    benchmarks: dict[str, Benchmark]
    cells: list[SuiteCell]
    models: list[Model]
    settings: dict[str, Any]
    layout: str  # "cells": one row per cell; "methods": one row per (cell, method)
    columns: list[Column]
    paper: dict[str, dict[str, dict[str, dict[str, float]]]]  # model -> cell -> method -> metric

    @property
    def methods(self) -> tuple[str, ...]:
        return tuple(self.settings.get("methods", ()))


def slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-") or "cell"


def built_in_names() -> list[str]:
    return sorted(p.stem for p in BUILT_IN.glob("*.toml"))


def load_suite(name_or_path: str | Path) -> Suite:
    """A built-in suite by name, or a suite file; refused, naming the file and key, unless every
    key is known and every value of its kind."""
    path = Path(name_or_path)
    if not path.is_file():
        if str(name_or_path) not in built_in_names():
            raise DataError(
                f"{name_or_path}: neither a suite file nor a built-in suite "
                f"({', '.join(built_in_names())})"
            )
        path = BUILT_IN / f"{name_or_path}.toml"
    text = read_text(path, DataError, "suite file")
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise DataError(f"{path}: not a TOML file ({e})") from None
    except RecursionError:
        raise DataError(
            f"{path}: TOML nested too deeply to read (more than {sys.getrecursionlimit()} levels "
            "of arrays or tables); no suite nests so"
        ) from None
    return _suite(raw, path)


def _suite(raw: dict[str, Any], path: Path) -> Suite:
    where = f"{path}: "
    _known(raw, ("name", "title", "benchmarks", "cells", "models", "settings", "table", "paper"),
           where)  # fmt: skip
    benchmarks = {
        name: _benchmark(name, spec, f"{where}[benchmarks.{name}] ", path.parent)
        for name, spec in _table(raw, "benchmarks", where).items()
    }
    settings = _settings(_table(raw, "settings", where, {}), f"{where}[settings] ")
    cells = _each(raw, "cells", where, lambda cell, at: _cell(cell, benchmarks, at))
    if not cells:
        raise DataError(f"{where}names no [[cells]]")
    ids = [c.id for c in cells]
    if len(set(map(slug, ids))) != len(ids):
        raise DataError(f"{where}two cells share an id: {ids}")
    models = _each(raw, "models", where, _model)
    table = _table(raw, "table", where, {})
    _known(table, ("layout", "columns"), f"{where}[table] ")
    layout = table.get("layout", "methods")
    if layout not in LAYOUTS:
        raise DataError(f"{where}[table] layout must be one of {LAYOUTS}. Got {layout!r}.")
    columns = _each(table, "columns", f"{where}[table] ", lambda c, at: _column(c, layout, at))
    columns = columns or [Column("Acc", "acc"), Column("RStd", "rstd"), Column("Cons.", "cons")]
    paper = _paper(_table(raw, "paper", where, {}), ids, where)
    name = str(raw.get("name", path.stem))
    title = str(raw.get("title", name))
    return Suite(name, path, title, benchmarks, cells, models, settings, layout, columns, paper)


def _known(table: dict[str, Any], keys: tuple[str, ...], where: str) -> None:
    unknown = [k for k in table if k not in keys]
    if unknown:
        raise DataError(f"{where}unknown key {unknown[0]!r}; known: {', '.join(keys)}")


def _table(raw: dict[str, Any], key: str, where: str, default: Any = None) -> dict[str, Any]:
    value = raw.get(key, default)
    if not isinstance(value, dict):
        raise DataError(f"{where}[{key}] must be a table")
    return value


def _each(raw: dict[str, Any], key: str, where: str, read: Any) -> list[Any]:
    """read(table, where) of each table of the array `key`, each named KEY[i] in its errors."""
    value = raw.get(key, [])
    if not isinstance(value, list):
        raise DataError(f"{where}{key} must be an array of tables ([[{key}]]), got {value!r:.60}")
    return [read(item, f"{where}{key}[{i}]: ") for i, item in enumerate(value)]


def _benchmark(name: str, spec: Any, where: str, base: Path) -> Benchmark:
    if not isinstance(spec, dict) or spec.get("kind") not in KINDS:
        raise DataError(f"{where}needs kind = one of {', '.join(KINDS)}")
    kind = spec["kind"]
    defaults = KINDS[kind]
    _known(spec, ("kind", "folder", "root", "clip", *defaults), where)
    paths = {k: str(spec.get(k, v)) for k, v in defaults.items()}
    for key, path in paths.items():  # each below the benchmark's folder, never elsewhere
        below("DIR", path, DataError, f"{where}{key} = ")
    folder = str(spec.get("folder", name))
    child("--data-root", folder, DataError, f"{where}folder = ")
    options = {k: spec[k] for k in ("clip",) if k in spec}
    root = None if "root" not in spec else base / str(spec["root"])  # relative: to the file
    return Benchmark(name, kind, folder, paths, root=root, options=options)


def _settings(settings: dict[str, Any], where: str) -> dict[str, Any]:
    """The settings, each key one of lad eval's options a suite may set, its value of that
    option's type (an array as a tuple; a tuple's text as its flag takes it, "0,3") within its
    flag's bound, and a method option one MethodOptions takes; refused naming `where` and key."""
    read = {}
    for key, value in settings.items():
        if (key not in FIELDS or key in PER_CELL) and key != "preset":
            raise DataError(
                f"{where}{key!r} is not a run setting a suite sets (lad eval's options, less "
                f"{', '.join(PER_CELL)}, which each cell sets)"
            )
        wanted = HINTS.get(key, str)
        value = _indices(value, wanted)
        if not _of_type(value, wanted):
            raise DataError(f"{where}{key} must be {_type_name(wanted)}, got {value!r:.60}")
        if isinstance(value, list):
            value = tuple(value)
        kinds = _alternatives(wanted)
        if type(value) is int and float in kinds and int not in kinds:
            value = float(value)  # as its flag reads "5": 5.0
        outside = broken_bound(value, SETTING_FIELDS[key].metadata if key in SETTING_FIELDS else {})
        if outside:
            raise DataError(f"{where}{key} must be {outside}, got {value!r}")
        if key in OPTION_FIELDS:
            try:
                MethodOptions(**{key: value})
            except LadError as e:
                raise DataError(f"{where}{key}: {e}") from None
        read[key] = value
    return read


def _alternatives(hint: Any) -> tuple[Any, ...]:
    """The types a type `hint` allows: a union's members, else itself."""
    union = typing.get_origin(hint) in (typing.Union, types.UnionType)
    return typing.get_args(hint) if union else (hint,)


def _is_indices(hint: Any) -> bool:
    return typing.get_origin(hint) is tuple and typing.get_args(hint)[0] is int


def _indices(value: Any, hint: Any) -> Any:
    """A setting's text as its flag reads it ("0,3": (0, 3)) where the type `hint` is, or may be,
    a tuple of whole numbers (layer indices); other values as they are."""
    if not isinstance(value, str) or not any(_is_indices(a) for a in _alternatives(hint)):
        return value
    try:
        return tuple(int(part) for part in value.split(","))
    except ValueError:
        return value


def _of_type(value: Any, hint: Any) -> bool:
    """`value` (parsed TOML) is of the type `hint` (a setting's field's): a bool is no number,
    an integer is a float, an array is a tuple."""
    args = typing.get_args(hint)
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return any(_of_type(value, a) for a in args)
    if hint is type(None):
        return False  # TOML has no null: leave the setting out for its default
    if hint is bool:
        return isinstance(value, bool)
    if isinstance(value, bool):
        return hint is Any
    if hint is float:
        return isinstance(value, int | float)
    if origin is tuple:
        return isinstance(value, list | tuple) and all(_of_type(v, args[0]) for v in value)
    if origin in (dict, Mapping):
        return isinstance(value, dict)
    return hint is Any or isinstance(value, hint)


def _type_name(hint: Any) -> str:
    names = {int: "a whole number", float: "a number", str: "a string", bool: "true or false"}
    parts = [a for a in _alternatives(hint) if a is not type(None)]

    def name(a: Any) -> str:
        if _is_indices(a):
            return 'an array of whole numbers (or their text, "0,3")'
        return "an array" if typing.get_origin(a) is tuple else "a table"

    return " or ".join(names.get(a) or name(a) for a in parts)


def _cell(raw: Any, benchmarks: dict[str, Benchmark], where: str) -> SuiteCell:
    if not isinstance(raw, dict):
        raise DataError(f"{where}must be a table")
    name = raw.get("benchmark", next(iter(benchmarks), None))
    if name not in benchmarks:
        raise DataError(f"{where}benchmark {name!r} is not one of [benchmarks]: {list(benchmarks)}")
    n = raw.get("num_candidates")
    if n is not None and (not isinstance(n, int) or isinstance(n, bool) or n < 2):
        raise DataError(f"{where}num_candidates must be a whole number >= 2. Got {n!r}.")
    task = _text(raw, "task", None, where)
    settings = _settings({k: v for k, v in raw.items() if k not in CELL_KEYS}, where)
    default_id = " ".join(str(p) for p in (task or name, raw.get("setting"), n and f"N={n}") if p)
    cell_id = _text(raw, "id", default_id, where)
    child("--out", slug(cell_id), DataError, f"{where}id {cell_id!r} gives ")  # a folder's name
    setting = _text(raw, "setting", "random", where)
    return SuiteCell(cell_id, name, task, n, setting, settings)


def _model(raw: Any, where: str) -> Model:
    if not isinstance(raw, dict) or not isinstance(raw.get("name"), str):
        raise DataError(f"{where}needs name = the paper's name for the model")
    _known(raw, ("name", "path"), where)
    child("--out", slug(raw["name"]), DataError, f"{where}name {raw['name']!r} gives ")
    return Model(raw["name"], _text(raw, "path", raw["name"], where))


def _text(raw: dict, key: str, default: Any, where: str) -> Any:
    """A suite's text value: a TOML string, never a number read as a name or a path."""
    value = raw.get(key, default)
    if value is not None and not isinstance(value, str):
        raise DataError(f"{where}{key} must be a string, got {value!r:.60}")
    return value


def _column(raw: Any, layout: str, where: str) -> Column:
    if not isinstance(raw, dict) or raw.get("metric") not in METRICS:
        raise DataError(f"{where}needs metric = one of {', '.join(METRICS)}")
    _known(raw, ("title", "metric", "method"), where)
    if layout == "cells" and not raw.get("method"):
        raise DataError(f"{where}layout 'cells' needs each column's method")
    return Column(str(raw.get("title", raw["metric"])), raw["metric"], raw.get("method"))


def _paper(raw: dict[str, Any], ids: list[str], where: str) -> dict[str, Any]:
    """[paper.MODEL."cell id".METHOD] metric = value: every cell id one of the suite's."""
    for model, by_cell in raw.items():
        for cell, by_method in _paper_table(by_cell, where, model).items():
            if cell not in ids:
                raise DataError(f"{where}[paper.{model!r}] names cell {cell!r}, not a cell id")
            for method, values in _paper_table(by_method, where, model, cell).items():
                for metric, value in _paper_table(values, where, model, cell, method).items():
                    if metric not in METRICS or not isinstance(value, (int, float)):
                        raise DataError(
                            f"{where}[paper] {model} / {cell} / {method}: {metric} = {value!r} "
                            f"is not a number of one of {', '.join(METRICS)}"
                        )
    return raw


def _paper_table(value: Any, where: str, *keys: str) -> dict[str, Any]:
    """`value`, the table [paper.KEY1.KEY2...] (keys quoted), refused unless a table."""
    if not isinstance(value, dict):
        name = ".".join(repr(k) for k in keys)
        raise DataError(
            f'{where}[paper.{name}] must be a table ([paper.MODEL."cell id".METHOD] metric = '
            f"value), got {value!r:.60}"
        )
    return value
