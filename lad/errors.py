"""Every error lad raises on purpose. The CLI turns these into `Error: ...` and exit code 1."""

from __future__ import annotations

import errno
from collections.abc import Collection


class LadError(Exception):
    """Base class: a user mistake or bad input, reported without a traceback."""


class DataError(LadError):
    """A benchmark items file, an image or a dataset annotation is missing or malformed."""


class RecordError(LadError):
    """A records / predictions file breaks its format (docs/formats.md)."""


class CalibrationError(LadError):
    """A calibration set is incomplete, or does not fit the records it is applied to."""


class BackendError(LadError):
    """A model cannot be loaded, prompted or captured as lad needs."""


class RunError(LadError):
    """A run directory holds work from other arguments, or is otherwise unusable."""


class SettingError(LadError):
    """A setting's value refused, its message beginning with the library's parameter (top_k
    ...); lad.cli.main begins it with the flag instead where the command has one (--top-k ...)."""

    @property
    def name(self) -> str:
        return str(self).split(" ", 1)[0]


def check_choice(
    name: str, value: object, allowed: Collection[str], error: type[LadError] = LadError
) -> None:
    """Refuse a parameter's `value` unless one of `allowed` (listed in that order)."""
    if value not in allowed:
        raise bad_parameter(name, f"one of {list(allowed)}", value, error, instead=True)


def bad_parameter(
    name: str, must: str, value: object, error: type[LadError] = LadError, *, instead: bool = False
) -> LadError:
    """The one wording of a refused parameter: "The 'name' parameter must be <must>. Got ..."."""
    return error(f"The '{name}' parameter must be {must}. Got {value!r}{' instead' * instead}.")


def at(path: object, line: int | None = None) -> str:
    """Location prefix for messages: 'file.jsonl:12: '."""
    return f"{path}:{line}: " if line is not None else f"{path}: "


def os_error_message(e: OSError) -> str:
    """One line for a failure of the machine rather than of lad's input: full disk, read-only
    folder, missing permission."""
    where = f"{e.filename}: " if e.filename else ""
    text = f"{where}{e.strerror or e}"
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        return f"{text}. Free some space and rerun the same command: what was written is kept."
    if e.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return f"{text}. Choose a folder lad may write in (--out), or fix its permissions."
    return text
