"""Input preparation overlapped with the model (docs/backends.md, "Input pipeline").

`prefetched` prepares the next batches in worker threads (PIL, the image processors and the Rust
tokenizer release the GIL) and hands them over in batch order; an error surfaces when its batch
is reached, as on the serial path. `ProcessorPool` gives each worker its own processor: a fast
tokenizer's padding/truncation state is shared and mutated per call.
"""

from __future__ import annotations

import copy
import queue
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any, TypeVar

B = TypeVar("B")
P = TypeVar("P")


def prefetched(batches: Iterable[B], prepare: Callable[[B], P], *, ahead: int = 2) -> Iterator[P]:
    """prepare(batch) for each batch, in order, with up to `ahead` batches prepared in advance by
    as many worker threads; ahead=0 prepares each batch in the caller's thread when it is due
    (a negative `ahead`: the pool's ValueError; Backend.records refuses one first)."""
    if ahead == 0:
        for batch in batches:
            yield prepare(batch)
        return
    pending: deque[Future[P]] = deque()
    pool = ThreadPoolExecutor(max_workers=ahead, thread_name_prefix="lad-prepare")
    try:
        for batch in batches:
            pending.append(pool.submit(prepare, batch))
            if len(pending) > ahead:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()
    finally:  # batches not started are cancelled
        pool.shutdown(wait=True, cancel_futures=True)


class ProcessorPool:
    """Copies of one processor, each used by one thread at a time (made on first need).

    lock: held by whoever uses the original processor while workers may run (deep copies too).
    """

    def __init__(self, processor: Any) -> None:
        self.processor = processor
        self.lock = threading.Lock()
        self._free: queue.SimpleQueue[Any] = queue.SimpleQueue()

    @contextmanager
    def borrowed(self) -> Iterator[Any]:
        try:
            proc = self._free.get_nowait()
        except queue.Empty:
            with self.lock:
                proc = copy.deepcopy(self.processor)
        try:
            yield proc
        finally:
            self._free.put(proc)
