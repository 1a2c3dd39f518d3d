"""How many threads torch's CPU kernels use for lad's work (docs/backends.md, "CPU threads").

Every kernel waits for all of torch's intra-op threads, so a thread on a core that other work
keeps busy slows a run several times over: lad uses the cores free when the model loads, from a
short sample of the CPUs' idle time (the load average trails the machine by a minute).
"""

from __future__ import annotations

import functools
import math
import os
import platform
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from lad.errors import LadError, RunError

ENV = "LAD_NUM_THREADS"
MAX_THREADS = 4096  # past any CPU count; torch's own limit is a C int
THREADS_PER_CPU = 4  # LAD_NUM_THREADS' bound: a few per CPU this process may use, never more
SAMPLE_SECONDS = 0.25  # 25 clock ticks per CPU at Linux's 100 Hz: busy CPUs to ~0.05

# How a count was chosen (run.json's "threads", the wall-time line of `lad eval`).
BY_ENV = "LAD_NUM_THREADS"
BY_RESUME = "resumed run"
BY_OMP = "OMP_NUM_THREADS"
BY_SAMPLE = "measured free cores"
BY_LOAD = "load average"  # no /proc/stat to sample (not Linux)
BY_NOTHING = "all CPUs"  # neither /proc/stat nor a load average


@dataclass(frozen=True)
class ThreadChoice:
    """The intra-op thread count torch uses, how it was chosen (a BY_* above), and the CPUs other
    work kept busy where that was measured or read."""

    count: int
    chosen_by: str
    busy: float | None = None
    machine: dict[str, str] | None = field(default=None, compare=False)

    def as_json(self) -> dict[str, object]:
        out: dict[str, object] = {"count": self.count, "chosen_by": self.chosen_by}
        if self.busy is not None:
            out["busy_cpus"] = round(self.busy, 2)
        if self.machine is not None:
            out["machine"] = dict(self.machine)
        return out


def available_cpus() -> int:
    """The CPUs this process may run on (its affinity mask; os.cpu_count where there is none)."""
    return len(_affinity() or ()) or os.cpu_count() or 1


def _affinity() -> set[int] | None:
    """The CPU ids this process may run on; None where the system does not say (not Linux)."""
    return set(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None


def requested_threads(environ: Mapping[str, str]) -> int | None:
    """LAD_NUM_THREADS as a count, None where it is unset or empty."""
    text = environ.get(ENV, "").strip()
    if not text:
        return None
    # str.isdigit also accepts '²' and '٣', which int() refuses or reads as another number.
    if not re.fullmatch(r"[0-9]{1,5}", text) or not 1 <= int(text) <= MAX_THREADS:
        raise LadError(
            f"{ENV} must be a whole number >= 1 (ASCII digits 0-9, at most {MAX_THREADS}). "
            f"Got {text!r}."
        )
    cpus = available_cpus()
    if int(text) > THREADS_PER_CPU * cpus:
        raise LadError(
            f"{ENV}={int(text)} is more than {THREADS_PER_CPU} threads for each of the {cpus} "
            f"CPUs this process may use (at most {THREADS_PER_CPU * cpus}): threads past the "
            "CPUs only wait for them"
        )
    return int(text)


@functools.cache
def this_machine() -> dict[str, str]:
    """What decides how torch's CPU kernels round: the processor, the instruction set torch
    dispatches to, and torch's version. Records are byte-identical only where all three (and the
    thread count) are the same; elsewhere they agree to float tolerance (docs/formats.md)."""
    import torch

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            names = [line.partition(":")[2].strip() for line in f if line.startswith("model name")]
        cpu = names[0] if names else cpu
    except OSError:
        pass
    return {
        "cpu": cpu,
        "kernels": torch.backends.cpu.get_cpu_capability(),
        "torch": torch.__version__,
    }


def record_choice(recorded: dict[str, object] | None, choice: ThreadChoice) -> dict[str, object]:
    """run.json's "threads" once a session has loaded the model with `choice`.

    `recorded`: run.json's "threads" before, None for a run without records yet (or from before
    lad recorded threads). It holds the choice of the session that made the run's first records,
    the count a resume keeps, and the machine it ran on; under "then", each later session which
    used another count (LAD_NUM_THREADS) or ran on another machine: a resume that kept both leaves
    run.json as an unbroken run's. A run recorded before lad named the machine takes it as kept.
    """
    if recorded is None:
        return choice.as_json()
    machine = recorded.get("machine", choice.machine)
    if choice.count == recorded.get("count") and machine == choice.machine:
        return recorded
    later = recorded.get("then", [])
    return {**recorded, "then": [*(later if isinstance(later, list) else []), choice.as_json()]}


def resumed_threads(recorded: object, where: object) -> int | None:
    """The count a resumed run keeps (run.json's "threads", record_choice); None for none."""
    if recorded is None:
        return None
    count = recorded.get("count") if isinstance(recorded, dict) else None
    if type(count) is not int or not 1 <= count <= MAX_THREADS:
        raise RunError(
            f"{where}: damaged ('threads' must be {{\"count\": a whole number >= 1, ...}}, got "
            f"{recorded!r:.60}); remove 'threads' to choose the count afresh"
        )
    return count


def describe_threads(recorded: object) -> str:
    """run.json's "threads" in words, e.g. "2 CPU threads (measured free cores: 0.04 CPUs busy),
    then 1 CPU thread (LAD_NUM_THREADS)"; "" where there are none."""
    if not isinstance(recorded, dict):
        return ""
    later = recorded.get("then", [])
    said = []
    for entry in [recorded, *(later if isinstance(later, list) else [])]:
        if isinstance(entry, dict) and type(entry.get("count")) is int:
            count, busy = entry["count"], entry.get("busy_cpus")
            busy = f": {busy:.2f} CPUs busy" if isinstance(busy, (int, float)) else ""
            words = f"{count} CPU thread{'s' * (count != 1)} ({entry.get('chosen_by')}{busy})"
            machine, first = entry.get("machine"), recorded.get("machine")
            if isinstance(machine, dict) and isinstance(first, dict) and machine != first:
                words += f" on another machine ({machine.get('cpu')}, {machine.get('kernels')})"
            said.append(words)
    return ", then ".join(said)


# ---------------------------------------------------------------- measuring the busy CPUs


@dataclass(frozen=True)
class CpuTimes:
    """Clock ticks since boot: (idle, total) per CPU id, and this process's own CPU time."""

    cpus: dict[int, tuple[int, int]]
    own: int


def read_cpu_times(stat: str = "/proc/stat", own_stat: str = "/proc/self/stat") -> CpuTimes | None:
    """/proc/stat's per-CPU lines and /proc/self/stat's utime + stime; None where unreadable."""
    try:
        with open(stat, encoding="ascii") as f:
            lines = f.read().splitlines()
        with open(own_stat, encoding="ascii") as f:
            own = f.read().rpartition(")")[2].split()  # after the command's name: field 3 on
        cpus = {}
        for line in lines:
            name, _, rest = line.partition(" ")
            if re.fullmatch(r"cpu[0-9]+", name):
                # user nice system idle iowait irq softirq steal (guest is inside user)
                ticks = [int(x) for x in rest.split()[:8]]
                cpus[int(name[3:])] = (ticks[3] + ticks[4], sum(ticks))  # idle + iowait: free
        return CpuTimes(cpus, int(own[11]) + int(own[12]))  # utime, stime: fields 14, 15
    except (OSError, ValueError, IndexError):
        return None


def busy_between(before: CpuTimes, after: CpuTimes, ids: set[int]) -> float:
    """CPUs (of `ids`) that work other than this process kept busy between two readings."""
    busy, spans = 0.0, []
    for cpu in ids & before.cpus.keys() & after.cpus.keys():
        idle = after.cpus[cpu][0] - before.cpus[cpu][0]
        total = after.cpus[cpu][1] - before.cpus[cpu][1]
        if total > 0:
            busy += 1 - idle / total
            spans.append(total)
    if not spans:
        return 0.0
    own = (after.own - before.own) / (sum(spans) / len(spans))  # CPUs this process used
    return min(float(len(spans)), max(0.0, busy - own))


def measure_busy(
    seconds: float = SAMPLE_SECONDS,
    read: Callable[[], CpuTimes | None] = read_cpu_times,
    sleep: Callable[[float], None] = time.sleep,
) -> tuple[float, str]:
    """CPUs other work keeps busy now, and how that was found (BY_SAMPLE, BY_LOAD, BY_NOTHING)."""
    before = read()
    if before is not None:
        sleep(seconds)
        after = read()
        if after is not None:
            return busy_between(before, after, _affinity() or set(after.cpus)), BY_SAMPLE
    try:
        return os.getloadavg()[0], BY_LOAD
    except (AttributeError, OSError):
        return 0.0, BY_NOTHING


# ---------------------------------------------------------------- the choice


def plan_threads(
    environ: Mapping[str, str],
    cpus: int,
    measure: Callable[[], tuple[float, str]],
    resumed: int | None = None,
) -> tuple[int | None, str, float | None]:
    """(count or None to leave torch's own, how it was chosen, busy CPUs where measured).

    LAD_NUM_THREADS=N: N. Else a resumed run's first count (`resumed`), so its records do not
    depend on the load at each resume. Else, with OMP_NUM_THREADS set, torch's count (torch
    follows it). Else the CPUs this process may use less those `measure` finds busy with
    other work (rounded to whole CPUs, half down), at least 1.
    """
    wanted = requested_threads(environ)
    if wanted is not None:
        return wanted, BY_ENV, None
    if resumed is not None:
        return resumed, BY_RESUME, None
    if environ.get("OMP_NUM_THREADS", "").strip():
        return None, BY_OMP, None
    busy, how = measure()
    return max(1, min(cpus, cpus - math.ceil(busy - 0.5))), how, busy


def choose_threads(
    environ: Mapping[str, str], cpus: int, busy: float, resumed: int | None = None
) -> int | None:
    """plan_threads' count when `busy` CPUs are found busy."""
    return plan_threads(environ, cpus, lambda: (busy, BY_SAMPLE), resumed)[0]


def set_cpu_threads(
    resumed: int | None = None, measure: Callable[[], tuple[float, str]] | None = None
) -> ThreadChoice:
    """Set torch's intra-op threads as `plan_threads` says (`measure`: measure_busy); return the
    count in use and why."""
    import torch

    count, how, busy = plan_threads(os.environ, available_cpus(), measure or measure_busy, resumed)
    if count is not None and count != torch.get_num_threads():
        torch.set_num_threads(count)
    return ThreadChoice(torch.get_num_threads(), how, busy, this_machine())
