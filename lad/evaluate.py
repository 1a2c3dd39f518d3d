"""`lad eval`: a run directory from items to report, resumable (docs/formats.md lists its files).

The model runs once per (item, ordering) and its records are appended as they are made; every
method, metric and figure is then computed from the stored records. Its parts are in lad.run
(docs/architecture.md): config, preflight, stages, rundir, resume and lock.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import reduce
from pathlib import Path
from typing import Any

from lad.core.calibrate import Calibration
from lad.core.cells import Cell, cells_json, cells_of, format_cells_table, score_cells
from lad.core.methods import MethodOptions
from lad.core.metrics import format_panel, format_table
from lad.core.records import RecordSet
from lad.core.scoring import score_records
from lad.data.blank import blank_requests
from lad.data.items import Item, read_items
from lad.data.orders import Request, cyclic_requests
from lad.errors import LadError
from lad.io.files import child
from lad.run.config import EvalConfig, eval_config
from lad.run.inputs import RunData, RunItems, read_data, resolved, run_items
from lad.run.lock import RunLock
from lad.run.mixed import part_config, scoring_inputs, write_part_inputs
from lad.run.preflight import Checked, check_inputs, model_digest
from lad.run.resume import World
from lad.run.rundir import PART_INPUTS, RunDir
from lad.run.runjson import file_digest, summed_times
from lad.run.stages import Clock, LazyBackend, Stage, sofa_sigma
from lad.suites import slug
from lad.suites.data import benchmark_roots, cell_data, check_data
from lad.suites.plan import SuiteResult, cell_numbers, compared, one_n, suite_models
from lad.suites.table import format_suite_table, table_rows


@dataclass
class RunResult:
    run_dir: Path
    metrics: dict[str, Any]
    table: str
    report: Path | None


# ---------------------------------------------------------------- the whole run


def fit_or_load_calibration(
    config: EvalConfig,
    run_dir: Path,
    calibration_records: RecordSet | None,
    given: Calibration | None = None,
) -> None:
    """Write the run's calibration.json: `given` (--calibration, as its checks read it) or one
    fitted on the calibration records."""
    run = RunDir(run_dir)
    if given is None:
        assert calibration_records is not None
        made = config.spec.fingerprint(config.num_candidates, run.inputs)
        given = Calibration(obs_mean=config.obs_mean).fit(calibration_records, made)
    run.write_calibration(given)


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
    # The items and requests, made once: a bad --orders file is refused before the first write.
    work = None if config.data == "shapes" else run_items(config, run_dir, data)
    if not world.is_main:
        return _evaluate(config, run_dir, world, None, work, backends=backends)
    checked = check_inputs(config, run_dir, work)
    if after_checks is not None:
        after_checks()
    with RunLock(run_dir):
        return _evaluate(config, run_dir, world, checked, work, backends=backends)


def _evaluate(
    config: EvalConfig,
    run_dir: Path,
    world: World,
    checked: Checked | None = None,
    work: RunItems | None = None,
    report: bool = True,
    backends: dict | None = None,
) -> RunResult | None:
    """The stages and scoring of a run whose inputs passed their checks (`checked`, in the main
    process). `work`: its items and
    requests, made already (None for generated shapes, built here once before the other
    processes read them, and for a mixed run's part but in the main process, which wrote it)."""
    run = RunDir(run_dir)
    if world.is_main:
        run.begin(config.identity(), EvalConfig().identity(), checked.inputs)
        if work is None:  # generated shapes, written here
            work = run_items(config, run_dir)
    world.barrier()
    if work is None:  # the generated or the part's files exist from here on
        work = run_items(config, run_dir)
    eval_items, cal_items, requests = work
    device = world.device(config.device)
    clock = Clock(world, LazyBackend(config, device, run, backends, eval_items + cal_items))

    def stage(requests: list[Request], file: str, name: str, kind=None, desc="", acc_label=None):
        return clock.stage(requests, run.records_file(file), name, kind, desc, acc_label)

    cal_records = None
    if not config.calibration:
        cal_records = stage(cyclic_requests(cal_items), "calibration", "calibration")
    stage(requests, "records", "evaluation")
    if "perm-avg" in config.methods:
        # Each shift alone is a vanilla prompt; perm-avg's own accuracy needs all N of them.
        shifts = cyclic_requests(eval_items)
        stage(shifts, "perm-avg", "perm-avg", acc_label="vanilla acc per shift")
    if "blank" in config.methods:
        # CapCal's extra pass: each request again, every candidate blanked (lad.data.blank). A
        # finished blank stage is only read back, by the same keys and orders: a rescoring
        # neither decodes a picture nor writes a grey one.
        made = RunDir.made(run.records_file("blank"), len(requests))
        blanked = requests if made else blank_requests(requests, run.blank_folder)
        stage(blanked, "blank", "blank", acc_label="blank-prompt acc")
    for template in ("instruction", "cot", "self-consistency"):
        if template in config.methods:
            stage(requests, template, template, Stage(template))
    if "sofa" in config.methods:
        sigma = sofa_sigma(clock, cal_items)
        stage(requests, "sofa", "sofa", Stage(sofa_sigma=sigma), f"sofa σ={sigma:g}")
    if not world.is_main:
        return None
    fit_or_load_calibration(config, run_dir, cal_records, checked.calibration)
    return _score(config, run_dir, report)


def _score(config: EvalConfig, run_dir: Path, report: bool = True) -> RunResult:
    """`score_run` with the run's methods, options and calibration check."""
    check = config.check_calibration
    return score_run(
        run_dir, config.methods, config.options, write_report=report, check_calibration=check
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
    run: each part's, each cell's and the groups'); check_calibration: RunDir.calibration's."""
    run = RunDir(run_dir)
    folders = run.parts() if run.is_mixed else {0: run}
    parts = {n: scoring_inputs(f, methods, options, check_calibration) for n, f in folders.items()}
    if run.is_mixed:  # each cell's metrics and the groups', from the parts' files alone
        metrics: dict[str, Any] = {"num_candidates": sorted(parts), "methods_scored": list(methods)}
        metrics.update(score_cells(run.cells(), parts, methods))
        metrics["timing"] = reduce(summed_times, [f.timing() for f in folders.values()], {})
        metrics["source"] = run.source()
        run.write_metrics(metrics)
        table = format_cells_table(metrics, methods)
    else:
        part = parts[0]
        start = time.perf_counter()
        scored = score_records(
            part.records, methods, part.calibration, part.options, stages=part.stages
        )
        # Wall seconds per stage (run.json's, summed over sessions) and of this scoring.
        timing = {**run.timing(), "scoring": round(time.perf_counter() - start, 3)}
        metrics = run.write_scored(scored, timing=timing)
        table = "\n".join(filter(None, (format_table(metrics), format_panel(metrics))))
    report = None
    if write_report:
        from lad.outputs.report import write_report as write

        report = write([run_dir], run.report_folder)
    return RunResult(run_dir, metrics, table, report)


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
    ns = sorted({c.num_candidates for c in cells})
    parts = {n: part_config(config, run_dir, n, data) for n in ns}
    run = RunDir(run_dir)
    if not world.is_main:
        for n, part in parts.items():
            _evaluate(part, run.part(n).path, world, backends=backends)
        return None
    own = {k: file_digest(getattr(config, k)) for k in PART_INPUTS if getattr(config, k)}
    own.update(model_digest(config.model))
    # Refused before the first write: a live run, or another run's directory.
    run.begin(config.identity(), EvalConfig().identity(), own, write=False)
    existed = run_dir.exists()
    try:
        write_part_inputs(config, parts, data)
        work, checked = {}, {}
        for n, part in parts.items():
            folder = run.part(n).path
            work[n] = run_items(part, folder, read_data(part))  # a bad --orders refused here too
            checked[n] = check_inputs(part, folder, work[n])
    except LadError as e:
        if existed:
            raise
        shutil.rmtree(run_dir, ignore_errors=True)  # a refused run leaves nothing behind,
        raise type(e)(_named_as_given(str(e), config, parts)) from None  # nor names it
    if after_checks is not None:
        after_checks()
    with RunLock(run_dir):
        run.begin(config.identity(), EvalConfig().identity(), own)
        run.write_cells(cells_json(cells, {n: RunDir.part_name(n) for n in parts}))
        for n, part in parts.items():
            with RunLock(run.part(n).path):
                _evaluate(part, run.part(n).path, world, checked[n], work[n], False, backends)
        return _score(config, run_dir)


def _named_as_given(message: str, config: EvalConfig, parts: dict[int, EvalConfig]) -> str:
    """A refusal's message naming the user's files, not the parts' copies it removed."""
    for n, part in parts.items():
        for key in PART_INPUTS:
            copy = getattr(part, key)
            if copy and getattr(config, key) and copy != getattr(config, key):
                message = message.replace(copy, f"{getattr(config, key)} (its N = {n} items)")
    return message


# ---------------------------------------------------------------- suites


def run_suite(
    suite: Any,
    out: str | Path,
    *,
    data_roots: Sequence[str] = (),
    model: str | None = None,
    compare: str | None = None,
    say: Callable[[str], None] = print,
    trust_remote_code: bool = False,
) -> SuiteResult:
    """Run every cell of `suite` (lad.suites.Suite) for its models, or for `model` alone, into
    out/<model>/<cell>/ (one `lad eval` run directory each; a finished one is only rescored), and
    lay the numbers out beside the paper's. Every benchmark folder is checked first, and every
    cell's data converted, before any model work. trust_remote_code: the models' own code may
    run (RecordSpec.trust_remote_code)."""
    out = Path(out)
    roots = benchmark_roots(suite, list(data_roots))
    check_data(suite, roots)
    models = suite_models(suite, model)
    chosen = {label: compared(suite, label, compare) for label, _ in models}  # before any work
    plans = []
    items: dict[str, list[Item]] = {}  # a converted cell's items, read once for all its runs
    for label, path in models:
        for cell in suite.cells:
            settings = {**suite.settings, **cell.settings}
            preset = settings.pop("preset", "paper")
            data = cell_data(suite, cell, roots, out, settings)
            if cell.num_candidates is None and data["data"] != "shapes" and cell.id not in items:
                items[cell.id] = read_items(data["data"])  # its N: refused before any work
            n = cell.num_candidates or one_n(items.get(cell.id))
            stated = {**settings, **data, "model": path, "quiet": True}
            stated["trust_remote_code"] = trust_remote_code or None
            try:  # a setting refused with the others (--sofa-sigma 2): named by its cell
                config = eval_config(preset, **stated, **({"num_candidates": n} if n else {}))
            except LadError as e:
                raise type(e)(f"{suite.source}: cell {cell.id!r}: {e}") from None
            plans.append((label, cell, config, child(child(out, slug(label)), cell.slug)))
    backends: dict = {}
    results: dict[str, dict[str, Any]] = {label: {} for label, _ in models}
    runs: dict[str, dict[str, Path]] = {label: {} for label, _ in models}
    rescored = []  # the finished cells: no model work, only scoring
    inputs: dict[str, RunData | None] = {}  # each cell's, read once for every model's run
    for k, (label, cell, config, run_dir) in enumerate(plans, 1):
        if k > 1 and label != plans[k - 2][0]:
            backends.clear()  # the model before is done with: free its memory for the next
        if cell.id not in inputs:
            try:
                inputs[cell.id] = read_data(config, items.get(cell.id))
            except LadError:
                inputs[cell.id] = None  # refused by evaluate, with its reason
        data: RunData | None = inputs[cell.id]
        finished = data is not None and _finished(config, run_dir, data)
        state = "finished, rescored" if finished else "running"
        say(f"[{k}/{len(plans)}] {label} · {cell.id}: {state}")
        if finished:
            rescored.append(run_dir)
        # A finished cell's records are read back, never remade, and scored again under the
        # suite's methods and scoring settings, as a rerun of its lad eval is (metrics.json does
        # not say which scoring settings made it).
        result = evaluate(config, run_dir, backends=backends, data=data)
        results[label][cell.id] = cell_numbers(result.metrics if result is not None else None)
        runs[label][cell.id] = run_dir
    rows = table_rows(suite, results, chosen)
    return SuiteResult(format_suite_table(suite, rows), rows, runs, rescored)


def _finished(config: EvalConfig, run_dir: Path, data: RunData) -> bool:
    """Whether a run directory was finished with these record-defining arguments and methods."""
    made = config  # a mixed run's run.json: its arguments as given (each part resolves)
    try:
        if len(cells_of(data.items or [])) <= 1:
            made = resolved(config, data)
    except LadError:
        return False
    return RunDir(run_dir).finished(made.identity(), config.methods) is not None
