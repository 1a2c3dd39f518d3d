"""`lad eval`: a run directory from items to report, resumable (docs/formats.md lists its files).

The model runs once per (item, ordering) and its records are appended as they are made; every
method, metric and figure is then computed from the stored records (docs/formats.md lists the
files of a run directory). Its parts are in lad.run (docs/architecture.md): config, preflight
(every check before any model work), stages (each records file), rundir, resume and lock.
"""

from __future__ import annotations

import shutil
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from lad.core.calibrate import Calibration
from lad.core.cells import Cell, cells_json, cells_of, format_cells_table, score_cells
from lad.core.methods import MethodOptions
from lad.core.metrics import format_panel, format_table
from lad.core.records import RecordSet
from lad.core.scoring import score_records
from lad.data.items import Item, read_items
from lad.data.orders import Request, cyclic_requests, given_requests, shuffled_requests
from lad.errors import DataError, LadError
from lad.run.config import DEFAULT_CALIBRATION_ITEMS, EvalConfig, eval_config
from lad.run.lock import RunLock
from lad.run.mixed import part_config, scoring_inputs, write_part_inputs
from lad.run.preflight import check_inputs
from lad.run.resume import World
from lad.run.rundir import RunDir
from lad.run.runjson import file_digest
from lad.run.stages import Clock, LazyBackend, Stage, run_stage, sofa_sigma
from lad.suites import slug
from lad.suites.plan import SuiteResult, cell_numbers, compared, one_n, suite_models


@dataclass(frozen=True)
class RunData:
    """A run's input items, each file parsed and checked once (lad.data.items.read_items), then
    handed down: --data's (None: generated shapes) and --calibration-data's (None: none given,
    or a path that is no file, which `load_items` names)."""

    items: list[Item] | None = None
    calibration: list[Item] | None = None


def read_data(config: EvalConfig) -> RunData:
    """The items of --data and --calibration-data, each file read once."""
    items = None if config.data == "shapes" else read_items(config.data)
    source = config.calibration_data
    return RunData(items, read_items(source) if source and Path(source).is_file() else None)


def _with_n(items: list[Item], n: int, path: str) -> list[Item]:
    """`items`, each of N candidates; else the file is read again to name the line that is not."""
    return items if all(it.num_candidates == n for it in items) else read_items(path, n)


@dataclass
class RunResult:
    run_dir: Path
    metrics: dict[str, Any]
    table: str
    report: Path | None


# ---------------------------------------------------------------- requests


def run_requests(config: EvalConfig, items: Sequence[Item]) -> list[Request]:
    """The evaluation requests of a run: each item under the orders of `config.orders` when
    given (lad.data.orders), else under T seeded shuffles."""
    if config.orders is None:
        return shuffled_requests(items, config.num_shuffles, config.seed)
    return given_requests(items, config.orders, config.num_candidates)


def resolve_prompt(config: EvalConfig, data: RunData) -> EvalConfig:
    """The run with its vanilla template fixed for its evaluation items (RecordSpec.for_items)."""
    if config.prompt_template is not None or data.items is None:
        return config
    items = _with_n(data.items, config.num_candidates, config.data)
    return config.replace(prompt_template=config.spec.for_items(items).prompt_template)


def resolve_penalty(config: EvalConfig) -> EvalConfig:
    """The run with its repetition penalty as a number (or None): "model" (--preset official)
    becomes the model's generation_config's, stored in run.json so records, calibration and
    every rescoring agree (RecordSpec.penalty)."""
    return config.replace(repetition_penalty=config.spec.penalty())


def resolve_calibration_items(config: EvalConfig, data: RunData) -> tuple[EvalConfig, str | None]:
    """The run with |D_cal| decided: as given (a file holding fewer is then refused), else 5, or
    all the items of a smaller calibration file, which the note returned says."""
    if config.calibration_items is not None:
        return config, None
    resolved = config.replace(calibration_items=DEFAULT_CALIBRATION_ITEMS)
    on_eval = config.calibrate_on == "evaluation"
    source = config.data if on_eval else config.calibration_data
    items = data.items if on_eval else data.calibration
    if items is None:  # 'shapes', or a file load_items refuses
        return resolved, None
    held = min(Counter(it.num_candidates for it in items).values())  # of each N
    if held >= DEFAULT_CALIBRATION_ITEMS:
        return resolved, None
    note = f"Note: {source} holds {held} calibration items: calibrating on {held}"
    return config.replace(calibration_items=held), note


def resolved(config: EvalConfig, data: RunData) -> EvalConfig:
    """The run of one N with |D_cal|, its prompt and its repetition penalty decided."""
    return resolve_penalty(resolve_prompt(resolve_calibration_items(config, data)[0], data))


# ---------------------------------------------------------------- data


def load_items(
    config: EvalConfig, run_dir: Path, data: RunData | None = None
) -> tuple[list[Item], list[Item]]:
    """(evaluation items, calibration items). Held out (the default), the two never share an item
    id; with `calibrate_on` "evaluation" the calibration items are the first |D_cal| items of the
    data, which are evaluated too (the official code's choice)."""
    n = config.num_candidates
    on_eval = config.calibrate_on == "evaluation"
    if config.data == "shapes":
        from lad.data.shapes import build_shapes

        num_eval = config.items or 100
        common = {"num_candidates": n, "setting": config.setting, "seed": config.seed}
        folder = RunDir(run_dir).data_folder
        eval_path = build_shapes(folder("eval"), items=num_eval, split="eval", **common)
        if on_eval:
            items = read_items(eval_path, n)
            return items, items[: config.calibration_items]
        cal_path = build_shapes(
            folder("calibration"),
            items=config.calibration_items,
            split="calibration",
            **common,
        )
        return read_items(eval_path, n), read_items(cal_path, n)
    data = read_data(config) if data is None else data
    items = _with_n(data.items, n, config.data) if data.items else read_items(config.data, n)
    if on_eval:
        _enough(items, config.calibration_items, config.data)
        return items[: config.items or len(items)], items[: config.calibration_items]
    if config.calibration_data:
        calibration = data.calibration
        if calibration is None:
            calibration = read_items(config.calibration_data, n)  # refused, naming the file
        calibration = _with_n(calibration, n, config.calibration_data)
        _enough(calibration, config.calibration_items, config.calibration_data)
        _same_kind(items, calibration, config)
    elif config.calibration:
        calibration = []
    else:
        # No separate calibration file: hold out a seeded choice of items from the data.
        if len(items) <= config.calibration_items:
            raise DataError(
                f"{config.data}: {len(items)} items leave none for evaluation after holding out "
                f"--calibration-items {config.calibration_items}; pass --calibration-data"
            )
        rng = np.random.default_rng(config.seed)
        held = set(rng.choice(len(items), config.calibration_items, replace=False).tolist())
        calibration = [it for i, it in enumerate(items) if i in held]
        items = [it for i, it in enumerate(items) if i not in held]
    calibration = calibration[: config.calibration_items]
    overlap = {it.id for it in items} & {it.id for it in calibration}
    if overlap:
        raise DataError(
            f"calibration items must be disjoint from evaluation items; shared ids: "
            f"{sorted(overlap)[:5]}"
        )
    if config.items:
        items = items[: config.items]
    return items, calibration


def _enough(items: Sequence[Item], wanted: int, path: object) -> None:
    """--calibration-items is what the run calibrates on, never silently fewer."""
    if len(items) < wanted:
        raise DataError(
            f"{path}: holds {len(items)} items but --calibration-items asks for {wanted}; pass "
            f"--calibration-items {len(items)} or a file with more items"
        )


def _same_kind(items: Sequence[Item], calibration: Sequence[Item], config: EvalConfig) -> None:
    """Question items are asked their own question, caption items the caption prompt: a
    calibration of the other kind is fitted under another prompt than the one evaluated."""
    kind = {True: "question items", False: "caption items"}
    asked = {it.question is not None for it in items}
    calibrated = {it.question is not None for it in calibration}
    if len(asked) == len(calibrated) == 1 and asked != calibrated:
        raise DataError(
            f"--calibration-data {config.calibration_data} holds {kind[calibrated.pop()]} but "
            f"--data {config.data} holds {kind[asked.pop()]}; calibrate with items of the same "
            "kind, asked with the same prompt"
        )


# ---------------------------------------------------------------- the whole run


def fit_or_load_calibration(
    config: EvalConfig, run_dir: Path, calibration_records: RecordSet | None
) -> Calibration:
    if config.calibration:
        calibration = Calibration.load(config.calibration)
    else:
        assert calibration_records is not None
        inputs = RunDir(run_dir).inputs
        made = config.spec.fingerprint(config.num_candidates, inputs)
        calibration = Calibration(obs_mean=config.obs_mean).fit(calibration_records, made)
    RunDir(run_dir).write_calibration(calibration)
    return calibration


def evaluate(
    config: EvalConfig,
    run_dir: str | Path,
    world: World | None = None,
    after_checks: Callable[[], None] | None = None,
    backends: dict | None = None,
    data: RunData | None = None,
) -> RunResult | None:
    """Run (or resume) one evaluation into `run_dir` and return its metrics.

    Under several processes (accelerate launch, torchrun) each makes its share of the records;
    the main process merges, scores and reports, and the others return None. `after_checks` is
    called once every argument and input passed its checks, before any model work (the CLI's
    notes go there, so a refused run prints its one error line and nothing else). `backends`:
    models already loaded, kept for the next run of this process (lad.run.stages.LazyBackend).
    `data`: the input items, read already (`read_data`); each input file is read once.
    """
    run_dir = Path(run_dir)
    world = world or World.from_env()
    data = read_data(config) if data is None else data
    cells = cells_of(data.items or [])
    if len(cells) > 1:
        return evaluate_mixed(config, cells, run_dir, world, after_checks, backends or {}, data)
    config = resolved(config, data)
    if not world.is_main:
        return _evaluate(config, run_dir, world, backends=backends, data=data)
    items = None if config.data == "shapes" else load_items(config, run_dir, data)
    inputs = check_inputs(config, run_dir, items)
    if after_checks is not None:
        after_checks()
    with RunLock(run_dir):
        return _evaluate(config, run_dir, world, inputs, backends=backends, data=data)


def _evaluate(
    config: EvalConfig,
    run_dir: Path,
    world: World,
    inputs: dict[str, Any] | None = None,
    report: bool = True,
    backends: dict | None = None,
    data: RunData | None = None,
) -> RunResult | None:
    if world.is_main:
        RunDir(run_dir).begin(config.identity(), EvalConfig().identity(), inputs)
        if config.data == "shapes":
            load_items(config, run_dir, RunData())  # built once, before the others read it
    world.barrier()
    data = read_data(config) if data is None else data  # a part's files exist from here on
    eval_items, cal_items = load_items(config, run_dir, data)
    make_backend = LazyBackend(config, world.device(config.device), run_dir, backends)
    make_backend.pictures = not all(it.is_text for it in eval_items + cal_items)
    clock = Clock(run_dir, world, make_backend)

    def stage(requests: list[Request], file: str, name: str, kind=None, desc="", acc_label=None):
        path = RunDir(run_dir).records_file(file)
        with clock(name, path, len(requests)):
            args = (requests, path, config, desc or name, world, kind, acc_label)
            return run_stage(make_backend, *args)

    requests = run_requests(config, eval_items)  # a bad --orders file fails before model work
    cal_records = None
    if not config.calibration:
        cal_records = stage(cyclic_requests(cal_items), "calibration", "calibration")
    stage(requests, "records", "evaluation")
    if "perm-avg" in config.methods:
        # Each shift alone is a vanilla prompt; perm-avg's own accuracy needs all N of them.
        shifts = cyclic_requests(eval_items)
        stage(shifts, "perm-avg", "perm-avg", acc_label="vanilla acc per shift")
    for template in ("instruction", "cot", "self-consistency"):
        if template in config.methods:
            stage(requests, template, template, Stage(template))
    if "sofa" in config.methods:
        sigma = sofa_sigma(config, run_dir, make_backend, cal_items, world, clock)
        kind = Stage(sofa_sigma=sigma)
        stage(requests, "sofa", "sofa", kind, f"sofa σ={sigma:g}")
    if not world.is_main:
        return None
    fit_or_load_calibration(config, run_dir, cal_records)
    return score_run(
        run_dir,
        config.methods,
        config.method_options,
        write_report=report,
        check_calibration=config.calibration_check,
    )


def score_run(
    run_dir: Path,
    methods: Sequence[str],
    options: MethodOptions,
    *,
    write_report: bool = True,
    check_calibration: bool = True,
) -> RunResult:
    """Predictions, metrics.json and the report, from the run directory's files alone (a mixed
    run: each part's, each cell's and the groups').

    check_calibration: refuse a calibration.json of another model, label scheme, prompt, chat
    template or image preprocessing.
    """
    run = RunDir(run_dir)
    if run.is_mixed:
        return _score_mixed(run, methods, options, write_report, check_calibration)
    part = scoring_inputs(run, methods, options, check_calibration)
    start = time.perf_counter()
    scored = score_records(
        part.records,
        methods,
        part.calibration,
        part.options,
        perm_records=part.perm_records,
        stages=part.stages,
    )
    # Wall seconds per stage (run.json's, summed over sessions) and of this scoring.
    timing = {**run.timing(), "scoring": round(time.perf_counter() - start, 3)}
    metrics = run.write_scored(scored, timing=timing)
    table = "\n".join(filter(None, (format_table(metrics), format_panel(metrics))))
    return RunResult(run_dir, metrics, table, _report(run_dir) if write_report else None)


def _report(run_dir: Path) -> Path:
    from lad.outputs.report import write_report

    return write_report([run_dir], RunDir(run_dir).report_folder)


# ---------------------------------------------------------------- a mixed items file


def evaluate_mixed(
    config: EvalConfig,
    cells: list[Cell],
    run_dir: Path,
    world: World,
    after_checks: Callable[[], None] | None,
    backends: dict,
    data: RunData,
) -> RunResult | None:
    """A run of several (task, N) cells: one part run directory n{N}/ per N, each a `lad eval` run
    of that N's items with its own calibration (held out from that N's items, or the N's file of
    --calibration DIR); cells.json names each cell's items; metrics.json holds each cell's
    metrics and the item-weighted groups (docs/formats.md, "Mixed runs")."""
    items = data.items or []
    ns = sorted({c.num_candidates for c in cells})
    parts = {n: part_config(config, run_dir, n, items, data.calibration) for n in ns}
    run = RunDir(run_dir)
    if not world.is_main:
        for n, part in parts.items():
            _evaluate(part, run.part(n).path, world, backends=backends)
        return None
    existed = run_dir.exists()
    try:
        write_part_inputs(config, items, parts, data.calibration)
        part_data = {n: read_data(p) for n, p in parts.items()}
        inputs = {}
        for n, part in parts.items():
            folder = run.part(n).path
            inputs[n] = check_inputs(part, folder, load_items(part, folder, part_data[n]))
    except LadError:
        if not existed:  # a refused run leaves nothing behind
            shutil.rmtree(run_dir, ignore_errors=True)
        raise
    if after_checks is not None:
        after_checks()
    with RunLock(run_dir):
        named = ("data", "calibration_data", "orders")
        own = {k: file_digest(getattr(config, k)) for k in named if getattr(config, k)}
        run.begin(config.identity(), EvalConfig().identity(), own)
        run.write_cells(cells_json(cells, {n: RunDir.part_name(n) for n in parts}))
        for n, part in parts.items():
            with RunLock(run.part(n).path):
                _evaluate(part, run.part(n).path, world, inputs[n], False, backends, part_data[n])
        return score_run(
            run_dir,
            config.methods,
            config.method_options,
            check_calibration=config.calibration_check,
        )


def _score_mixed(
    run: RunDir,
    methods: Sequence[str],
    options: MethodOptions,
    write_report: bool,
    check_calibration: bool,
) -> RunResult:
    """metrics.json of a mixed run (each cell's and the groups'), from its parts' files alone."""
    run_dir = run.path
    parts = {
        n: scoring_inputs(part, methods, options, check_calibration)
        for n, part in run.parts().items()
    }
    metrics: dict[str, Any] = {"num_candidates": sorted(parts), "methods_scored": list(methods)}
    metrics.update(score_cells(run.cells(), parts, methods))
    timing: dict[str, float] = {}
    for part in run.parts().values():
        for stage, seconds in part.timing().items():
            timing[stage] = round(timing.get(stage, 0.0) + seconds, 3)
    metrics["timing"] = timing
    metrics["source"] = run.source()
    run.write_metrics(metrics)
    report = _report(run_dir) if write_report else None
    return RunResult(run_dir, metrics, format_cells_table(metrics, methods), report)


# ---------------------------------------------------------------- suites


def run_suite(
    suite: Any,
    out: str | Path,
    *,
    data_roots: Sequence[str] = (),
    model: str | None = None,
    compare: str | None = None,
    say: Callable[[str], None] = print,
) -> SuiteResult:
    """Run every cell of `suite` (lad.suites.Suite) for its models, or for `model` alone, into
    out/<model>/<cell>/ (one `lad eval` run directory each; a finished one is skipped), and lay
    the numbers out beside the paper's. Every benchmark folder is checked first, and every
    cell's data converted, before any model work."""
    from lad.suites.data import benchmark_roots, cell_data, check_data
    from lad.suites.table import format_suite_table, table_rows

    out = Path(out)
    roots = benchmark_roots(suite, list(data_roots))
    check_data(suite, roots)
    models = suite_models(suite, model)
    plans = []
    for label, path in models:
        for cell in suite.cells:
            settings = {**suite.settings, **cell.settings}
            preset = settings.pop("preset", "paper")
            data = cell_data(suite, cell, roots, out, settings)
            n = cell.num_candidates or one_n(data["data"])
            stated = {**settings, **data, "model": path, "quiet": True}
            config = eval_config(preset, **stated, **({"num_candidates": n} if n else {}))
            plans.append((label, cell, config, out / slug(label) / cell.slug))
    backends: dict = {}
    results: dict[str, dict[str, Any]] = {label: {} for label, _ in models}
    runs: dict[str, dict[str, Path]] = {label: {} for label, _ in models}
    skipped = []
    for k, (label, cell, config, run_dir) in enumerate(plans, 1):
        if k > 1 and label != plans[k - 2][0]:
            backends.clear()  # the model before is done with: free its memory for the next
        try:
            data: RunData | None = read_data(config)
        except LadError:
            data = None  # refused by evaluate, with its reason
        metrics = None if data is None else _finished(config, run_dir, data)
        say(f"[{k}/{len(plans)}] {label} · {cell.id}: {'finished' if metrics else 'running'}")
        if metrics is None:
            result = evaluate(config, run_dir, backends=backends, data=data)
            metrics = result.metrics if result is not None else None
        else:
            skipped.append(run_dir)
        results[label][cell.id] = cell_numbers(metrics)
        runs[label][cell.id] = run_dir
    chosen = {label: compared(suite, label, compare) for label, _ in models}
    rows = table_rows(suite, results, chosen)
    return SuiteResult(format_suite_table(suite, rows), rows, runs, skipped)


def _finished(config: EvalConfig, run_dir: Path, data: RunData) -> dict[str, Any] | None:
    """A run directory's metrics when it was finished with these arguments and methods."""
    made = config  # a mixed run's run.json: its arguments as given (each part resolves)
    try:
        if len(cells_of(data.items or [])) <= 1:
            made = resolved(config, data)
    except LadError:
        return None
    return RunDir(run_dir).finished(made.identity(), config.methods)
