"""`lad eval`, `lad calibrate`, `lad predict`, `lad report`: thin over lad.evaluate,
lad.run.debiaser and lad.outputs.report."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from lad.cli.flags import (
    InputPath,
    OutputPath,
    add_image_flags,
    add_lad_flags,
    add_methods_flag,
    add_preset_flag,
    add_quiet_flag,
    add_settings,
    add_whole,
    check_layer_range_flag,
    command,
    image_options,
    methods_given,
)
from lad.core.prompts import PromptTemplate
from lad.errors import LadError
from lad.io.files import check_not_inputs, check_output_dir, check_output_file
from lad.run.config import DEFAULT_CALIBRATION_ITEMS, DEFAULTS, OPTION_FIELDS

# The model and record flags of lad eval, calibrate and predict.
MODEL_FLAGS = ("model", "device", "trust_remote_code", "engine", "dtype", "labels", "batch_size")
MODEL_FLAGS += ("prompt_template", "chat_template")
BASELINE_FLAGS = ("max_new_tokens", "sc_samples", "sc_temperature", "sc_top_k", "sofa_sigma")


def register(subparsers: argparse._SubParsersAction) -> None:
    p = command(subparsers, "eval", _eval)
    add_settings(p, *MODEL_FLAGS, "data", "num_candidates", "setting", "items")
    add_settings(p.add_mutually_exclusive_group(), "calibration_data", "calibration")
    add_settings(p, "calibration_items", "calibrate_on")
    add_methods_flag(p, DEFAULTS.methods)
    add_settings(p.add_mutually_exclusive_group(), "num_shuffles", "orders")
    add_settings(p, "seed")
    add_lad_flags(p)
    add_settings(p, "check_calibration")
    add_image_flags(p)
    add_settings(p, "repetition_penalty")
    baselines = p.add_argument_group("baselines (docs/baselines.md)")
    add_settings(baselines, *BASELINE_FLAGS, "sofa_within_image")
    p.add_argument("--out", type=OutputPath, default="runs/default", help="run directory")
    add_quiet_flag(p)
    p.set_defaults(implied=_run_files)

    p = command(subparsers, "calibrate", _calibrate)
    add_settings(p, *MODEL_FLAGS)
    p.add_argument("--data", type=InputPath, required=True, help="items .jsonl file")
    add_whole(
        p,
        "--items",
        minimum=1,
        help=f"how many items of --data to use (default: {DEFAULT_CALIBRATION_ITEMS})",
    )
    add_preset_flag(p)
    add_settings(p, "obs_mean")
    add_image_flags(p)
    add_settings(p, "repetition_penalty")
    p.add_argument("--out", type=OutputPath, required=True, help="calibration.json to write")
    add_quiet_flag(p)
    p.set_defaults(implied=_calibrate_files)

    p = command(subparsers, "predict", _predict)
    add_settings(p, *MODEL_FLAGS)
    add_settings(p, "calibration", required=True, help="calibration.json from lad calibrate/eval")
    asked = p.add_mutually_exclusive_group(required=True)
    asked.add_argument("--query", help="the caption to match")
    asked.add_argument(
        "--question", help="a question of your own that one of the candidates answers"
    )
    p.add_argument(
        "images", type=InputPath, nargs="*", help="the candidate images, in the order shown"
    )
    p.add_argument(
        "--text-options",
        nargs="+",
        metavar="TEXT",
        help="text candidates instead of images, in the order shown (listed under their "
        "labels by the text prompt, lad.core.prompts)",
    )
    add_lad_flags(p)
    add_settings(p, "check_calibration")
    add_image_flags(p)
    add_settings(p, "repetition_penalty")
    p.add_argument("--json", action="store_true", help="print JSON (positions 0-based)")
    add_quiet_flag(p)

    p = command(subparsers, "report", _report)
    p.add_argument("runs", type=InputPath, nargs="+", help="run directories")
    p.add_argument(
        "--out",
        type=OutputPath,
        help="folder to write (default: RUN/report for one run; ./report for several)",
    )


def _run_files(args: argparse.Namespace) -> dict[str, Any]:
    """The files of a run directory lad eval writes (lad.run.rundir.RUN_OUTPUTS)."""
    from lad.run.rundir import RUN_OUTPUTS

    return {f"--out {args.out}/{name}": Path(args.out) / name for name in RUN_OUTPUTS}


def _calibrate_files(args: argparse.Namespace) -> dict[str, Any]:
    """lad calibrate writes its records beside --out X.json, as X.records.jsonl."""
    out = Path(args.out)
    return {"its records file": out.with_name(out.stem + ".records.jsonl")}


def _eval(args: argparse.Namespace) -> int:
    """calibrate, evaluate, score, report: one run directory

    Run a model on a benchmark under T shuffles, calibrate on held-out items, score every
    method, and write records, metrics and a report into --out. Resumes an interrupted run.
    Methods: vanilla, pride, blank, lad, attn, attn-purified, perm-avg, instruction, cot,
    self-consistency, sofa.

    Example:
        lad eval --num-candidates 8 --out runs/demo-n8
    """
    from lad.backends.checkpoint import resolve_model
    from lad.backends.threads import describe_threads
    from lad.evaluate import evaluate
    from lad.run.config import FIELDS, eval_config
    from lad.run.inputs import read_data, resolve_calibration_items
    from lad.run.preflight import model_num_layers
    from lad.run.rundir import RunDir

    stated = {name: getattr(args, name) for name in FIELDS if hasattr(args, name)}
    stated["methods"] = methods_given(args.methods, DEFAULTS.methods)
    stated["image_options"] = image_options(args)
    stated["prompt_template"] = PromptTemplate.file_text(args.prompt_template)
    config = eval_config(args.preset, **stated)
    data = read_data(config)  # each input file read once, here
    if data.items and all(it.is_text for it in data.items):  # no pictures asked
        config = eval_config(args.preset, pictures=False, **stated)
    config, note = resolve_calibration_items(config, data)
    check_layer_range_flag(config.layer_range, model_num_layers(resolve_model(config.model)), args)
    notes = [note] if note else []
    if config.calibrate_on == "evaluation":
        notes.append(
            f"Warning: calibrating on the first {config.calibration_items} evaluation items, "
            "which are scored too (the official code's choice); results on them are not held "
            "out (§4.2)"
        )
    result = evaluate(config, args.out, after_checks=lambda: _say(notes), data=data)
    if result is None:  # not the main process of a distributed run
        return 0
    print(result.table)
    timing = result.metrics.get("timing", {})
    threads = describe_threads(RunDir(result.run_dir).threads())  # "" on an accelerator
    wall = ", ".join(f"{stage} {s:.1f} s" for stage, s in timing.items())
    print(f"\nwall time:     {wall}" + (f"; {threads}" if threads else ""))
    print(f"run directory: {result.run_dir}")
    print(f"metrics:       {RunDir(result.run_dir).metrics_file}")
    if result.report:
        print(f"report:        {result.report}")
    return 0


def _say(lines: list[str]) -> None:
    """Lines said on stderr once the run's checks passed (never before an error line)."""
    for line in lines:
        print(line, file=sys.stderr)


def _calibrate(args: argparse.Namespace) -> int:
    """fit a calibration.json from a few items (§4.2)

    Run the symmetrised calibration set (every item under all N cyclic shifts) and fit the bias
    matrix and attention prior. The records are kept beside the output.

    Example:
        lad calibrate --model demo --data cal.jsonl --out calibration.json
    """
    from lad.data.items import read_items
    from lad.run.inputs import stated_items

    out = check_output_file(args.out)
    records_out = _calibrate_files(args)["its records file"]
    items = stated_items(
        read_items(args.data), args.items, args.data, "items", DEFAULT_CALIBRATION_ITEMS
    )
    images = [p for it in items for p in it.pictures]
    # --data against both: lad.cli.main; the items' pictures are known only now
    check_not_inputs({"--out": out, "its records file": records_out}, {"image": images})
    debiaser = build_debiaser(args, pictures=not all(it.is_text for it in items))
    debiaser.fit(items, records_path=records_out)
    debiaser.save(out)
    cal = debiaser.calibration_
    print(
        f"calibration of {cal.num_items} items × {cal.num_candidates} shifts, γ = {cal.gamma:.3f}"
    )
    print(f"written: {out} (records: {records_out})")
    return 0


def _predict(args: argparse.Namespace) -> int:
    """debias one choice among N images or text options

    Ask the model which image (or, with --text-options, which text option) matches a query or
    answers a question of your own, and debias the answer with a calibration fitted under the
    same prompt (for text options: one fitted on items of text candidates). Positions are
    1-based in the text output, 0-based with --json.

    Example:
        lad predict --calibration runs/default/calibration.json --query 'a red circle' \\
            a.png b.png c.png d.png
        lad predict --model llava-hf/llava-onevision-qwen2-7b-ov-hf \\
            --calibration mmiu-cal.json --labels image-ordinals \\
            --question 'Which image is most likely to be a fake photograph?' \\
            a.jpg b.jpg c.jpg d.jpg
        lad predict --model text-demo --calibration runs/text-demo/calibration.json \\
            --question 'Which option is a fruit?' --text-options tiger paris apple copper
    """
    if bool(args.images) == (args.text_options is not None):
        raise LadError(
            "lad predict takes the candidate images or --text-options TEXT ..., "
            + ("not both" if args.images else "and got neither")
        )
    debiaser = calibrated_debiaser(args, pictures=args.text_options is None)
    choice = debiaser.predict(
        args.query, args.images, question=args.question, texts=args.text_options
    )
    if args.json:
        print(json.dumps(choice.to_dict(), indent=2))
    elif args.text_options is not None:
        print(choice.summary(args.text_options, "option"))
    else:
        print(choice.summary(args.images))
    return 0


def build_debiaser(args: argparse.Namespace, **more: Any) -> Any:
    """The Debiaser of a command's model, spec and --preset flags (stated flags win): every one
    of its settings the command declares a flag for is handed on."""
    from lad.run.debiaser import Debiaser

    names = ("labels", "device", "dtype", "quiet", "chat_template", "image_size", "engine")
    names += ("trust_remote_code", "repetition_penalty", "batch_size", "check_calibration")
    names += OPTION_FIELDS
    return Debiaser(
        args.model,
        preset=args.preset,
        **{name: getattr(args, name) for name in names if hasattr(args, name)},
        prompt_template=PromptTemplate.file_text(args.prompt_template),
        image_options=image_options(args) or None,
        **more,
    )


def calibrated_debiaser(args: argparse.Namespace, **more: Any) -> Any:
    """build_debiaser's Debiaser with --calibration loaded, its --top-k and --layer-range checked
    against the calibration's layers before the model loads (lad predict, lad serve)."""
    from lad.run.preflight import check_top_k

    debiaser = build_debiaser(args, **more).load(args.calibration)
    layers = debiaser.calibration_.num_layers  # the model's, as far as can be known before it loads
    check_top_k(args.top_k, layers, f"the calibration {args.calibration}")
    check_layer_range_flag(debiaser.options.layer_range, layers, args)
    return debiaser


def _report(args: argparse.Namespace) -> int:
    """HTML report with figures for run directories

    Write an HTML page with PNG figures for one or more finished runs (runs that differ in N also
    get accuracy against N, one line per method and setting).

    Example:
        lad report runs/n4 runs/n8 --out runs/report
    """
    from lad.outputs.report import write_report

    runs = [Path(r) for r in args.runs]
    for r in runs:
        if not r.is_dir():
            raise LadError(f"{r}: no such run directory")
    out = Path(args.out) if args.out else (runs[0] / "report" if len(runs) == 1 else Path("report"))
    check_output_dir(out)
    print(f"report: {write_report(runs, out)}")
    return 0
