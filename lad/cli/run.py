"""`lad eval`, `lad calibrate`, `lad predict`, `lad report`: thin over lad.evaluate, lad.api and
lad.report."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from lad.cli.flags import (
    DefaultsOnce,
    InputPath,
    OutputPath,
    add_calibration_check_flag,
    add_image_flags,
    add_lad_flags,
    add_obs_mean_flag,
    add_preset_flag,
    image_options,
    items_or_shapes,
    model_path,
    resolved,
)
from lad.errors import LadError
from lad.files import check_not_inputs, check_output_dir, check_output_file
from lad.labels import LABEL_SCHEMES

# The options a preset may set, per command (lad.presets).
_SCORING = ("obs_mean", "mixture", "attn_mean", "layer_range")
EVAL_PRESET = (*_SCORING, "image_size", "calibrate_on", "prompt_template")
PREDICT_PRESET = (*_SCORING, "image_size", "prompt_template")
CALIBRATE_PRESET = ("obs_mean", "image_size", "prompt_template")


def _model_flags(p: argparse.ArgumentParser, default: str | None = "demo") -> None:
    p.add_argument(
        "--model",
        type=model_path,
        default=default,
        required=default is None,
        help="hub id or local path of a supported model, or 'demo' (default: %(default)s)",
    )
    p.add_argument(
        "--device", default="auto", help="auto, cpu, cuda, cuda:1 (default: %(default)s)"
    )
    p.add_argument("--dtype", default="auto", choices=["auto", "bfloat16", "float16", "float32"])
    p.add_argument(
        "--labels",
        default="digits",
        choices=list(LABEL_SCHEMES),
        help="how positions are named in the prompt and answer (default: %(default)s)",
    )
    p.add_argument("--batch-size", type=int, default=4, help="prompts per forward pass")
    p.add_argument(
        "--prompt-template",
        type=InputPath,
        metavar="FILE",
        default=None,
        help="your own prompt text with placeholders {query} (the question or caption), {n}, "
        "{labels}, {first}, {last}, {noun} (lad.prompts); default: the paper's template, or its "
        "question variant for items with a 'question'",
    )
    p.add_argument(
        "--chat-template",
        type=InputPath,
        default=None,
        metavar="FILE",
        help="Jinja chat template to use instead of the checkpoint's own (e.g. for a base model "
        "whose template ignores images)",
    )


def _template(path: str | None) -> Any:
    """The --prompt-template FILE, read and checked (lad.prompts.PromptTemplate), or None."""
    from lad.prompts import PromptTemplate

    return None if path is None else PromptTemplate.from_file(path)


def _options(args: argparse.Namespace, names: tuple[str, ...]) -> dict[str, Any]:
    """The preset's options among `names`, overridden by stated flags (lad.cli.flags.resolved);
    "prompt_template" is the template's text, from --prompt-template FILE when given."""
    text = getattr(_template(args.prompt_template), "text", None)
    return resolved(argparse.Namespace(**{**vars(args), "prompt_template": text}), names)


def _prompt(values: dict[str, Any]) -> Any:
    """Take the template text out of `values`, as the PromptTemplate Debiaser wants (or None)."""
    from lad.prompts import PromptTemplate

    text = values.pop("prompt_template", None)
    return None if text is None else PromptTemplate(text)


def _methods(text: str) -> tuple[str, ...]:
    return tuple(m.strip() for m in text.split(",") if m.strip())


def _sigma(text: str) -> float | str:
    if text == "auto":
        return text
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a number in [0, 1] or 'auto', got {text!r}"
        ) from None


def _baseline_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("baselines (docs/baselines.md)")
    g.add_argument(
        "--max-new-tokens", type=int, default=1024, help="reply length limit (instruction, cot, sc)"
    )
    g.add_argument("--sc-samples", type=int, default=10, help="self-consistency paths")
    g.add_argument("--sc-temperature", type=float, default=0.7, help="self-consistency sampling")
    g.add_argument("--sc-top-k", type=int, default=40, help="self-consistency top-k")
    g.add_argument(
        "--sofa-sigma",
        type=_sigma,
        default=0.5,
        help="SoFA weight σ of future image tokens, or 'auto' (grid on calibration items)",
    )
    g.add_argument(
        "--sofa-within-image",
        action="store_true",
        help="SoFA also opens later tokens of the same image (else across images only)",
    )


def register(subparsers: argparse._SubParsersAction) -> None:
    from lad.config import DEFAULT_METHODS

    p = subparsers.add_parser(
        "eval",
        help="calibrate, evaluate, score, report: one run directory",
        description="Run a model on a benchmark under T shuffles, calibrate on held-out items, "
        "score every method, and write records, metrics and a report into --out. Resumes an "
        "interrupted run. Methods: vanilla, pride, lad, attn, attn-purified, perm-avg, "
        "instruction, cot, self-consistency, sofa. "
        "Example: lad eval --num-candidates 8 --out runs/demo-n8",
        formatter_class=DefaultsOnce,
    )
    _model_flags(p)
    p.add_argument(
        "--data", type=items_or_shapes, default="shapes", help="items .jsonl file, or 'shapes'"
    )
    p.add_argument("--num-candidates", "-n", type=int, default=4, help="N images per query")
    p.add_argument(
        "--setting",
        default="random",
        choices=["random", "adversarial"],
        help="shapes benchmark setting (for --data shapes)",
    )
    p.add_argument(
        "--items",
        type=int,
        default=None,
        help="evaluation items (default: all; 100 for shapes)",
    )
    cal = p.add_mutually_exclusive_group()
    cal.add_argument(
        "--calibration-data", type=InputPath, default=None, help="items file for calibration"
    )
    cal.add_argument("--calibration", type=InputPath, default=None, help="a saved calibration.json")
    p.add_argument(
        "--calibration-items",
        type=int,
        default=None,
        help="|D_cal| (default: 5, or all a smaller calibration file holds); calibration.jsonl "
        "keeps them all, so lad ablate can draw subsets",
    )
    p.add_argument(
        "--calibrate-on",
        choices=["held-out", "evaluation"],
        default=None,
        help="calibration items held out from --data (paper; default) or the first "
        "--calibration-items evaluation items, scored too (official code; warns)",
    )
    p.add_argument(
        "--methods",
        type=_methods,
        default=DEFAULT_METHODS,
        help=f"comma-separated method names (default: {','.join(DEFAULT_METHODS)})",
    )
    shown = p.add_mutually_exclusive_group()
    shown.add_argument("--num-shuffles", type=int, default=5, help="T orderings per item")
    shown.add_argument(
        "--orders",
        type=InputPath,
        metavar="FILE",
        default=None,
        help="jsonl of {item, order}: evaluate exactly these orderings (a records.jsonl works)",
    )
    p.add_argument("--seed", type=int, default=0)
    add_lad_flags(p)
    add_calibration_check_flag(p)
    add_image_flags(p)
    _baseline_flags(p)
    p.add_argument("--out", type=OutputPath, default="runs/default", help="run directory")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress bars")
    p.set_defaults(func=_eval, implied=_run_files)

    p = subparsers.add_parser(
        "calibrate",
        help="fit a calibration.json from a few items (§4.2)",
        description="Run the symmetrised calibration set (every item under all N cyclic shifts) "
        "and fit the bias matrix and attention prior. The records are kept beside the output. "
        "Example: lad calibrate --model demo --data cal.jsonl --out calibration.json",
    )
    _model_flags(p)
    p.add_argument("--data", type=InputPath, required=True, help="items .jsonl file")
    p.add_argument("--items", type=int, default=5, help="how many items of --data to use")
    add_preset_flag(p)
    add_obs_mean_flag(p)
    add_image_flags(p)
    p.add_argument("--out", type=OutputPath, required=True, help="calibration.json to write")
    p.add_argument("--quiet", "-q", action="store_true")
    p.set_defaults(func=_calibrate, implied=_calibrate_files)

    p = subparsers.add_parser(
        "predict",
        help="debias one multi-image choice",
        description="Ask the model which image matches a query (or answers a question of your "
        "own), and debias the answer with a calibration fitted under the same prompt. Example: "
        "lad predict --calibration calibration.json --query 'a red circle' a.png b.png c.png "
        "d.png; lad predict --calibration mmiu-cal.json --labels image-ordinals --question "
        "'Which image is most likely to be a fake photograph?' a.jpg b.jpg c.jpg d.jpg",
    )
    _model_flags(p)
    p.add_argument(
        "--calibration",
        type=InputPath,
        required=True,
        help="calibration.json from lad calibrate/eval",
    )
    asked = p.add_mutually_exclusive_group(required=True)
    asked.add_argument("--query", help="the caption to match")
    asked.add_argument("--question", help="a question of your own that one of the images answers")
    p.add_argument(
        "images", type=InputPath, nargs="+", help="the candidate images, in the order shown"
    )
    add_lad_flags(p)
    add_calibration_check_flag(p)
    add_image_flags(p)
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=_predict)

    p = subparsers.add_parser(
        "report",
        help="HTML report with figures for run directories",
        description="Write an HTML page with PNG figures for one or more finished runs (runs "
        "that differ in N also get accuracy against N). Example: lad report runs/n4 runs/n8",
    )
    p.add_argument("runs", type=InputPath, nargs="+", help="run directories")
    p.add_argument(
        "--out", type=OutputPath, default=None, help="folder (default: RUN/report for one run)"
    )
    p.set_defaults(func=_report)


def _run_files(args: argparse.Namespace) -> tuple[dict[str, Any], dict[str, Any]]:
    """The files of a run directory lad eval writes (lad.stages.RUN_OUTPUTS)."""
    from lad.stages import RUN_OUTPUTS

    return {}, {f"--out {args.out}/{name}": Path(args.out) / name for name in RUN_OUTPUTS}


def _calibrate_files(args: argparse.Namespace) -> tuple[dict[str, Any], dict[str, Any]]:
    """lad calibrate writes its records beside --out X.json, as X.records.jsonl."""
    out = Path(args.out)
    return {}, {"its records file": out.with_name(out.stem + ".records.jsonl")}


def _eval(args: argparse.Namespace) -> int:
    from lad.config import EvalConfig
    from lad.evaluate import evaluate

    if (args.calibration_data or args.calibration) and args.calibrate_on is None:
        args.calibrate_on = "held-out"  # a stated calibration source wins over the preset's
    config = EvalConfig(
        model=args.model,
        data=args.data,
        num_candidates=args.num_candidates,
        setting=args.setting,
        items=args.items,
        calibration_data=args.calibration_data,
        calibration=args.calibration,
        calibration_items=_calibration_items(args),
        num_shuffles=args.num_shuffles,
        seed=args.seed,
        labels=args.labels,
        batch_size=args.batch_size,
        device=args.device,
        dtype=args.dtype,
        methods=args.methods,
        top_k=args.top_k,
        tau=args.tau,
        quiet=args.quiet,
        max_new_tokens=args.max_new_tokens,
        sc_samples=args.sc_samples,
        sc_temperature=args.sc_temperature,
        sc_top_k=args.sc_top_k,
        sofa_sigma=args.sofa_sigma,
        sofa_within_image=args.sofa_within_image,
        calibration_check=args.calibration_check,
        orders=args.orders,
        image_options=image_options(args),
        **_options(args, EVAL_PRESET),
        chat_template=args.chat_template,
    )
    if config.calibrate_on == "evaluation":
        print(
            f"Warning: calibrating on the first {config.calibration_items} evaluation items, "
            "which are scored too (the official code's choice); results on them are not held "
            "out (§4.2)",
            file=sys.stderr,
        )
    result = evaluate(config, args.out)
    if result is None:  # not the main process of a distributed run
        return 0
    print(result.table)
    timing = result.metrics.get("timing", {})
    print("\nwall time:     " + ", ".join(f"{stage} {s:.1f} s" for stage, s in timing.items()))
    print(f"run directory: {result.run_dir}")
    print(f"metrics:       {result.run_dir / 'metrics.json'}")
    if result.report:
        print(f"report:        {result.report}")
    return 0


def _calibration_items(args: argparse.Namespace) -> int:
    """--calibration-items, stated (a file holding fewer is then refused), or by default 5, or all
    the items a smaller calibration file holds, said so and recorded as such in run.json."""
    from lad.config import EvalConfig

    if args.calibration_items is not None:
        return args.calibration_items
    default = EvalConfig.calibration_items
    on_eval = resolved(args, ("calibrate_on",)).get("calibrate_on") == "evaluation"
    source = args.data if on_eval else args.calibration_data
    if source is None or not Path(source).is_file():  # 'shapes', or a file evaluate refuses
        return default
    from lad.data.items import read_items

    held = len(read_items(source))
    if held >= default:
        return default
    print(f"Note: {source} holds {held} calibration items: calibrating on {held}", file=sys.stderr)
    return held


def _calibrate(args: argparse.Namespace) -> int:
    from lad.api import Debiaser
    from lad.data.items import read_items

    if args.items < 1:
        raise LadError(f"--items must be >= 1. Got {args.items}.")
    out = check_output_file(args.out)
    records_out = out.with_name(out.stem + ".records.jsonl")
    items = read_items(args.data)[: args.items]
    values = _options(args, CALIBRATE_PRESET)
    prompt = _prompt(values)
    images = [p for it in items for p in it.images]
    check_not_inputs(
        {"--out": out, "its records file": records_out}, {"--data": args.data, "image": images}
    )
    debiaser = Debiaser(
        args.model,
        labels=args.labels,
        device=args.device,
        dtype=args.dtype,
        batch_size=args.batch_size,
        quiet=args.quiet,
        prompt_template=prompt,
        image_options=image_options(args),
        **values,
        chat_template=args.chat_template,
    )
    debiaser.fit(items, records_path=records_out)
    debiaser.save(out)
    cal = debiaser.calibration_
    print(
        f"calibration of {cal.num_items} items × {cal.num_candidates} shifts, γ = {cal.gamma:.3f}"
    )
    print(f"written: {out} (records: {records_out})")
    return 0


def _predict(args: argparse.Namespace) -> int:
    from lad.api import Debiaser

    values = _options(args, PREDICT_PRESET)
    prompt = _prompt(values)
    debiaser = Debiaser(
        args.model,
        labels=args.labels,
        device=args.device,
        dtype=args.dtype,
        top_k=args.top_k,
        tau=args.tau,
        prompt_template=prompt,
        check_calibration=args.calibration_check,
        image_options=image_options(args),
        **values,
        chat_template=args.chat_template,
    ).load(args.calibration)
    choice = debiaser.predict(args.query, args.images, question=args.question)
    if args.json:
        print(json.dumps(choice.to_dict(), indent=2))
        return 0
    print(choice.summary(args.images))
    return 0


def _report(args: argparse.Namespace) -> int:
    from lad.report import write_report

    runs = [Path(r) for r in args.runs]
    for r in runs:
        if not r.is_dir():
            raise LadError(f"{r}: no such run directory")
    out = Path(args.out) if args.out else (runs[0] / "report" if len(runs) == 1 else Path("report"))
    check_output_dir(out)
    print(f"report: {write_report(runs, out)}")
    return 0
