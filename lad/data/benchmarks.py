"""The released benchmarks `lad data` converts and lmms-eval's tasks are adapted from: one
module each (its rule, `choose`, and its `BENCHMARK`), registered here by one line."""

from __future__ import annotations

from lad.data import blink, mmiu, muirbench
from lad.data.questions import Benchmark

BENCHMARKS: dict[str, Benchmark] = {
    b.name: b for b in (mmiu.BENCHMARK, muirbench.BENCHMARK, blink.BENCHMARK)
}
