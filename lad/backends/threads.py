"""How many threads torch's CPU kernels use for lad's work (docs/backends.md, "CPU threads").

torch starts one intra-op thread per core and every kernel waits for all of them; when other
processes keep cores busy, each kernel waits for a thread the system has descheduled, and a
run on a loaded 2-core machine slows several times over (benchmarks/bench_threads.py measures
it). lad therefore uses the cores that are free when the model loads.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping

ENV = "LAD_NUM_THREADS"


def available_cpus() -> int:
    """The CPUs this process may run on (its affinity mask; os.cpu_count where there is none)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def busy_cpus() -> float:
    """CPUs other work keeps busy: the 1-minute load average (0 where the system has none)."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return 0.0


def choose_threads(environ: Mapping[str, str], cpus: int, busy: float) -> int | None:
    """torch's intra-op thread count for lad's CPU work, or None to leave torch's own choice.

    LAD_NUM_THREADS=N (a whole number >= 1): N. Else, with OMP_NUM_THREADS set, None: torch
    already follows it. Else the CPUs this process may use less those busy with other work
    (rounded down to whole CPUs), at least 1.
    """
    text = environ.get(ENV, "").strip()
    if text:
        from lad.errors import LadError

        if not text.isdigit() or int(text) < 1:
            raise LadError(f"{ENV} must be a whole number >= 1. Got {text!r}.")
        return int(text)
    if environ.get("OMP_NUM_THREADS", "").strip():
        return None
    return max(1, min(cpus, cpus - math.ceil(busy - 0.5)))


def set_cpu_threads() -> int:
    """Set torch's intra-op threads as `choose_threads` says; return the count in use."""
    import torch

    chosen = choose_threads(os.environ, available_cpus(), busy_cpus())
    if chosen is not None and chosen != torch.get_num_threads():
        torch.set_num_threads(chosen)
    return torch.get_num_threads()
