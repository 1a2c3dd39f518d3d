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
    add_calibration_check_flag,
    add_dtype_flag,
    add_image_flags,
    add_labels_flag,
    add_lad_flags,
    add_methods_flag,
    add_obs_mean_flag,
    add_preset_flag,
    add_quiet_flag,
    add_repetition_penalty_flag,
    add_trust_remote_code_flag,
    add_whole,
    check_layer_range_flag,
    command,
    image_options,
    items_or_shapes,
    methods_given,
    model_path,
    number,
    number_or,
)
from lad.errors import LadError
from lad.io.files import check_not_inputs, check_output_dir, check_output_file
from lad.run.config import CALIBRATE_ON, DEFAULTS, SETTINGS


def _model_flags(p: argparse.ArgumentParser, default: str | None = DEFAULTS.model) -> None:
    p.add_argument(
        "--model",
        type=model_path,
        default=default,
        required=default is None,
        help="hub id or local path of a supported model, or a model shipped with lad: 'demo' "
        "(pictures), 'text-demo' (text options; docs/demo-model.md)",
    )
    p.add_argument("--device", default=DEFAULTS.device, help="auto, cpu, cuda or cuda:N")
    add_trust_remote_code_flag(p)
    p.add_argument(
        "--engine",
        default="hf",
        choices=["hf", "vllm"],
        help="what makes the records: hf (transformers) or vllm (docs/backends.md)",
    )
    add_dtype_flag(p)
    add_labels_flag(p)
    _setting(p, "--batch-size", minimum=1, help="prompts per forward pass")
    p.add_argument(
        "--prompt-template",
        type=InputPath,
        metavar="FILE",
        help="your own prompt text with placeholders {query} (the question or caption), {n}, "
        "{labels}, {first}, {last}, {noun}, {single}, and {options} where text candidates are "
        "listed (required for them, refused for pictures; lad.core.prompts); default: the "
        "paper's template, its question variant for items with a 'question', or the text "
        "template for items of text candidates",
    )
    p.add_argument(
        "--chat-template",
        type=InputPath,
        metavar="FILE",
        help="Jinja chat template to use instead of the checkpoint's own (e.g. for a base model "
        "whose template ignores images)",
    )


def _setting(p: Any, *names: str, minimum: int, help: str) -> None:
    """A whole-number flag of an EvalConfig setting, its default the setting's (DEFAULTS)."""
    default = getattr(DEFAULTS, names[0].removeprefix("--").replace("-", "_"))
    add_whole(p, *names, minimum=minimum, default=default, help=help)


def _template(path: str | None) -> Any:
    """The --prompt-template FILE, read and checked (lad.core.prompts.PromptTemplate), or None."""
    from lad.core.prompts import PromptTemplate

    return None if path is None else PromptTemplate.from_file(path)


def _check_sigma(value: float, text: str) -> None:
    if not 0 <= value <= 1:
        raise LadError(f"--sofa-sigma must be a number in [0, 1] or 'auto'. Got {text}.")


_sigma = number_or("auto", "a number in [0, 1]", _check_sigma)


def _baseline_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("baselines (docs/baselines.md)")
    _setting(
        g,
        "--max-new-tokens",
        minimum=1,
        help="reply length limit (instruction, cot, self-consistency)",
    )
    _setting(g, "--sc-samples", minimum=1, help="self-consistency paths")
    g.add_argument(
        "--sc-temperature",
        type=number("--sc-temperature", 0.0, closed=False),
        default=DEFAULTS.sc_temperature,
        help="self-consistency sampling temperature, > 0",
    )
    _setting(g, "--sc-top-k", minimum=0, help="self-consistency top-k (0: all tokens)")
    g.add_argument(
        "--sofa-sigma",
        type=_sigma,
        default=DEFAULTS.sofa_sigma,
        help="SoFA weight σ of future image tokens, or 'auto' (grid on calibration items)",
    )
    g.add_argument(
        "--sofa-within-image",
        action="store_true",
        help="SoFA also opens later tokens of the same image (else across images only)",
    )


def register(subparsers: argparse._SubParsersAction) -> None:
    p = command(subparsers, "eval", _eval)
    _model_flags(p)
    p.add_argument(
        "--data", type=items_or_shapes, default=DEFAULTS.data, help="items .jsonl file, or 'shapes'"
    )
    _setting(
        p,
        "--num-candidates",
        "-n",
        minimum=2,
        help="N candidates per query (images or text options)",
    )
    p.add_argument(
        "--setting",
        default=DEFAULTS.setting,
        choices=SETTINGS,
        help="shapes benchmark setting (for --data shapes)",
    )
    add_whole(p, "--items", minimum=1, help="evaluation items (default: all; 100 for shapes)")
    cal = p.add_mutually_exclusive_group()
    cal.add_argument(
        "--calibration-data", type=InputPath, default=None, help="items file for calibration"
    )
    cal.add_argument("--calibration", type=InputPath, default=None, help="a saved calibration.json")
    add_whole(
        p,
        "--calibration-items",
        minimum=1,
        help="|D_cal| (default: 5, or all a smaller calibration file holds); calibration.jsonl "
        "keeps them all, so lad ablate can draw subsets",
    )
    p.add_argument(
        "--calibrate-on",
        choices=CALIBRATE_ON,
        help="calibration items held out from --data (paper; default) or the first "
        "--calibration-items evaluation items, scored too (official code; warns)",
    )
    add_methods_flag(p, DEFAULTS.methods)
    shown = p.add_mutually_exclusive_group()
    _setting(shown, "--num-shuffles", minimum=1, help="T orderings per item")
    shown.add_argument(
        "--orders",
        type=InputPath,
        metavar="FILE",
        help="jsonl of {item, order}: evaluate exactly these orderings (a records.jsonl works)",
    )
    p.add_argument(
        "--seed",
        type=int,
        default=DEFAULTS.seed,
        help="seed of the shuffles and of the shapes benchmark",
    )
    add_lad_flags(p)
    add_calibration_check_flag(p)
    add_image_flags(p)
    add_repetition_penalty_flag(p)
    _baseline_flags(p)
    p.add_argument("--out", type=OutputPath, default="runs/default", help="run directory")
    add_quiet_flag(p)
    p.set_defaults(implied=_run_files)

    p = command(subparsers, "calibrate", _calibrate)
    _model_flags(p)
    p.add_argument("--data", type=InputPath, required=True, help="items .jsonl file")
    add_whole(p, "--items", minimum=1, default=5, help="how many items of --data to use")
    add_preset_flag(p)
    add_obs_mean_flag(p)
    add_image_flags(p)
    add_repetition_penalty_flag(p)
    p.add_argument("--out", type=OutputPath, required=True, help="calibration.json to write")
    add_quiet_flag(p)
    p.set_defaults(implied=_calibrate_files)

    p = command(subparsers, "predict", _predict)
    _model_flags(p)
    p.add_argument(
        "--calibration",
        type=InputPath,
        required=True,
        help="calibration.json from lad calibrate/eval",
    )
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
    add_calibration_check_flag(p)
    add_image_flags(p)
    add_repetition_penalty_flag(p)
    p.add_argument("--json", action="store_true", help="print JSON (positions 0-based)")
    add_quiet_flag(p)

    p = command(subparsers, "report", _report)
    p.add_argument("runs", type=InputPath, nargs="+", help="run directories")
    p.add_argument(
        "--out",
        type=OutputPath,
        help="folder to write (default: RUN/report for one run; ./report for several)",
    )


def _run_files(args: argparse.Namespace) -> tuple[dict[str, Any], dict[str, Any]]:
    """The files of a run directory lad eval writes (lad.run.rundir.RUN_OUTPUTS)."""
    from lad.run.rundir import RUN_OUTPUTS

    return {}, {f"--out {args.out}/{name}": Path(args.out) / name for name in RUN_OUTPUTS}


def _calibrate_files(args: argparse.Namespace) -> tuple[dict[str, Any], dict[str, Any]]:
    """lad calibrate writes its records beside --out X.json, as X.records.jsonl."""
    out = Path(args.out)
    return {}, {"its records file": out.with_name(out.stem + ".records.jsonl")}


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
    stated["prompt_template"] = getattr(_template(args.prompt_template), "text", None)
    config = eval_config(args.preset, **stated)
    data = read_data(config)  # each input file read once, here
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

    out = check_output_file(args.out)
    records_out = out.with_name(out.stem + ".records.jsonl")
    items = read_items(args.data)[: args.items]
    images = [p for it in items for p in it.pictures]
    check_not_inputs(
        {"--out": out, "its records file": records_out}, {"--data": args.data, "image": images}
    )
    debiaser = build_debiaser(args, obs_mean=args.obs_mean, batch_size=args.batch_size)
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
    names = ("top_k", "tau", "check_calibration", "obs_mean", "mixture", "attn_mean", "layer_range")
    debiaser = build_debiaser(args, **{n: getattr(args, n) for n in names}).load(args.calibration)
    from lad.run.preflight import check_top_k

    layers = debiaser.calibration_.num_layers  # the model's, as far as can be known before it loads
    check_top_k(args.top_k, layers, f"the calibration {args.calibration}")
    check_layer_range_flag(debiaser.options.layer_range, layers, args)
    choice = debiaser.predict(
        args.query, args.images, question=args.question, texts=args.text_options
    )
    if args.json:
        print(json.dumps(choice.to_dict(), indent=2))
        return 0
    if args.text_options is not None:
        print(choice.summary(args.text_options, "option"))
    else:
        print(choice.summary(args.images))
    return 0


def build_debiaser(args: argparse.Namespace, **more: Any) -> Any:
    """The Debiaser of a command's model, spec and --preset flags (stated flags win)."""
    from lad.run.debiaser import Debiaser

    names = ("labels", "device", "dtype", "quiet", "chat_template", "image_size", "engine")
    names += ("trust_remote_code", "repetition_penalty")
    return Debiaser(
        args.model,
        preset=args.preset,
        **{name: getattr(args, name) for name in names},
        prompt_template=getattr(_template(args.prompt_template), "text", None),
        image_options=image_options(args) or None,
        **more,
    )


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
