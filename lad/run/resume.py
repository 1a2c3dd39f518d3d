"""Records files made batch by batch and resumed: a rerun continues after the last whole batch,
so an interrupted and resumed run writes the same bytes as an uninterrupted one; and the shards
of a run split over several processes (`World`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

from lad.core.records import (
    Record,
    RecordSet,
    RecordWriter,
    drop_partial_line,
    read_records,
    write_records,
)
from lad.data.orders import Request
from lad.errors import RunError


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
    """Make the records of `requests` that `path` does not hold yet; return all of them. The
    progress bar shows the running accuracy of the records' argmax as `acc_label` (None: not
    shown). `make_records(requests)` yields one record per request, in order (it loads the model
    only when called, so a finished stage never touches it).

    Under K processes each writes its own shard `path.shard{r}of{K}.jsonl` (resumable on its
    own); the main process then merges them, in request order, into `path`.
    """
    world = world or World()
    _check_shards(path, world.size, len(requests))

    def make(mine: Sequence[Request], into: Path, where: str) -> None:
        start = resume_point(into, mine, batch_size)
        if start == len(mine):
            return
        made = make_records(mine[start:])
        with (
            RecordWriter(into) as writer,
            tqdm(total=len(mine), initial=start, desc=where, disable=quiet) as bar,
        ):
            correct = 0
            for done, rec in enumerate(made, 1):
                writer.write(rec)
                correct += int(np.argmax(rec.logprobs) == rec.answer)
                if acc_label:
                    bar.set_postfix_str(f"{acc_label} {100 * correct / done:.1f}%", refresh=False)
                bar.update()

    if world.size == 1:
        make(requests, path, desc)
        return read_records(path)
    if not (path.exists() and len(read_records(path)) == len(requests)):
        count = len(requests)
        batches = [range(i, min(i + batch_size, count)) for i in range(0, count, batch_size)]
        mine = [requests[i] for b in batches[world.rank :: world.size] for i in b]
        make(mine, _shard_path(path, world.rank, world.size), f"{desc} [{world.rank}/{world.size}]")
        world.barrier()
        if world.is_main:
            _merge_shards(path, world.size, batches)
    world.barrier()
    return read_records(path)


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
        write_records(path, done.select(np.arange(keep)))
    return keep


# ---------------------------------------------------------------- shards


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
    """The shards' records in request order: batch b is the next of shard b mod K's."""
    shards = [iter(read_records(_shard_path(path, r, size)).to_records()) for r in range(size)]
    write_records(path, [next(shards[b % size]) for b, batch in enumerate(batches) for _ in batch])
    for r in range(size):
        _shard_path(path, r, size).unlink()
