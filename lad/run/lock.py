"""One `lad eval` at a time in a run directory (`RunLock`)."""

from __future__ import annotations

import fcntl
import json
import os
import socket
import sys
import time
from pathlib import Path

from lad.errors import RunError

LOCK_NAME = "run.lock"


class RunLock:
    """An exclusive flock on `run.lock`, which holds the holder's pid, host and start time so a
    second run can say who has it. The kernel releases a flock when its process dies, so a lock
    file left by a killed run is taken over (with a message); a finished run removes the file."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / LOCK_NAME
        self._fd: int | None = None

    def __enter__(self) -> RunLock:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _holder_text(os.pread(fd, 4096, 0))
                os.close(fd)
                raise in_use(self.run_dir, holder) from None
            if _still_there(fd, self.path):
                break
            os.close(fd)  # a finishing holder removed the file we opened: lock the new one
        left = os.read(fd, 4096)
        if left.strip():
            print(
                f"Note: {self.run_dir}: taking over the lock left by {_holder_text(left)}, "
                "which no longer runs",
                file=sys.stderr,
            )
        mine = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "since": time.strftime("%Y-%m-%d %H:%M:%S %z"),
        }
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(mine) + "\n").encode(), 0)
        self._fd = fd
        return self

    def __exit__(self, *exc: object) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            self.path.unlink(missing_ok=True)
            os.close(fd)


def in_use(run_dir: Path, holder: str) -> RunError:
    return RunError(
        f"{run_dir} is in use by another lad eval ({holder}); wait for it to finish, or use "
        "another --out"
    )


def running_holder(run_dir: Path) -> str | None:
    """Who holds `run_dir`'s lock now (a lad eval still writing it), or None. Tested with a
    shared lock taken and dropped at once, so a finished or killed run reads as free."""
    path = Path(run_dir) / LOCK_NAME
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return _holder_text(os.pread(fd, 4096, 0))
    except OSError:
        return None
    finally:
        os.close(fd)  # closing drops a lock taken here
    return None


def _still_there(fd: int, path: Path) -> bool:
    try:
        return os.fstat(fd).st_ino == os.stat(path).st_ino
    except FileNotFoundError:
        return False


def _holder_text(data: bytes) -> str:
    try:
        who = json.loads(data)
        return f"pid {who['pid']} on host {who['host']}, since {who['since']}"
    except (ValueError, KeyError, TypeError, RecursionError):
        return "a process that has not written its pid yet"
