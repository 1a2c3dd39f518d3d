"""lad's position audit inside Inspect (inspect_ai; docs/harness.md, "lad inside Inspect").

    inspect eval task.py --model openai/gpt-4o-mini      # a task with circular(), position()
    inspect eval mytask --solver lad/circular            # any multiple_choice task, then
    inspect score LOG --scorer lad/position              # lad's metrics of its log

`circular()` asks a sample of a `multiple_choice` task under all N cyclic shifts of its choices
(lad.data.items.cyclic_shift: at shift s, position p shows the original choice (p + s) mod N, as
`lad eval` and lad's circular harness tasks shift them; for N = 2 the two orders of a pairwise
judgment). Each shift runs the task's own multiple-choice solver (Inspect's `multiple_choice()`
unless another is given) on a fresh copy of the sample's messages, so any model Inspect runs
answers, API models included. The unshifted asking runs last and is what the sample keeps
(messages, output, the marked choices), so Inspect's own `choice()` scorer still scores the
original order. Each shift leaves lad's audit row {item, ordering, order, answer, prediction}
(lad.harness.audit) in the sample's store.

`position()` turns a sample's rows into its score (correct when right under every shift:
CircularEval; the answer the choice under each shift, or "tie" for a pair whose orders disagree)
and its metrics are lad's, computed by lad.core.metrics through lad.harness.audit.rows_metrics
over all samples: lad_acc, lad_rstd, lad_cons, lad_flip, lad_circular (records-weighted over N
where a task mixes N, as in lmms-eval's table) and lad_position_p, the permutation test's p value
(one N only: it is defined within one N); with `--epochs` above 1 the later epochs are repeats
of the same orderings, and lad_noise_floor the share of them whose choice changed.
`lad harness audit LOG_DIR` writes the whole audit from the logged rows (lad.harness.inspect_logs).
"""

from __future__ import annotations

import copy
import json
import math
from collections.abc import Callable
from typing import Any

from inspect_ai.scorer import (
    CORRECT,
    INCORRECT,
    Metric,
    SampleScore,
    Score,
    Scorer,
    Target,
    metric,
    scorer,
)
from inspect_ai.solver import Choice, Choices, Generate, Solver, TaskState, multiple_choice, solver

from lad.data.items import cyclic_shift
from lad.errors import LadError
from lad.harness.audit import pooled_metrics, rows_metrics
from lad.harness.circular import AUDIT_METRICS, shifted_row

STORE_KEY = "lad_rows"  # the sample store's key of its audit rows


def _letter(p: int) -> str:
    return chr(ord("A") + p)


def _answer_index(state: TaskState, target: Target) -> int:
    """The original position of the sample's one correct choice (its target letter)."""
    n = len(state.choices)
    letters = [t.strip() for t in target.target]
    if len(letters) != 1 or len(letters[0]) != 1 or not 0 <= ord(letters[0]) - 65 < n:
        raise LadError(
            f"sample {state.sample_id!r}: lad's circular solver needs one target letter among "
            f"A..{_letter(n - 1)} (one correct choice), got {target.target!r}"
        )
    return ord(letters[0]) - ord("A")


def _chosen(state: TaskState) -> int:
    """The position the solver marked as the answer; -1 for none or several."""
    marked = [p for p, c in enumerate(state.choices) if c.correct is True]
    return marked[0] if len(marked) == 1 else -1


@solver
def circular(solver: Solver | None = None, **multiple_choice_args: Any) -> Solver:
    """Ask each sample under all N cyclic shifts of its choices (N = 2: both orders).

    Args:
      solver: the solver that asks one ordering (default: Inspect's `multiple_choice()` with
        `multiple_choice_args`, e.g. `cot=True`); it must mark the choice it read as the answer
        (`state.choices`), as `multiple_choice()` does.
      **multiple_choice_args: arguments of `multiple_choice()` when `solver` is not given.
    """
    ask = solver if solver is not None else multiple_choice(**multiple_choice_args)

    async def solve(state: TaskState, generate: Generate) -> TaskState:
        n = len(state.choices)
        if n < 2:
            raise LadError(
                f"sample {state.sample_id!r}: lad's circular solver needs a multiple-choice "
                f"sample of at least 2 choices, got {n}"
            )
        values = [c.value for c in state.choices]
        messages = copy.deepcopy(state.messages)
        answer = _answer_index(state, state.target)
        rows: list[dict[str, Any]] = []
        completions: list[str] = []
        for s in [*range(1, n), 0]:  # the unshifted asking last: the sample keeps it
            order = cyclic_shift(n, s)
            state.messages = copy.deepcopy(messages)
            state.choices = Choices([Choice(values[i], None, i) for i in order])
            state = await ask(state, generate)
            asked = {"lad_item": state.sample_id, "lad_shift": s}  # as a circular document
            rows.append(shifted_row(asked, n, order.index(answer), _chosen(state)))
            completions.append(state.output.completion)
        state.store.set(STORE_KEY, sorted(rows, key=lambda r: r["ordering"]))
        state.store.set("lad_completions", [completions[-1], *completions[:-1]])
        return state

    return solve


def _verdict(rows: list[dict[str, Any]]) -> str:
    """The original letter chosen under every shift, "tie" for a pair whose two orders disagree,
    "inconsistent" for N > 2, "none" when no shift gave a readable answer."""
    chosen = {r["order"][r["prediction"]] if r["prediction"] >= 0 else -1 for r in rows}
    if chosen == {-1}:
        return "none"
    if len(chosen) == 1:
        return _letter(chosen.pop())
    return "tie" if len(rows[0]["order"]) == 2 else "inconsistent"


# ------------------------------------------------------------------ metrics
# Each metric reads every epoch's score ("unreduced"): epoch 1 gives the metrics, later epochs
# ask the same orderings again (rows with `repeat`), whose disagreement is the noise floor.

_cache: dict[str, dict[int, dict[str, Any]]] = {}


def _by_n(scores: list[SampleScore]) -> dict[int, dict[str, Any]]:
    """rows_metrics of every sample's rows (computed once for all six metrics)."""
    rows = []
    for s in scores:
        mine = (s.score.metadata or {}).get(STORE_KEY)
        if not mine:
            raise LadError(
                f"sample {s.sample_id!r}: its score has no lad rows (lad's metrics read the "
                "scores of lad/position, one epoch)"
            )
        rows.extend(mine)
    key = json.dumps(rows, sort_keys=True)
    if key not in _cache:
        _cache.clear()
        _cache[key] = rows_metrics(rows)
    return _cache[key]


def _pooled(name: str, key: str) -> Callable[[], Metric]:
    """Inspect's metric `name`: lad's metric `key`, pooled over N (lad.harness.audit.
    pooled_metrics)."""

    def factory() -> Metric:
        def value(scores: list[SampleScore]) -> float:  # annotated: Inspect passes SampleScores
            return pooled_metrics(_by_n(scores), key)

        return value

    return metric(name=name, scores="unreduced")(factory)


# lad's metrics of every harness (lad.harness.circular.AUDIT_METRICS), by the same names.
lad_acc, lad_rstd, lad_cons, lad_flip, lad_circular = map(
    _pooled, AUDIT_METRICS, AUDIT_METRICS.values()
)


@metric(scores="unreduced")
def lad_position_p() -> Metric:
    """p of the permutation test of position dependence (lad.core.audit.position_test); NaN
    where the task mixes N (the test is defined within one N) or nothing can be
    permuted."""

    def value(scores: list[SampleScore]) -> float:
        by_n = _by_n(scores)
        if len(by_n) != 1:
            return math.nan
        (metrics,) = by_n.values()
        p = metrics["methods"]["model"]["position_test"]["p_value"]
        return math.nan if p is None else float(p)

    return value


@metric(scores="unreduced")
def lad_noise_floor() -> Metric:
    """Noise floor (%): with `--epochs` above 1, the share of repeated askings (epochs 2, 3, …)
    whose choice differs from the first epoch's (lad.core.audit.noise_floor), records-weighted
    over N; NaN with one epoch."""

    def value(scores: list[SampleScore]) -> float:
        floors = [m["methods"]["model"].get("noise_floor") for m in _by_n(scores).values()]
        floors = [f for f in floors if f is not None]
        if not floors:
            return math.nan
        total = sum(f["records"] for f in floors)
        return float(sum(f["flip_rate"] * f["records"] for f in floors) / total)

    return value


METRICS = (lad_acc, lad_rstd, lad_cons, lad_flip, lad_circular, lad_position_p, lad_noise_floor)


@scorer(metrics=[m() for m in METRICS])
def position() -> Scorer:
    """lad's position audit of a sample asked by `circular()`."""

    async def score(state: TaskState, target: Target) -> Score:
        rows = state.store.get(STORE_KEY)
        if not rows:
            raise LadError(
                f"sample {state.sample_id!r} holds no lad rows: lad/position scores samples "
                "asked by lad/circular (inspect eval ... --solver lad/circular)"
            )
        if state.epoch > 1:  # the same orderings asked again: lad's repeats (the noise floor)
            rows = [{**r, "repeat": state.epoch - 1} for r in rows]
        right = all(r["prediction"] == r["answer"] for r in rows)
        shown = " ".join(
            _letter(r["order"][r["prediction"]]) if r["prediction"] >= 0 else "-" for r in rows
        )
        return Score(
            value=CORRECT if right else INCORRECT,
            answer=_verdict(rows),
            explanation=f"original choice picked under shifts 0..{len(rows) - 1}: {shown}",
            metadata={STORE_KEY: rows},
        )

    return score
