"""`lad eval`: a run directory from items to report, resumable (docs/formats.md lists its files).

The model runs once per (item, ordering) and its records are appended as they are made; every
method, metric and figure is then computed from the stored records. A run directory holds:

    run.json             the arguments that define the records (checked on every rerun)
    data/                the generated benchmark, when --data shapes
    calibration.jsonl    calibration records: each calibration item under all N cyclic shifts
    calibration.json     the fitted Calibration (§4.2)
    records.jsonl        evaluation records: each item under T shuffles
    perm_records.jsonl   each evaluation item under all N cyclic shifts (only for perm-avg)
    instruction_records.jsonl, cot_records.jsonl, sc_records.jsonl
                         the evaluation requests under each generation baseline's prompt, replies
                         in `extra` (only for instruction, cot, self-consistency)
    sofa_records.jsonl   the evaluation requests under the SoFA mask (only for sofa)
    sofa_grid/sigma*.jsonl, sofa.json
                         calibration requests under each σ of the grid (only for --sofa-sigma auto)
    predictions.jsonl    one line per (record, method)
    metrics.json         the metrics format of docs/formats.md
    report/index.html    figures and tables (lad.report)

This module is the pipeline; its parts live beside it: lad.config (`EvalConfig`), lad.preflight
(every check made before any model work), lad.stages (each records file, made by the model) and
lad.rundir (the lock, run.json, resume and shards).
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from lad import rundir
from lad.calibrate import Calibration
from lad.config import (
    EvalConfig,
    resolve_repetition_penalty,
    run_preprocessing,
    run_prompt_sha256,
)
from lad.data.items import Item, read_items, shuffle_orders
from lad.errors import DataError, RunError
from lad.files import write_text
from lad.labels import get_scheme
from lad.methods import METHODS, MethodOptions, choose
from lad.metrics import compute_metrics, format_panel, format_table
from lad.preflight import calibration_check, check_inputs
from lad.prompts import CAPTION, vanilla_template
from lad.records import RecordSet, predictions_for, read_records, write_predictions
from lad.rundir import World
from lad.stages import (
    STAGE_FILES,
    Clock,
    LazyBackend,
    Request,
    Stage,
    cyclic_requests,
    run_stage,
    sofa_sigma,
)


@dataclass
class RunResult:
    run_dir: Path
    metrics: dict[str, Any]
    table: str
    report: Path | None


# ---------------------------------------------------------------- requests


def evaluation_requests(items: Sequence[Item], num_shuffles: int, seed: int) -> list[Request]:
    """Each item under T orderings: the identity first, then seeded random permutations (§5.2)."""
    return [
        (item, t, order)
        for item in items
        for t, order in enumerate(shuffle_orders(item.id, item.num_candidates, num_shuffles, seed))
    ]


def run_requests(config: EvalConfig, items: Sequence[Item]) -> list[Request]:
    """The evaluation requests of a run: each item under the orders of `config.orders` when
    given (lad.data.orders), else under T seeded shuffles."""
    if config.orders is None:
        return evaluation_requests(items, config.num_shuffles, config.seed)
    from lad.data.orders import orders_for, read_orders

    given = orders_for(items, read_orders(config.orders, config.num_candidates), config.orders)
    return [
        (item, t, order)
        for item, mine in zip(items, given, strict=True)
        for t, order in enumerate(mine)
    ]


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
    every rescoring agree (lad.config.resolve_repetition_penalty)."""
    penalty = resolve_repetition_penalty(config.repetition_penalty, config.model)
    return dataclasses.replace(config, repetition_penalty=penalty)


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
    scheme = get_scheme(config.labels)
    labels = scheme.labels(config.num_candidates)
    sha = run_prompt_sha256(config.prompt_template, scheme, config.num_candidates)
    if config.calibration:
        calibration = Calibration.load(config.calibration)
    else:
        assert calibration_records is not None
        inputs = json.loads((run_dir / "run.json").read_text()).get("inputs")
        calibration = Calibration(obs_mean=config.obs_mean).fit(
            calibration_records,
            model=config.model,
            labels=labels,
            prompt_sha256=sha,
            preprocessing=run_preprocessing(config.identity(), inputs),
        )
    calibration.save(run_dir / "calibration.json")
    return calibration


def evaluate(
    config: EvalConfig,
    run_dir: str | Path,
    world: World | None = None,
    after_checks: Callable[[], None] | None = None,
) -> RunResult | None:
    """Run (or resume) one evaluation into `run_dir` and return its metrics.

    Under several processes (accelerate launch, torchrun) each makes its share of the records;
    the main process merges, scores and reports, and the others return None. `after_checks` is
    called once every argument and input passed its checks, before any model work (the CLI's
    notes go there, so a refused run prints its one error line and nothing else).
    """
    run_dir = Path(run_dir)
    world = world or World.from_env()
    config = resolve_penalty(resolve_prompt(config))
    if not world.is_main:
        return _evaluate(config, run_dir, world)
    items = None if config.data == "shapes" else load_items(config, run_dir)
    inputs = check_inputs(config, run_dir, items)
    if after_checks is not None:
        after_checks()
    with rundir.RunLock(run_dir):
        return _evaluate(config, run_dir, world, inputs)


def _evaluate(
    config: EvalConfig, run_dir: Path, world: World, inputs: dict[str, Any] | None = None
) -> RunResult | None:
    if world.is_main:
        rundir.check_run_dir(run_dir, config.identity(), EvalConfig().identity(), inputs)
        load_items(config, run_dir)  # builds generated data once, before the others read it
    world.barrier()
    eval_items, cal_items = load_items(config, run_dir)
    make_backend = LazyBackend(config, world.device(config.device), run_dir)
    clock = Clock(run_dir, world, make_backend)

    def stage(
        requests: list[Request],
        file: str,
        name: str,
        kind: Stage | None = None,
        desc: str = "",
        acc_label: str | None = None,
    ) -> RecordSet:
        path = run_dir / file
        with clock(name, path, len(requests)):
            return run_stage(
                make_backend, requests, path, config, desc or name, world, kind, acc_label
            )

    requests = run_requests(config, eval_items)  # a bad --orders file fails before model work
    cal_records = None
    if not config.calibration:
        cal_records = stage(cyclic_requests(cal_items), "calibration.jsonl", "calibration")
    stage(requests, "records.jsonl", "evaluation")
    if "perm-avg" in config.methods:
        # Each shift alone is a vanilla prompt; perm-avg's own accuracy needs all N of them.
        shifts = cyclic_requests(eval_items)
        stage(shifts, "perm_records.jsonl", "perm-avg", acc_label="vanilla acc per shift")
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
        quiet=config.quiet,
        check_calibration=config.calibration_check,
    )


def score_run(
    run_dir: Path,
    methods: Sequence[str],
    options: MethodOptions,
    *,
    quiet: bool = False,
    write_report: bool = True,
    check_calibration: bool = True,
) -> RunResult:
    """Predictions, metrics.json and the report, from the run directory's files alone.

    check_calibration: refuse a calibration.json of another model, label scheme, prompt, chat
    template or image preprocessing.
    """
    records = read_records(run_dir / "records.jsonl")
    calibration = Calibration.load(run_dir / "calibration.json")
    stored = json.loads((run_dir / "run.json").read_text())
    arguments = stored["arguments"]
    scheme = get_scheme(arguments["labels"])
    calibration_check(
        calibration, records, arguments, scheme, check_calibration, stored.get("inputs")
    )
    perm_path = run_dir / "perm_records.jsonl"
    perm_records = read_records(perm_path) if "perm-avg" in methods else None
    options = dataclasses.replace(options, labels=scheme.name)

    start = time.perf_counter()
    stages = {"records": records}
    predictions, written, tokens = {}, [], {}
    for method in methods:
        stage_name = METHODS[method].stage
        if stage_name not in stages:
            stages[stage_name] = stage_records(run_dir, stage_name, records)
        stage = stages[stage_name]
        scores, predictions[method] = choose(method, stage, calibration, options, perm_records)
        written += predictions_for(records, method, scores, predictions[method])
        if METHODS[method].parse is not None:
            tokens[method] = generated_tokens_per_item(stage)
    write_predictions(run_dir / "predictions.jsonl", written)
    costs = {m: METHODS[m].forward_passes(records.num_candidates) for m in methods}
    metrics = compute_metrics(records, predictions, costs=costs)
    for method, count in tokens.items():
        metrics["methods"][method]["generated_tokens_per_item"] = count
    # Wall seconds per stage (run.json's, summed over sessions) and of this scoring.
    scoring = round(time.perf_counter() - start, 3)
    metrics["timing"] = {**rundir.stage_times(run_dir), "scoring": scoring}
    write_text(run_dir / "metrics.json", json.dumps(metrics, indent=2) + "\n")
    table = "\n".join(filter(None, (format_table(metrics), format_panel(metrics))))
    report = None
    if write_report:
        from lad.report import write_report as _write_report

        report = _write_report([run_dir], run_dir / "report")
    return RunResult(run_dir, metrics, table, report)


def stage_records(run_dir: Path, stage: str, records: RecordSet) -> RecordSet:
    """A method stage's records; they must answer the evaluation records' requests, in order."""
    path = run_dir / STAGE_FILES[stage]
    if not path.is_file():
        raise RunError(f"{path}: missing; rerun lad eval with --methods including {stage}")
    made = read_records(path)
    if made.keys() != records.keys() or not np.array_equal(made.order, records.order):
        raise RunError(
            f"{path}: its (item, ordering) records differ from records.jsonl; the file is "
            "from another run or incomplete. Rerun lad eval to finish it."
        )
    return made


def generated_tokens_per_item(records: RecordSet) -> float:
    """Mean, over records, of the tokens generated for a record (all its paths together)."""
    counts = [sum(extra.get("generated_tokens", [])) for extra in records.extra]
    return float(np.mean(counts)) if counts else 0.0
