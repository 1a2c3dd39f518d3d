"""`lad eval`: a run directory from items to report, resumable (docs/formats.md lists its files).

The model runs once per (item, ordering) and its records are appended as they are made; every
method, metric and figure is then computed from the stored records (docs/formats.md lists the
files of a run directory). Its parts are in lad.run (docs/architecture.md): config, preflight
(every check before any model work), stages (each records file), rundir, resume and lock.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from lad.core.calibrate import Calibration
from lad.core.cells import Cell, cells_json, format_cells_table, score_cells
from lad.core.methods import MethodOptions
from lad.core.metrics import format_panel, format_table
from lad.core.prompts import CAPTION, vanilla_template
from lad.core.records import RecordSet
from lad.core.scoring import score_records
from lad.data.blank import blank_requests
from lad.data.items import Item, read_items
from lad.data.orders import Request, cyclic_requests, given_requests, shuffled_requests
from lad.errors import DataError, LadError
from lad.io.files import child, write_text
from lad.run.config import DEFAULT_CALIBRATION_ITEMS, EvalConfig, eval_config
from lad.run.lock import RunLock
from lad.run.mixed import mixed_cells, part_config, scoring_inputs, write_part_inputs
from lad.run.preflight import check_inputs
from lad.run.resume import World
from lad.run.rundir import CELLS_FILE, STAGE_FILES, RunDir
from lad.run.runjson import fingerprint
from lad.run.stages import Clock, LazyBackend, Stage, run_stage, sofa_sigma
from lad.suites import slug
from lad.suites.plan import SuiteResult, cell_numbers, compared, one_n, suite_models


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


def resolve_prompt(config: EvalConfig) -> EvalConfig:
    """The run with its vanilla template fixed: --prompt-template, else the built-in question
    template when the evaluation items ask their own questions (stored in run.json, so the
    records, the calibration's fingerprint and every rescoring agree), else the paper's."""
    if config.prompt_template is not None or config.data == "shapes":
        return config
    template = vanilla_template(read_items(config.data, config.num_candidates))
    if template == CAPTION:
        return config
    return dataclasses.replace(config, prompt_template=template.text)


def resolve_penalty(config: EvalConfig) -> EvalConfig:
    """The run with its repetition penalty as a number (or None): "model" (--preset official)
    becomes the model's generation_config's, stored in run.json so records, calibration and
    every rescoring agree (RecordSpec.penalty)."""
    return dataclasses.replace(config, repetition_penalty=config.spec.penalty())


def resolve_calibration_items(config: EvalConfig) -> tuple[EvalConfig, str | None]:
    """The run with |D_cal| decided: as given (a file holding fewer is then refused), else 5, or
    all the items of a smaller calibration file, which the note returned says."""
    if config.calibration_items is not None:
        return config, None
    resolved = dataclasses.replace(config, calibration_items=DEFAULT_CALIBRATION_ITEMS)
    source = config.data if config.calibrate_on == "evaluation" else config.calibration_data
    if source is None or not Path(source).is_file():  # 'shapes', or a file evaluate refuses
        return resolved, None
    held = min(Counter(it.num_candidates for it in read_items(source)).values())  # of each N
    if held >= DEFAULT_CALIBRATION_ITEMS:
        return resolved, None
    note = f"Note: {source} holds {held} calibration items: calibrating on {held}"
    return dataclasses.replace(config, calibration_items=held), note


# ---------------------------------------------------------------- data


def load_items(config: EvalConfig, run_dir: Path) -> tuple[list[Item], list[Item]]:
    """(evaluation items, calibration items). Held out (the default), the two never share an item
    id; with `calibrate_on` "evaluation" the calibration items are the first |D_cal| items of the
    data, which are evaluated too (the official code's choice)."""
    n = config.num_candidates
    on_eval = config.calibrate_on == "evaluation"
    if config.data == "shapes":
        from lad.data.shapes import build_shapes

        num_eval = config.items or 100
        common = {"num_candidates": n, "setting": config.setting, "seed": config.seed}
        eval_path = build_shapes(run_dir / "data/eval", items=num_eval, split="eval", **common)
        if on_eval:
            items = read_items(eval_path, n)
            return items, items[: config.calibration_items]
        cal_path = build_shapes(
            run_dir / "data/calibration",
            items=config.calibration_items,
            split="calibration",
            **common,
        )
        return read_items(eval_path, n), read_items(cal_path, n)
    items = read_items(config.data, n)
    if on_eval:
        _enough(items, config.calibration_items, config.data)
        return items[: config.items or len(items)], items[: config.calibration_items]
    if config.calibration_data:
        calibration = read_items(config.calibration_data, n)
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
        fingerprint = config.spec.fingerprint(config.num_candidates, inputs)
        calibration = Calibration(obs_mean=config.obs_mean).fit(calibration_records, **fingerprint)
    calibration.save(run_dir / "calibration.json")
    return calibration


def evaluate(
    config: EvalConfig,
    run_dir: str | Path,
    world: World | None = None,
    after_checks: Callable[[], None] | None = None,
    backends: dict | None = None,
) -> RunResult | None:
    """Run (or resume) one evaluation into `run_dir` and return its metrics.

    Under several processes (accelerate launch, torchrun) each makes its share of the records;
    the main process merges, scores and reports, and the others return None. `after_checks` is
    called once every argument and input passed its checks, before any model work (the CLI's
    notes go there, so a refused run prints its one error line and nothing else). `backends`:
    models already loaded, kept for the next run of this process (lad.run.stages.LazyBackend).
    """
    run_dir = Path(run_dir)
    world = world or World.from_env()
    cells = mixed_cells(config)
    if len(cells) > 1:
        return evaluate_mixed(config, cells, run_dir, world, after_checks, backends or {})
    config = resolve_penalty(resolve_prompt(resolve_calibration_items(config)[0]))
    if not world.is_main:
        return _evaluate(config, run_dir, world, backends=backends)
    items = None if config.data == "shapes" else load_items(config, run_dir)
    inputs = check_inputs(config, run_dir, items)
    if after_checks is not None:
        after_checks()
    with RunLock(run_dir):
        return _evaluate(config, run_dir, world, inputs, backends=backends)


def _evaluate(
    config: EvalConfig,
    run_dir: Path,
    world: World,
    inputs: dict[str, Any] | None = None,
    report: bool = True,
    backends: dict | None = None,
) -> RunResult | None:
    if world.is_main:
        RunDir(run_dir).begin(config.identity(), EvalConfig().identity(), inputs)
        load_items(config, run_dir)  # builds generated data once, before the others read it
    world.barrier()
    eval_items, cal_items = load_items(config, run_dir)
    make_backend = LazyBackend(config, world.device(config.device), run_dir, backends)
    make_backend.pictures = not all(it.is_text for it in eval_items + cal_items)
    make_backend.items = eval_items + cal_items
    clock = Clock(run_dir, world, make_backend)

    def stage(requests: list[Request], file: str, name: str, kind=None, desc="", acc_label=None):
        path = run_dir / file
        with clock(name, path, len(requests)):
            args = (requests, path, config, desc or name, world, kind, acc_label)
            return run_stage(make_backend, *args)

    requests = run_requests(config, eval_items)  # a bad --orders file fails before model work
    cal_records = None
    if not config.calibration:
        cal_records = stage(cyclic_requests(cal_items), "calibration.jsonl", "calibration")
    stage(requests, "records.jsonl", "evaluation")
    if "perm-avg" in config.methods:
        # Each shift alone is a vanilla prompt; perm-avg's own accuracy needs all N of them.
        shifts = cyclic_requests(eval_items)
        stage(shifts, "perm_records.jsonl", "perm-avg", acc_label="vanilla acc per shift")
    if "blank" in config.methods:
        # CapCal's extra pass: each request again, every candidate blanked (lad.data.blank).
        blanked = _blank_requests(requests, run_dir)
        stage(blanked, STAGE_FILES["blank"], "blank", acc_label="blank-prompt acc")
    for template in ("instruction", "cot", "self-consistency"):
        if template in config.methods:
            stage(requests, STAGE_FILES[template], template, Stage(template))
    if "sofa" in config.methods:
        sigma = sofa_sigma(config, run_dir, make_backend, cal_items, world, clock)
        kind = Stage(sofa_sigma=sigma)
        stage(requests, STAGE_FILES["sofa"], "sofa", kind, f"sofa σ={sigma:g}")
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


def _blank_requests(requests: list[Request], run_dir: Path) -> list[Request]:
    """The blank prompts of `requests` (same keys and orders). A finished blank stage is only
    read back, by those keys: a rescoring neither decodes a picture nor writes a grey one."""
    path = run_dir / STAGE_FILES["blank"]
    if path.is_file() and path.read_bytes().count(b"\n") >= len(requests):
        return requests
    return blank_requests(requests, run_dir / "blank")


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

    return write_report([run_dir], run_dir / "report")


# ---------------------------------------------------------------- a mixed items file


def evaluate_mixed(
    config: EvalConfig,
    cells: list[Cell],
    run_dir: Path,
    world: World,
    after_checks: Callable[[], None] | None,
    backends: dict,
) -> RunResult | None:
    """A run of several (task, N) cells: one part run directory n{N}/ per N, each a `lad eval` run
    of that N's items with its own calibration (held out from that N's items, or the N's file of
    --calibration DIR); cells.json names each cell's items; metrics.json holds each cell's
    metrics and the item-weighted groups (docs/formats.md, "Mixed runs")."""
    items = read_items(config.data)
    ns = sorted({c.num_candidates for c in cells})
    parts = {n: part_config(config, run_dir, n, items) for n in ns}
    if not world.is_main:
        for n, part in parts.items():
            _evaluate(part, run_dir / f"n{n}", world, backends=backends)
        return None
    named = ("data", "calibration_data", "orders")
    own = {k: fingerprint(getattr(config, k)) for k in named if getattr(config, k)}
    # Refused before the first write: a live run, or another run's directory.
    RunDir(run_dir).check_begin(config.identity(), EvalConfig().identity(), own)
    existed = run_dir.exists()
    try:
        write_part_inputs(config, items, parts)
        inputs = {n: check_inputs(p, run_dir / f"n{n}", load_items(p, run_dir / f"n{n}"))
                  for n, p in parts.items()}  # fmt: skip
    except LadError as e:
        if existed:
            raise
        shutil.rmtree(run_dir, ignore_errors=True)  # a refused run leaves nothing behind,
        raise type(e)(_named_as_given(str(e), config, parts)) from None  # nor names it
    if after_checks is not None:
        after_checks()
    with RunLock(run_dir):
        RunDir(run_dir).begin(config.identity(), EvalConfig().identity(), own)
        layout = cells_json(cells, {n: f"n{n}" for n in parts})
        write_text(run_dir / CELLS_FILE, json.dumps(layout, indent=1) + "\n")
        for n, part in parts.items():
            with RunLock(run_dir / f"n{n}"):
                _evaluate(part, run_dir / f"n{n}", world, inputs[n], False, backends)
        return score_run(
            run_dir,
            config.methods,
            config.method_options,
            check_calibration=config.calibration_check,
        )


def _named_as_given(message: str, config: EvalConfig, parts: dict[int, EvalConfig]) -> str:
    """A refusal's message naming the user's files, not the parts' copies it removed."""
    for n, part in parts.items():
        for key in ("data", "calibration_data", "orders"):
            copy = getattr(part, key)
            if copy and getattr(config, key) and copy != getattr(config, key):
                message = message.replace(copy, f"{getattr(config, key)} (its N = {n} items)")
    return message


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
    write_text(run.file("metrics.json"), json.dumps(metrics, indent=2) + "\n")
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
    chosen = {label: compared(suite, label, compare) for label, _ in models}  # before any work
    plans = []
    for label, path in models:
        for cell in suite.cells:
            settings = {**suite.settings, **cell.settings}
            preset = settings.pop("preset", "paper")
            data = cell_data(suite, cell, roots, out, settings)
            n = cell.num_candidates or one_n(data["data"])
            stated = {**settings, **data, "model": path, "quiet": True}
            config = eval_config(preset, **stated, **({"num_candidates": n} if n else {}))
            plans.append((label, cell, config, child(child(out, slug(label)), cell.slug)))
    backends: dict = {}
    results: dict[str, dict[str, Any]] = {label: {} for label, _ in models}
    runs: dict[str, dict[str, Path]] = {label: {} for label, _ in models}
    skipped = []
    for k, (label, cell, config, run_dir) in enumerate(plans, 1):
        if k > 1 and label != plans[k - 2][0]:
            backends.clear()  # the model before is done with: free its memory for the next
        metrics = _finished(config, run_dir)
        say(f"[{k}/{len(plans)}] {label} · {cell.id}: {'finished' if metrics else 'running'}")
        if metrics is None:
            result = evaluate(config, run_dir, backends=backends)
            metrics = result.metrics if result is not None else None
        else:
            skipped.append(run_dir)
        results[label][cell.id] = cell_numbers(metrics)
        runs[label][cell.id] = run_dir
    rows = table_rows(suite, results, chosen)
    return SuiteResult(format_suite_table(suite, rows), rows, runs, skipped)


def _finished(config: EvalConfig, run_dir: Path) -> dict[str, Any] | None:
    """A run directory's metrics when it was finished with these arguments and methods."""
    if not (run_dir / "metrics.json").is_file():
        return None
    try:
        resolved = config  # a mixed run's run.json: its arguments as given (each part resolves)
        if len(mixed_cells(config)) <= 1:
            resolved = resolve_penalty(resolve_prompt(resolve_calibration_items(config)[0]))
        run = RunDir(run_dir).check()
        metrics = run.metrics()
        same = run.run_json["arguments"] == json.loads(json.dumps(resolved.identity()))
    except LadError:
        return None
    scored = cell_numbers(metrics)["methods"]
    return metrics if same and all(m in scored for m in config.methods) else None
