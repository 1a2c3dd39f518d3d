"""Writing files safely. A whole file is written beside its destination and renamed onto it when
complete, so an interruption or a full disk never leaves half a file, and a symlink placed at
the destination is replaced rather than followed. No command writes over one of its inputs.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from lad.errors import LadError

PathLike = str | os.PathLike


@contextmanager
def replacing(path: PathLike) -> Iterator[Path]:
    """A temporary path beside `path` (same suffix) to write the whole file to; renamed onto
    `path` when the block ends without error, removed when it raises."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.stem}.{os.getpid()}.tmp{path.suffix}")
    try:
        yield tmp
        os.replace(tmp, path)
    except OSError as e:
        if e.filename in (None, str(tmp)):  # name the file the user asked for, not the temporary
            raise named(e, path) from None
        raise
    finally:
        tmp.unlink(missing_ok=True)


def named(e: OSError, path: PathLike) -> OSError:
    """The same OS error, naming `path` (a failed write() names no file)."""
    return type(e)(e.errno, e.strerror, str(path))


def write_text(path: PathLike, text: str) -> None:
    """Replace `path` by `text` (UTF-8), all at once."""
    with replacing(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def write_bytes(path: PathLike, data: bytes) -> None:
    with replacing(path) as tmp:
        tmp.write_bytes(data)


def read_json(path: PathLike, error: type[LadError] = LadError, what: str = "JSON file") -> Any:
    """Parse a JSON file; a missing file, a folder, non-UTF-8 bytes or bad JSON is `error`
    naming the file (and the line)."""
    path = Path(path)
    if path.is_dir():
        raise error(f"{path}: is a folder, not a {what}")
    if not path.is_file():
        raise error(f"{path}: no such {what}")
    data = path.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise error(f"{path}: not UTF-8 text (byte {data[e.start]:#04x}, line {line})") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise error(f"{path}: not valid JSON ({e.msg}, line {e.lineno})") from None


def _same(a: Path, b: Path) -> bool:
    if a.resolve() == b.resolve():
        return True
    try:
        return a.exists() and b.exists() and os.path.samefile(a, b)  # hard links
    except OSError:
        return False


def check_not_inputs(
    outputs: Mapping[str, PathLike | None],
    inputs: Mapping[str, PathLike | Iterable[PathLike] | None],
) -> None:
    """Refuse an output that is one of the inputs, however spelled (`./x` and `x`, a symlink or
    a hard link to it). Keys are how the user named each path, e.g. "--out", "--records"."""
    flat = []
    for name, value in inputs.items():
        if value is None:
            continue
        paths = [value] if isinstance(value, (str, os.PathLike)) else list(value)
        flat += [(name, Path(p)) for p in paths]
    for out_name, out in outputs.items():
        if out is None:
            continue
        for in_name, path in flat:
            if _same(Path(out), path):
                raise LadError(
                    f"{out_name} {out} is the same file as {in_name} {path}: lad never writes "
                    f"over its inputs; choose another {out_name}"
                )


def check_output_file(text: PathLike, flag: str = "--out") -> Path:
    """An output file path that can be written: not a folder, in a folder lad may create."""
    path = Path(text)
    if str(text).endswith(("/", os.sep)) or path.is_dir():
        raise LadError(
            f"{flag} {text} is a folder; give the path of the file to write, e.g. "
            f"{path / 'out.json'}"
        )
    check_writable(path.parent, flag, text)
    return path


def check_output_dir(text: PathLike, flag: str = "--out") -> Path:
    """An output folder: an existing folder or one lad may create, not a file."""
    path = Path(text)
    if path.exists() and not path.is_dir():
        raise LadError(f"{flag} {text} is a file, not a folder; give a folder path")
    check_writable(path, flag, text)
    return path


def check_writable(folder: Path, flag: str, text: PathLike) -> None:
    """The nearest existing folder at or above `folder` must accept new files."""
    probe = folder
    while not probe.exists():
        if probe.parent == probe:
            break
        probe = probe.parent
    if probe.exists() and not probe.is_dir():
        raise LadError(f"{flag} {text}: {probe} is a file, so no folder can be made there")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise LadError(f"{flag} {text}: cannot write in {probe} (read-only or no permission)")
