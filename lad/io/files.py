"""Writing files safely. A whole file is written beside its destination and renamed onto it when
complete, so an interruption or a full disk never leaves half a file, and a symlink placed at
the destination is replaced rather than followed.

No command writes over one of its inputs, by one rule kept here: a command runs inside `guarding`,
which refuses at once an output that is one of its inputs (or another of its outputs), and every
write (`replacing`, `check_destination`) refuses a destination that is an input, declared or read
since.
Readers call `note_input`, so a file a command reads is protected even if nobody declared it.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import mmap
import os
import re
import socket
import sys
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lad.errors import LadError

PathLike = str | os.PathLike


@contextmanager
def replacing(path: PathLike) -> Iterator[Path]:
    """A temporary path beside `path` (same suffix) to write the whole file to; renamed onto
    `path` when the block ends without error, removed when it raises."""
    path = Path(path)
    check_destination(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(path.parent)
    tmp = path.with_name(_temporary_name(path))
    try:
        yield tmp
        os.replace(tmp, path)
    except OSError as e:
        if e.filename in (None, str(tmp)):  # name the file the user asked for, not the temporary
            raise named(e, path) from None
        raise
    finally:
        tmp.unlink(missing_ok=True)


# A temporary file's name says whose it is: `.<stem>.<host>.<pid>.tmp<suffix>`, so a later run on
# the same host can tell one left by a killed process (its pid no longer runs) from one being
# written right now, and removes only the former.
_TMP_OWNER = "".join(c if c.isalnum() or c == "-" else "_" for c in socket.gethostname())[:32]
_TMP_OWNER = _TMP_OWNER or "host"
_NAME_MAX = 255  # bytes in a file name, on every file system lad writes to
_STALE = re.compile(rf"\.(.+)\.{re.escape(_TMP_OWNER)}\.(\d+)\.tmp(\.[^.]*)?")
_swept: set[Path] = set()


def _temporary_name(path: Path) -> str:
    """`path`'s temporary sibling's name; one that would be too long for the file system (an
    OUT whose own name is near the limit) shortens the stem to a digest of it."""
    name = f".{path.stem}.{_TMP_OWNER}.{os.getpid()}.tmp{path.suffix}"
    if len(name.encode()) <= _NAME_MAX:
        return name
    stem = hashlib.sha256(path.stem.encode()).hexdigest()[:16]
    return f".{stem}.{_TMP_OWNER}.{os.getpid()}.tmp{path.suffix[:16]}"


def remove_stale_temporaries(folder: Path) -> None:
    """Remove, once per folder and process, the temporary files a killed lad process left in
    `folder` (same host, a pid that no longer runs); another host's, or a live one's, stay."""
    key = folder.resolve()
    if key in _swept:
        return
    _swept.add(key)
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return
    for entry in entries:
        match = _STALE.fullmatch(entry.name)
        if match and not _running(int(match.group(2))) and entry.is_file(follow_symlinks=False):
            with contextlib.suppress(OSError):
                os.unlink(entry.path)


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, ValueError):
        return True  # someone else's process, or a number no pid can be: leave the file
    return True


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


# ---------------------------------------------------------------- names unique by construction


def content_path(folder: PathLike, data: bytes, suffix: str) -> Path:
    """Where `data` is kept in `folder`: named by its SHA-256, so two different contents never
    share a name, and the same content is one file whichever item or run shows it."""
    return Path(folder) / f"{hashlib.sha256(data).hexdigest()}{suffix}"


def write_once(path: PathLike, data: bytes, error: type[LadError] = LadError) -> bool:
    """Write `data` to `path` (a `content_path`) unless it holds them already; True when this
    call made the file. A file of that name with other bytes is refused, never replaced: an
    item, or an earlier output, may point to it."""
    path = Path(path)
    if path.is_symlink() or path.exists():
        if path.is_file() and not path.is_symlink() and path.read_bytes() == data:
            return False
        raise error(
            f"{path} exists and does not hold the picture its name promises (its SHA-256); lad "
            "never replaces a file an item may point to: move it away or choose another folder"
        )
    write_bytes(path, data)
    return True


# ---------------------------------------------------------------- paths named by data files


def _resolved(root: PathLike, path: PathLike) -> tuple[Path, Path | None]:
    """`root` resolved, and `path` below it resolved (None: empty, missing, a symlink loop, a NUL
    byte)."""
    base = Path(root).resolve()
    text = os.fspath(path)
    if not text.strip():
        return base, None
    try:
        return base, (base / text).resolve(strict=True)
    except (OSError, RuntimeError, ValueError):
        return base, None


def inside(root: PathLike, path: PathLike) -> Path | None:
    """`path`, as a data file names it relative to `root`, resolved (symlinks followed), if it
    is a file inside `root`; None when it is missing or lies outside (an absolute path, `..`, a
    symlink out of the folder). The one rule for every path a data file names."""
    base, found = _resolved(root, path)
    return found if found and found.is_relative_to(base) and found.is_file() else None


def outside(root: PathLike, path: PathLike) -> bool:
    """True when `path`, relative to `root`, exists but resolves outside it (`inside` refuses
    it for that reason, not because it is missing)."""
    base, found = _resolved(root, path)
    return found is not None and not found.is_relative_to(base)


def child(root: PathLike, name: str, error: type[LadError] = LadError, what: str = "") -> Path:
    """`root / name` for a name data or config gave (a suite's model, a task), refused as `error`
    (`what` prefixes it) unless one plain file name: not empty, `.` or `..`, no separator or
    control character, short enough. The rule for every file lad names after data."""
    text = str(name)
    unsafe = any(ord(c) < 32 or ord(c) == 127 or c in "/\\" for c in text)
    if text in ("", ".", "..") or unsafe or len(text.encode("utf-8", "replace")) > _NAME_MAX:
        raise error(
            f"{what}{text!r} cannot name a file or folder: lad names files after data only by "
            "plain names (no '/', '..' or control characters), so nothing lands outside "
            f"{root}"
        )
    return Path(root) / text


def below(root: PathLike, path: str, error: type[LadError] = LadError, what: str = "") -> Path:
    """`root / path` for a relative path config gave (a suite's `questions`), refused as `error`
    unless below `root` as written: not absolute, no `..` (symlinks are the user's layout)."""
    if Path(path).is_absolute() or ".." in Path(path).parts or "\0" in str(path):
        raise error(
            f"{what}{path!r} is not a path below {root}: a suite names its files relative to "
            "the benchmark's folder (no absolute path, no '..')"
        )
    return Path(root) / path


def read_json(path: PathLike, error: type[LadError] = LadError, what: str = "JSON file") -> Any:
    """Parse a JSON file; a missing file, a folder, non-UTF-8 bytes or bad JSON is `error`
    naming the file (and the line)."""
    try:
        return loads_json(read_text(path, error, what), error, f"{path}: ")
    except json.JSONDecodeError as e:
        raise error(f"{path}: not valid JSON ({e.msg}, line {e.lineno})") from None


def loads_json(text: str | bytes, error: type[LadError], where: str) -> Any:
    """`json.loads`, with JSON nested deeper than Python can recurse refused as `error` (its
    message starting with `where`); bad JSON is still `json.JSONDecodeError`, which each reader
    words for its format. Every JSON lad reads from a user's file goes through here."""
    try:
        return json.loads(text)
    except RecursionError:
        raise error(
            f"{where}JSON nested too deeply to read (more than {sys.getrecursionlimit()} levels "
            "of lists or objects); no file lad reads nests so"
        ) from None


# A file's first bytes that say it is not text: a reader of JSON or text names the format.
_BINARY_FORMATS = {
    b"PAR1": "a Parquet file",
    b"PK\x03\x04": "a ZIP archive",
    b"\x1f\x8b": "a gzip file",
    b"\x89PNG": "a PNG image",
    b"\xff\xd8\xff": "a JPEG image",
}


def _a(what: str) -> str:
    return f"{'an' if what[0] in 'aeiou' else 'a'} {what}"


def read_text(path: PathLike, error: type[LadError] = LadError, what: str = "text file") -> str:
    """A UTF-8 text file's text; a missing file, a folder, a binary format or non-UTF-8 bytes is
    `error` naming the file (and where). The file becomes an input of the running command."""
    path = Path(path)
    if path.is_dir():
        raise error(f"{path}: is a folder, not {_a(what)}")
    if not path.is_file():
        raise error(f"{path}: no such {what}")
    note_input(path)
    data = path.read_bytes()
    for magic, kind in _BINARY_FORMATS.items():
        if data.startswith(magic):
            raise error(f"{path}: is {kind}, not {_a(what)} (UTF-8 text)")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise error(
            f"{path}: not UTF-8 text (byte {data[e.start]:#04x}, line {line}); {_a(what)} must be "
            "saved as UTF-8"
        ) from None


_TYPE_NAMES = {str: "a string", int: "an integer", list: "a list"}


def check_object(
    obj: Any, kinds: Mapping[str, type], where: str, error: type[LadError], hint: str = ""
) -> None:
    """`obj` (parsed JSON) is an object holding each key of `kinds` with that type (a bool is not
    an integer), else `error` prefixed by `where`; `hint` follows the missing-key message."""
    if not isinstance(obj, dict):
        raise error(f"{where}expected a JSON object, got {type(obj).__name__}")
    for key, kind in kinds.items():
        if key not in obj:
            raise error(f"{where}missing key {key!r}{hint}")
        value = obj[key]
        if not isinstance(value, kind) or isinstance(value, bool):
            raise error(f"{where}{key!r} must be {_TYPE_NAMES[kind]}, got {value!r}")


def drop_partial_line(path: Path) -> None:
    """Cut off a last line left without its newline by an interrupted write."""
    if not path.is_file() or path.stat().st_size == 0:
        return
    with path.open("rb+") as f:
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
            if m[-1:] == b"\n":
                return
            keep = m.rfind(b"\n") + 1
        f.truncate(keep)


# ---------------------------------------------------------------- inputs are never outputs


class InputPath(str):
    """A command-line value naming a file or folder the command reads (an argparse type)."""


class OutputPath(str):
    """A command-line value naming a file or folder the command writes (an argparse type)."""


@dataclass
class _Guard:
    """The running command's files: its inputs (declared, or read since it started), keyed by
    resolved path and by (device, inode) for hard links, each with how the user named it; and its
    declared outputs (files or folders it may read back and rewrite, such as a run directory)."""

    outputs: list[Path]
    by_path: dict[Path, tuple[str, Path]] = field(default_factory=dict)
    by_inode: dict[tuple[int, int], tuple[str, Path]] = field(default_factory=dict)

    def add(self, name: str, path: Path) -> None:
        self.by_path.setdefault(path.resolve(), (name, path))
        if (inode := _inode(path)) is not None:
            self.by_inode.setdefault(inode, (name, path))

    def find(self, path: Path) -> tuple[str, Path] | None:
        return self.by_path.get(path.resolve()) or self.by_inode.get(_inode(path))


_guard: _Guard | None = None


def _flatten(files: Mapping[str, PathLike | Iterable[PathLike] | None]) -> list[tuple[str, Path]]:
    return [
        (name, Path(p))
        for name, value in files.items()
        if value is not None
        for p in ([value] if isinstance(value, (str, os.PathLike)) else value)
    ]


@contextmanager
def guarding(
    inputs: Mapping[str, PathLike | Iterable[PathLike] | None],
    outputs: Mapping[str, PathLike | None],
) -> Iterator[None]:
    """Run a command that reads `inputs` and writes `outputs` (keys: how the user named each,
    e.g. "--out", "its calibration file"). Refused at once: an output that is an input or
    another output. While the block runs, writing any input is refused (`check_destination`)."""
    global _guard
    check_not_inputs(outputs, inputs)
    declared = [(k, Path(v)) for k, v in outputs.items() if v is not None]
    for name, path in declared:
        check_name_fits(name, path)
    _refuse_same(itertools.combinations(declared, 2), "a command writes each of its files once")
    guard = _Guard([path for _, path in declared])
    for name, path in _flatten(inputs):
        guard.add(name, path)
    previous, _guard = _guard, guard
    try:
        yield
    finally:
        _guard = previous


def check_name_fits(name: str, path: Path) -> None:
    """Each part of `path` fits its file system's name length, so that a command writing several
    files is refused before the first, not after it (`name`: the flag)."""
    folder = Path(path.absolute().anchor)  # the deepest folder of `path` that exists
    for part in path.absolute().parts[1:]:
        limit = os.pathconf(folder, "PC_NAME_MAX")
        if len(os.fsencode(part)) > limit:
            raise LadError(
                f"{name} {path}: the name {part[:40]}… is longer than the {limit} bytes a file "
                "name may have here; choose a shorter one"
            )
        if (folder / part).is_dir():
            folder = folder / part


def note_input(path: PathLike) -> None:
    """`path` is read by the running command: from now on it may not be written, unless it lies
    in one of the command's declared outputs (a run directory read back on resume)."""
    if _guard is None:
        return
    path = Path(path)
    if not any(_same(path, out) or _within(path, out) for out in _guard.outputs):
        _guard.add("input", path)


def check_destination(path: PathLike) -> None:
    """Refuse to write `path` when it is one of the running command's inputs."""
    if found := _guard and _guard.find(Path(path)):
        name, given = found
        raise LadError(
            f"{path} is the same file as {name} {given}: lad never writes over the files a "
            "command reads; choose another output"
        )


def _within(path: Path, folder: Path) -> bool:
    try:
        return path.resolve().is_relative_to(folder.resolve())
    except OSError:
        return False


def _inode(path: Path) -> tuple[int, int] | None:
    """(device, inode) of the file at `path`, one for all its hard links; None when none."""
    try:
        st = path.stat()
    except (OSError, ValueError):
        return None
    return st.st_dev, st.st_ino


def _same(a: Path, b: Path) -> bool:
    """The same file: the same resolved path, or hard links to one inode."""
    inode = _inode(a)
    return a.resolve() == b.resolve() or (inode is not None and inode == _inode(b))


def check_not_inputs(
    outputs: Mapping[str, PathLike | None],
    inputs: Mapping[str, PathLike | Iterable[PathLike] | None],
) -> None:
    """Refuse an output that is one of the inputs, however spelled (`./x` and `x`, a symlink or
    a hard link to it). Keys are how the user named each path, e.g. "--out", "--records"."""
    pairs = itertools.product(outputs.items(), _flatten(inputs))
    _refuse_same(pairs, "lad never writes over its inputs")


def _refuse_same(pairs: Iterable[tuple[tuple[str, Any], tuple[str, Path]]], why: str) -> None:
    """Refuse the first pair ((name, output), (name, path)) that is one file, saying `why`."""
    for (name, path), (other, where) in pairs:
        if path is not None and _same(Path(path), where):
            # The flag that chooses the output: its own, or --out for a file beside --out's.
            flag = name.split()[0] if name.startswith("--") else "--out"
            raise LadError(
                f"{name} {path} is the same file as {other} {where}: {why}; choose another {flag}"
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
    if path.is_symlink() and not path.exists():
        raise LadError(
            f"{flag} {text} is a symlink to {os.readlink(path)}, which does not exist; create "
            "that folder or give another path"
        )
    if path.exists() and not path.is_dir():
        raise LadError(f"{flag} {text} is a file, not a folder; give a folder path")
    check_writable(path, flag, text)
    return path


def check_writable(folder: Path, flag: str, text: PathLike) -> None:
    """The nearest existing folder at or above `folder` must accept new files."""
    probe = folder
    while not probe.exists() and probe.parent != probe:
        probe = probe.parent
    if probe.exists() and not probe.is_dir():
        raise LadError(f"{flag} {text}: {probe} is a file, so no folder can be made there")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise LadError(f"{flag} {text}: cannot write in {probe} (read-only or no permission)")
