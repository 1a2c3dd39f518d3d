"""The run directory of `lad eval`: its lock, run.json, resuming a records file, and the shards
of a run split over several processes.

Records are appended batch by batch as the model makes them; a rerun continues after the last
whole batch, so an interrupted and resumed run writes the same bytes as an uninterrupted one.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import socket
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from lad.errors import RunError
from lad.files import read_json, write_text
from lad.records import Record, RecordSet, RecordWriter, drop_partial_line, read_records

RUN_FORMAT = "lad-run/1"
LOCK_NAME = "run.lock"
# How records are made from the same arguments; bumped when lad would now make other records, so a
# run begun by an older lad is never extended with records that do not match its own (1: labels
# tokenised glued to the prompt; 2: labels as the chat template writes the reply).
RECORDS_VERSION = 2
# (item, ordering, order): one prompt to make a record of (lad.evaluate builds them).
Request = tuple[Any, int, list[int]]


# ---------------------------------------------------------------- lock


class RunLock:
    """One `lad eval` at a time in a run directory.

    An exclusive flock on `run.lock`, which holds the holder's pid, host and start time so a
    second run can say who has it. The kernel releases a flock when its process dies, so a lock
    file left by a killed run is taken over (with a message); a finished run removes the file.
    """

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
                holder = _holder(fd)
                os.close(fd)
                raise RunError(
                    f"{self.run_dir} is in use by another lad eval ({holder}); wait for it to "
                    f"finish, or use another --out"
                ) from None
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
        mine = {"pid": os.getpid(), "host": socket.gethostname(), "since": _now()}
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(mine) + "\n").encode(), 0)
        self._fd = fd
        return self

    def __exit__(self, *exc: object) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            self.path.unlink(missing_ok=True)
            os.close(fd)


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
        return _holder(fd)
    except OSError:
        return None
    finally:
        os.close(fd)  # closing drops a lock taken here
    return None


def _now() -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S %z")


def _still_there(fd: int, path: Path) -> bool:
    try:
        return os.fstat(fd).st_ino == os.stat(path).st_ino
    except FileNotFoundError:
        return False


def _holder(fd: int) -> str:
    return _holder_text(os.pread(fd, 4096, 0))


def _holder_text(data: bytes) -> str:
    try:
        who = json.loads(data)
        return f"pid {who['pid']} on host {who['host']}, since {who['since']}"
    except (ValueError, KeyError, TypeError):
        return "a process that has not written its pid yet"


# ---------------------------------------------------------------- run.json


# Arguments that name a file or folder: `./data/x.jsonl` and `data/x.jsonl` are the same one.
PATH_ARGUMENTS = ("model", "data", "calibration_data", "calibration", "orders", "chat_template")


def fingerprint(path: str | Path, images: Iterable[Path] = ()) -> dict[str, Any]:
    """What run.json keeps of an input file: the SHA-256 of its bytes and, for each image it
    lists, the image's size and modification time (not its bytes, which would mean reading
    every image on every rerun), keyed by the image's path relative to the file's folder."""
    path = Path(path)
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    stats = {}
    for image in dict.fromkeys(images):
        st = image.stat()
        stats[os.path.relpath(image, path.parent)] = f"{st.st_size} {st.st_mtime_ns}"
    out: dict[str, Any] = {"path": str(path.resolve()), "sha256": digest}
    if stats:
        out["images"] = stats
    return out


def check_run_dir(
    run_dir: Path,
    arguments: dict[str, Any],
    defaults: dict[str, Any],
    inputs: dict[str, dict[str, Any]] | None = None,
) -> None:
    """Create run.json holding the record-defining `arguments` and the `inputs`' fingerprints,
    or check that an existing one was made with the same arguments from the same inputs.

    An argument missing from an older run.json was made with its value in `defaults`. A run.json
    under which no record was made yet (a run that failed at its start) does not bind: it is
    replaced.
    """
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / "run.json"
    wanted = {"format": RUN_FORMAT, "arguments": json.loads(json.dumps(arguments))}
    wanted["inputs"] = inputs or {}
    wanted["records_version"] = RECORDS_VERSION
    if path.exists():
        stored = _read_run_json(path)
        try:
            _check_same(run_dir, stored, wanted, json.loads(json.dumps(defaults)))
            return
        except RunError:
            if made_records(run_dir):
                raise
    write_text(path, json.dumps(wanted, indent=2) + "\n")


def _read_run_json(path: Path) -> dict[str, Any]:
    stored = read_json(path, RunError, "run.json")
    if not isinstance(stored, dict) or stored.get("format") != RUN_FORMAT:
        got = stored.get("format") if isinstance(stored, dict) else type(stored).__name__
        raise RunError(f"{path}: not a lad run (format {got!r}); use another --out")
    if not isinstance(stored.get("arguments"), dict) or not isinstance(
        stored.get("inputs", {}), dict
    ):
        raise RunError(f"{path}: damaged ('arguments' must be an object); use another --out")
    return stored


def _check_same(
    run_dir: Path, stored: dict[str, Any], wanted: dict[str, Any], defaults: dict[str, Any]
) -> None:
    made_from, now_from = stored.get("inputs", {}), wanted["inputs"]
    for name, value in wanted["arguments"].items():
        made = stored["arguments"].get(name, defaults.get(name))
        if name in made_from and name in now_from:
            continue  # a fingerprinted file: its content decides, not how its path is spelled
        if made != value and not (name in PATH_ARGUMENTS and _same_path(made, value)):
            flag = "--" + name.replace("_", "-")
            raise RunError(
                f"{run_dir} was made with {flag} {made!r}, not {value!r}. "
                "Rerun with the same arguments to resume, or use another --out."
            )
    for name, now in now_from.items():
        before = made_from.get(name)
        if before is None:
            continue  # a run.json from before lad kept fingerprints
        flag = "--" + name.replace("_", "-")
        if before.get("sha256") != now["sha256"]:
            raise RunError(
                f"{now['path']} ({flag}) changed since {run_dir} was made from it: its records "
                "would be stale. Rerun with the file as it was, or use another --out."
            )
        folder = Path(now["path"]).parent
        old_images = before.get("images", {})
        for image, stat in now.get("images", {}).items():
            if old_images.get(image, stat) != stat:
                raise RunError(
                    f"{folder / image}: changed since {run_dir} was made (its size or "
                    f"modification time differ), so its records would be stale. Restore it, "
                    "or use another --out."
                )


def check_records_version(run_dir: Path) -> None:
    """Refuse to add records to a run whose records an older lad made another way (the two would
    mix in one run); its finished records can still be rescored without the model."""
    stored = _read_run_json(run_dir / "run.json")
    made = stored.get("records_version", 1)
    if made != RECORDS_VERSION and made_records(run_dir):
        raise RunError(
            f"{run_dir} holds records made by an older lad (records version {made}; this lad "
            f"makes version {RECORDS_VERSION}, whose label probabilities differ for models whose "
            "chat template writes a space before the reply): it can be rescored, not extended. "
            "Finish it with the lad that began it, or use another --out."
        )


def _same_path(a: Any, b: Any) -> bool:
    return isinstance(a, str) and isinstance(b, str) and os.path.normpath(a) == os.path.normpath(b)


def made_records(run_dir: Path) -> bool:
    """Whether any records file in the run directory holds a record."""
    files = [*run_dir.glob("*.jsonl"), *run_dir.glob("sofa_grid/*.jsonl")]
    return any(p.is_file() and p.stat().st_size > 0 for p in files)


def add_times(run_dir: Path, seconds: dict[str, float]) -> None:
    """Add wall times (seconds per stage) to run.json's "timing", the sum over every session that
    worked on a stage. It sits beside "arguments", so a rerun's check never compares it."""
    path = run_dir / "run.json"
    stored = json.loads(path.read_text())
    timing = stored.setdefault("timing", {})
    for stage, s in seconds.items():
        timing[stage] = round(timing.get(stage, 0.0) + s, 3)
    write_text(path, json.dumps(stored, indent=2) + "\n")


def set_threads(run_dir: Path, threads: dict[str, Any]) -> None:
    """Write run.json's "threads" (lad.backends.threads.record_choice), beside "arguments"."""
    path = run_dir / "run.json"
    stored = json.loads(path.read_text())
    stored["threads"] = threads
    write_text(path, json.dumps(stored, indent=2) + "\n")


def recorded_threads(run_dir: Path) -> Any:
    """run.json's "threads": the CPU threads its records were made with (None on an accelerator,
    or for a run from before lad recorded them)."""
    return json.loads((run_dir / "run.json").read_text()).get("threads")


def stage_times(run_dir: Path) -> dict[str, float]:
    """run.json's "timing" (empty for a run made before lad recorded it)."""
    return json.loads((run_dir / "run.json").read_text()).get("timing", {})


# ---------------------------------------------------------------- processes


@dataclass(frozen=True)
class World:
    """The processes of one run, as `accelerate launch` or `torchrun` set them in the environment.

    Work is split by whole batches, batch b going to rank b mod K, so every batch is padded exactly
    as in a single-process run and the merged records are the same whatever K is.
    """

    rank: int = 0
    size: int = 1
    local_rank: int = 0

    @classmethod
    def from_env(cls) -> World:
        env = os.environ
        return cls(
            int(env.get("RANK", 0)), int(env.get("WORLD_SIZE", 1)), int(env.get("LOCAL_RANK", 0))
        )

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def barrier(self) -> None:
        if self.size == 1:
            return
        import torch.distributed as dist

        if not dist.is_initialized():
            dist.init_process_group("gloo", rank=self.rank, world_size=self.size)
        dist.barrier()

    def device(self, device: str) -> str:
        if device == "auto" and self.size > 1:
            import torch

            if torch.cuda.is_available():
                return f"cuda:{self.local_rank}"
        return device


# ---------------------------------------------------------------- records files


def run_stage(
    path: Path,
    requests: Sequence[Request],
    make_records: Callable[[Sequence[Request]], Iterator[Record]],
    *,
    batch_size: int,
    desc: str,
    quiet: bool = False,
    world: World | None = None,
    acc_label: str | None = "vanilla acc",
) -> RecordSet:
    """Make the records of `requests` that `path` does not hold yet; return all of them.
    The progress bar shows the running accuracy of the records' argmax as `acc_label` (None:
    not shown, for records whose prediction is not that argmax).

    `make_records(requests)` yields one record per request, in order (it loads the model only
    when called, so a finished stage never touches it).

    Under K processes each writes its own shard `path.shard{r}of{K}.jsonl` (resumable on its
    own); the main process then merges them, in request order, into `path`.
    """
    world = world or World()
    _check_shards(path, world.size, len(requests))

    def make(mine: Sequence[Request], into: Path, where: str) -> None:
        _append_records(into, mine, make_records, batch_size, where, quiet, acc_label)

    if world.size == 1:
        make(requests, path, desc)
        return read_records(path)
    if not (path.exists() and len(read_records(path)) == len(requests)):
        batches = _batch_ranges(len(requests), batch_size)
        mine = [requests[i] for b in batches[world.rank :: world.size] for i in b]
        make(mine, _shard_path(path, world.rank, world.size), f"{desc} [{world.rank}/{world.size}]")
        world.barrier()
        if world.is_main:
            _merge_shards(path, world.size, batches)
    world.barrier()
    return read_records(path)


def _append_records(
    path: Path,
    requests: Sequence[Request],
    make_records: Callable[[Sequence[Request]], Iterator[Record]],
    batch_size: int,
    desc: str,
    quiet: bool,
    acc_label: str | None = "vanilla acc",
) -> None:
    start = resume_point(path, requests, batch_size)
    if start == len(requests):
        return
    made = make_records(requests[start:])
    with (
        RecordWriter(path) as writer,
        tqdm(total=len(requests), initial=start, desc=desc, disable=quiet) as bar,
    ):
        correct = 0
        for done, rec in enumerate(made, 1):
            writer.write(rec)
            correct += int(np.argmax(rec.logprobs) == rec.answer)
            if acc_label:
                bar.set_postfix_str(f"{acc_label} {100 * correct / done:.1f}%", refresh=False)
            bar.update()


def resume_point(path: Path, requests: Sequence[Request], batch_size: int) -> int:
    """How many leading requests already have records in `path`.

    Only whole batches count: a batch cut off by an interruption is dropped and rerun, so a
    resumed run pads and batches exactly as an uninterrupted one and writes identical files.
    """
    drop_partial_line(path)
    done = read_records(path, missing_ok=True)
    if len(done) > len(requests):
        raise RunError(f"{path} holds {len(done)} records but this run makes {len(requests)}")
    for i, (item_id, ordering) in enumerate(zip(done.items, done.ordering, strict=True)):
        if (item_id, int(ordering)) != (requests[i][0].id, requests[i][1]):
            raise RunError(
                f"{path}: record {i + 1} is ({item_id!r}, ordering {ordering}), but this run's "
                f"request {i + 1} is ({requests[i][0].id!r}, ordering {requests[i][1]}); the file "
                "is from another run. Use another --out."
            )
    keep = len(done) if len(done) == len(requests) else len(done) - len(done) % batch_size
    if keep < len(done):
        write_records_prefix(path, done, keep)
    return keep


def write_records_prefix(path: Path, records: RecordSet, count: int) -> None:
    tmp = path.with_suffix(".tmp")
    with RecordWriter(tmp) as writer:
        for rec in records.select(np.arange(count)).to_records():
            writer.write(rec)
    tmp.replace(path)


# ---------------------------------------------------------------- shards


def _batch_ranges(count: int, batch_size: int) -> list[range]:
    return [range(i, min(i + batch_size, count)) for i in range(0, count, batch_size)]


def _shard_path(path: Path, rank: int, size: int) -> Path:
    return path.with_name(f"{path.stem}.shard{rank}of{size}{path.suffix}")


def _check_shards(path: Path, size: int, count: int) -> None:
    """Refuse to mix a partial run made with another number of processes."""
    others = [
        p
        for p in path.parent.glob(f"{path.stem}.shard*of*{path.suffix}")
        if size == 1 or not p.name.endswith(f"of{size}{path.suffix}")
    ]
    partial_single = size > 1 and path.exists() and len(read_records(path)) < count
    if others or partial_single:
        made = others[0].name if others else path.name
        raise RunError(
            f"{path.parent}: a partial run made with another number of processes is there "
            f"({made}); resume it with that many processes, or use another --out."
        )


def _merge_shards(path: Path, size: int, batches: list[range]) -> None:
    shards = [read_records(_shard_path(path, r, size)).to_records() for r in range(size)]
    taken = [0] * size
    tmp = path.with_suffix(".merging")
    with RecordWriter(tmp) as writer:
        for b, batch in enumerate(batches):
            rank = b % size
            for rec in shards[rank][taken[rank] : taken[rank] + len(batch)]:
                writer.write(rec)
            taken[rank] += len(batch)
    tmp.replace(path)
    for r in range(size):
        _shard_path(path, r, size).unlink()
