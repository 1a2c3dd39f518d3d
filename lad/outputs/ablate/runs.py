"""Runs for `lad ablate`: a finished run's stored evidence, and the shape of an analysis's result.

`load_run(dir)` reads a `lad eval` run directory; `Run.metrics(method, options, calibration)` is
metrics.json's entry for a method scored by lad.core.methods on the run's records, the one place
every number of lad.outputs.ablate comes from.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from lad.core.calibrate import Calibration
from lad.core.methods import METHODS, MethodOptions
from lad.core.records import RecordSet
from lad.core.scoring import score_records
from lad.errors import LadError, RunError
from lad.run.rundir import CALIBRATION_FILE, STAGE_FILES, RunDir, run_folders


class AnalysisError(LadError):
    """The runs given cannot support an analysis; `fix` says what would make it possible.
    `missing`: every part that could not be made (e.g. each refused pair of Table 3), when the
    analysis had several; `lad.outputs.ablate.ablate` lists them all."""

    def __init__(self, message: str, fix: str = "", missing: Sequence[Missing] = ()):
        super().__init__(message + (f" ({fix})" if fix else ""))
        self.reason, self.fix, self.missing = message, fix, list(missing)


@dataclass(frozen=True)
class AblateOptions:
    """The settings the analyses sweep (defaults: the paper's; docs/ablate.md).

    options:     MethodOptions wherever they are not the swept quantity; its labels and obs_mean
                 are each run's own.
    ks, sizes, taus: K of Table 4's "Dynamic ✓" rows, |D_cal| of Figure 6(a), τ of Figure 6(b).
    subsets, seed: Figure 6(a)'s random calibration subsets per |D_cal|, and their seed.
    calibration_items: refit each run's calibration on a seeded random subset of this many of
                 its calibration items for every analysis but Figure 6(a); None: calibration.json.
    obs_mean:    None: each run's Eq. 1 average; another refits the calibration under it.
    check_calibration: False lets Table 3 apply a calibration made for other records (N and L
                 must still match), as lad ablate --no-calibration-check.
    """

    options: MethodOptions = field(default_factory=MethodOptions)
    ks: tuple[int, ...] = (1, 2, 4, 8)
    sizes: tuple[int, ...] = (1, 5, 10, 20, 50, 100)
    taus: tuple[float, ...] = (0.0, 1.0, 3.0, 5.0, 7.0, 9.0, math.inf)
    subsets: int = 5
    seed: int = 0
    calibration_items: int | None = None
    obs_mean: str | None = None
    check_calibration: bool = True

    def __post_init__(self) -> None:
        own = MethodOptions()
        if (self.options.labels, self.options.obs_mean) != (own.labels, own.obs_mean):
            raise LadError(
                "The 'options' parameter's labels and obs_mean are each run's own; refit "
                "calibrations under another Eq. 1 average with AblateOptions(obs_mean=...)"
            )
        if self.obs_mean is not None:
            MethodOptions(obs_mean=self.obs_mean)
        for tau in self.taus:
            MethodOptions(tau=tau)
        for name in ("ks", "sizes"):
            values = getattr(self, name)
            if not values or not all(isinstance(v, int) and v >= 1 for v in values):
                raise LadError(f"The '{name}' parameter must be integers >= 1. Got {values!r}.")
        if not self.taus:
            raise LadError("The 'taus' parameter must name at least one τ")
        size = self.calibration_items
        if size is not None and size < 1:
            raise LadError(f"The 'calibration_items' parameter must be >= 1 or None. Got {size!r}.")
        if self.subsets < 1:
            raise LadError(f"The 'subsets' parameter must be >= 1. Got {self.subsets!r}.")


DEFAULTS = AblateOptions()


# ---------------------------------------------------------------------------------------------
# Runs.


@dataclass
class Run:
    """A finished run's stored evidence (`load_run` reads one from a `lad eval` directory):
    its records, calibration.json and the calibration records it was fitted on (None when given
    a --calibration file), perm_records, the other stages' records by stage, run.json's
    arguments and input fingerprints, the directory, and where `calibration` comes from.
    perm_records is the "perm-avg" stage's records: given either way, both hold them."""

    name: str
    records: RecordSet | None  # None: a model's answers only (a harness audit)
    calibration: Calibration | None  # None: records without the model's evidence (a harness audit)
    calibration_records: RecordSet | None = None
    perm_records: RecordSet | None = None
    stages: dict[str, RecordSet] = field(default_factory=dict)
    arguments: dict[str, Any] = field(default_factory=dict)
    inputs: dict[str, Any] = field(default_factory=dict)
    path: Path | None = None
    calibration_source: str = CALIBRATION_FILE

    def __post_init__(self) -> None:
        if self.perm_records is not None:
            self.stages = {**self.stages, "perm-avg": self.perm_records}
        self.perm_records = self.stages.get("perm-avg")

    @property
    def num_candidates(self) -> int:
        return self.records.num_candidates

    @property
    def setting(self) -> str:
        return str(self.arguments.get("setting", ""))

    @property
    def model(self) -> str:
        return str(self.arguments.get("model", ""))

    def options(self, ablation: AblateOptions | None = None, **changes: Any) -> MethodOptions:
        """MethodOptions for this run: the ablation's K, τ and variants, the run's label scheme
        and its calibration's Eq. 1 average (`obs_mean`), then `changes`. A K above the layers
        Eq. 9 searches is clamped to them ("K (= all L)", `searched_layers`)."""
        labels, obs_mean = self.arguments.get("labels", "digits"), self.calibration.obs_mean
        base = (ablation or DEFAULTS).options
        opts = dataclasses.replace(base, labels=labels, obs_mean=obs_mean, **changes)
        searched = self.searched_layers(opts.layer_range)
        if 0 < searched < opts.top_k:  # asked for explicitly, as lad.core.methods wants
            opts = dataclasses.replace(opts, top_k=searched)
        return opts

    def searched_layers(self, layer_range: Sequence[int] | None = None) -> int:
        """How many layers Eq. 9 chooses from: all L, or those of `layer_range` (clipped to L;
        0 when the range starts past the last layer, which lad.core.methods refuses)."""
        nl = self.records.num_layers
        first, last = layer_range or (0, nl - 1)
        return max(min(last, nl - 1) - first + 1, 0)

    def k_text(self, k: int, layer_range: Sequence[int] | None = None) -> str:
        """K as tables and figures show it: "8 (= all 4)" where this run has fewer layers."""
        searched = self.searched_layers(layer_range)
        return f"{k} (= all {searched})" if 0 < searched <= k else str(k)

    def lacks(self, method: str) -> str:
        """The file of the first stage `method` reads that this run does not hold ("": none)."""
        held = {"records", None, *self.stages}
        stages = (METHODS[method].stage, METHODS[method].extra)
        return next((STAGE_FILES[s] for s in stages if s not in held), "")

    def methods_fix(self, method: str) -> str:
        """What makes `method`'s records: rerunning the run's lad eval with it added."""
        where = f" --out {self.path}" if self.path else ""
        return (
            f"rerun this run's lad eval{where} with {method} added to --methods (records "
            "already made are reused)"
        )

    def calibration_note(self) -> str:
        size, obs_mean = self.calibration.num_items, self.calibration.obs_mean
        where = f"{self.calibration_source}, |D_cal| = {size}" if size else self.calibration_source
        return f"{self.name}: {where}" + (f", Eq. 1 over {obs_mean}s" if obs_mean != "prob" else "")

    def calibration_items(self) -> list[str]:
        """The ids of the items of the run's calibration records (sorted)."""
        if self.calibration_records is not None:
            return sorted(set(self.calibration_records.items.tolist()))
        none = f"{self.name} holds no calibration records"
        if self.arguments.get("calibration"):
            given = f"{none}: it was given a --calibration file"
            raise AnalysisError(given, "lad eval without --calibration")
        if self.path is not None:
            lost = f"{none}: {RunDir(self.path).records_file('calibration')} is missing"
            raise AnalysisError(
                lost, "restore the file, or make the run again with lad eval into a new --out"
            )
        raise AnalysisError(none, "give the Run its calibration_records")

    def fit_calibration(self, items: Sequence[str], obs_mean: str | None = None) -> Calibration:
        """A calibration (§4.2) fitted on these items' records of the run's calibration set, with
        Eq. 1 over `obs_mean` (default: as the run's calibration)."""
        records = self.calibration_records
        assert records is not None
        made = self.calibration
        return Calibration(obs_mean=obs_mean or made.obs_mean).fit(
            records.select(np.isin(records.items, list(items))), made.fingerprint
        )

    def with_calibration_items(
        self, size: int | None, seed: int = 0, obs_mean: str | None = None
    ) -> Run:
        """This run with its calibration refitted on `size` of its calibration items (None: all),
        drawn at random with `seed` (`calibration_subsets`), Eq. 1 over `obs_mean`."""
        items = self.calibration_items()
        size = len(items) if size is None else size
        if size > len(items):
            raise AnalysisError(
                f"{self.name} holds {len(items)} calibration items, fewer than {size}",
                f"lad eval --calibration-items {size}",
            )
        subset = calibration_subsets(items, size, 1, seed)[0]
        drawn = f"{size} of its {len(items)} calibration items (seed {seed})"
        source = drawn if size < len(items) else f"all its {size} calibration items"
        calibration = self.fit_calibration(subset, obs_mean)
        return dataclasses.replace(self, calibration=calibration, calibration_source=source)

    def metrics(
        self,
        method: str,
        options: MethodOptions | None = None,
        calibration: Calibration | None = None,
    ) -> dict[str, Any]:
        """metrics.json's entry for `method` on this run's records."""
        if lacking := self.lacks(method):
            raise AnalysisError(f"{self.name} has no {lacking}", self.methods_fix(method))
        scored = score_records(
            self.records,
            [method],
            calibration or self.calibration,
            options or self.options(),
            stages=self.stages,  # score_records takes the method's own of them
            bootstrap=None,  # sweeps: no audit (bootstrap, permutation test) per configuration
        )
        return scored.metrics["methods"][method]


def calibration_subsets(items: Sequence[str], size: int, count: int, seed: int) -> list[list[str]]:
    """`count` distinct seeded random subsets of `size` calibration items, drawn without
    replacement across the subsets: every item is used once before any is used again (so the
    subsets are disjoint while size × count fits in the pool). When there are at most `count`
    subsets of that size, all of them (the whole set once when size is the number of items)."""
    names = sorted(set(items))
    size = min(size, len(names))
    if math.comb(len(names), size) <= count:
        return [list(c) for c in itertools.combinations(names, size)]
    rng = np.random.default_rng([seed, size])
    pool: list[int] = []  # the current round's items not used yet, in drawn order
    chosen: list[tuple[int, ...]] = []
    while len(chosen) < count:
        subset = pool[:size]
        pool = pool[size:]
        if len(subset) < size:  # the round is used up: the rest from a fresh one
            fresh = [int(i) for i in rng.permutation(len(names))]
            new = [i for i in fresh if i not in subset][: size - len(subset)]
            pool = [i for i in fresh if i not in new]  # the items just taken come again later
            subset += new
        drawn = tuple(sorted(subset))
        while drawn in chosen:  # a repeat (possible once the rounds wrap): draw another
            drawn = tuple(sorted(int(i) for i in rng.choice(len(names), size, replace=False)))
        chosen.append(drawn)
    return [[names[i] for i in c] for c in chosen]


def prepare(runs: Run | Sequence[Run], options: AblateOptions) -> list[Run]:
    """The runs as a list, with `options.calibration_items` and `options.obs_mean` applied: the
    calibration refitted on a subset, or on all calibration items under another Eq. 1."""
    runs = [runs] if isinstance(runs, Run) else list(runs)
    size, obs_mean = options.calibration_items, options.obs_mean
    return [
        r.with_calibration_items(size, options.seed, obs_mean)
        if size is not None or (obs_mean and obs_mean != r.calibration.obs_mean)
        else r
        for r in runs
    ]


def load_run(path: str | Path, *, check_calibration: bool = True) -> Run:
    """Read a finished run directory through lad.run.rundir.RunDir, with the checks every reader
    of a run applies (`check_calibration` False: as lad eval --no-calibration-check)."""
    run = RunDir(path)
    run.check_is_run()
    run.check()
    arguments, name = run.arguments, run.path.name or str(run.path)
    if run.answers_only:  # no evidence: every analysis is missing for it (lad.outputs.ablate)
        return Run(name, None, None, arguments=arguments, path=run.path)
    return Run(
        name=name,
        records=run.records,
        calibration=run.calibration(check=check_calibration)
        if run.calibration_file.is_file() or not run.is_harness
        else None,
        calibration_records=None if arguments.get("calibration") else run.calibration_records(),
        stages=run.stages(),
        arguments=arguments,
        inputs=run.inputs,
        path=run.path,
    )


def load_runs(paths: Sequence[str | Path], *, check_calibration: bool = True) -> list[Run]:
    """`load_run` of each (a mixed run: of each of its parts); runs whose folder names coincide
    are named by their whole path."""
    paths = [part for p in paths for part in run_folders(Path(p))]
    resolved = [Path(p).resolve() for p in paths]
    twice = sorted({str(p) for p in paths if resolved.count(Path(p).resolve()) > 1})
    if twice:
        raise RunError(f"a run directory is given twice: {twice}")
    runs = [load_run(p, check_calibration=check_calibration) for p in paths]
    names = [r.name for r in runs]
    for run, path in zip(runs, paths, strict=True):
        if names.count(run.name) > 1:
            run.name = str(path)
    return runs


# ---------------------------------------------------------------------------------------------
# Results.


@dataclass(frozen=True)
class Missing:
    """Something an analysis could not show, why, and what would make it possible."""

    analysis: str
    reason: str
    fix: str = ""


@dataclass
class Table:
    """One analysis: a table (a cell: a string, a number or None) and its numbers for a figure
    (`data`); `missing` lists parts left out."""

    key: str
    title: str
    caption: str
    columns: list[str]
    rows: list[list[Any]]
    data: dict[str, Any]
    missing: list[Missing] = field(default_factory=list)


def acc_text(m: dict[str, Any]) -> str:
    """Acc as the paper prints it: mean ± std over the shuffles."""
    return f"{m['acc']:.2f} ± {m['acc_std']:.2f}"


def score_cells(m: dict[str, Any]) -> list[Any]:
    """The Acc, RStd, Cons. cells of a table row."""
    return [acc_text(m), round(m["rstd"], 2), round(m["cons"], 2)]


def summary(m: dict[str, Any]) -> dict[str, Any]:
    """The metrics an analysis's JSON keeps of a method."""
    keys = ("acc", "acc_std", "rstd", "cons", "recall_by_position", "forward_passes_per_item")
    return {k: m[k] for k in keys}


def settings_note(options: AblateOptions, tau: bool = True, runs: Sequence[Run] = ()) -> str:
    """K, τ and any official-code variant, for a caption; K says where `runs` have fewer layers
    than K to choose from ("K = 8 (= all 4 for r4)")."""
    chosen, paper = options.options, MethodOptions()
    parts = [f"K = {k_note(options, runs)}"] + ([f"τ = {tau_label(chosen.tau)}"] if tau else [])
    parts += [
        f"{name} = {getattr(chosen, name)}"
        for name in ("mixture", "attn_mean", "layer_range")
        if getattr(chosen, name) != getattr(paper, name)
    ]
    return ", ".join(parts)


def k_note(options: AblateOptions, runs: Sequence[Run] = ()) -> str:
    """options.options.top_k with "(= all L for RUN, ...)" where runs clamp it."""
    k = options.options.top_k
    clamped: dict[str, list[str]] = {}
    for run in runs:
        shown = run.k_text(k, options.options.layer_range)
        if shown != str(k):
            clamped.setdefault(shown.partition(" ")[2], []).append(run.name)
    if not clamped:
        return str(k)
    if len(clamped) == 1 and len(next(iter(clamped.values()))) == len(runs):
        return f"{k} {next(iter(clamped))}"
    notes = [f"{text[:-1]} for {', '.join(names)})" for text, names in clamped.items()]
    return f"{k} " + "; ".join(notes)


def tau_label(tau: float) -> str:
    return "∞" if math.isinf(tau) else f"{tau:g}"


def tau_json(tau: float) -> float | str:
    """τ in JSON: a number, or "inf" (JSON has no infinity)."""
    return "inf" if math.isinf(tau) else float(tau)


def nothing_made(missing: list[Missing], default: str) -> AnalysisError:
    """The error for an analysis none of whose parts could be made: every part's reason (each
    also in `missing`, so lad.outputs.ablate.ablate lists them one by one)."""
    if not missing:
        return AnalysisError(default)
    fixes = list(dict.fromkeys(m.fix for m in missing if m.fix))
    return AnalysisError(
        "; ".join(m.reason for m in missing), "; ".join(fixes) if len(fixes) == 1 else "", missing
    )


@dataclass
class Ablation:
    """What `lad.outputs.ablate.ablate` made."""

    tables: list[Table]
    missing: list[Missing]
    runs: list[str]


def calibration_note(runs: Sequence[Run]) -> str:
    """Which calibration the numbers use, for a caption."""
    return "Calibration: " + "; ".join(r.calibration_note() for r in runs) + "."
