"""Flags shared by several commands, declared once: a setting's flag is built from its field
(lad.core.methods.flag, in RecordSpec, EvalConfig and MethodOptions) by `add_settings`.

Options a preset can set (lad.run.presets) default to None here, so `resolved` can tell a stated
flag from an unstated one: a stated flag wins, then the preset, then lad's default (the paper's).
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import json
import math
import re
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

from lad.backends.checkpoint import check_repetition_penalty
from lad.core.methods import CHOICES, LAYER_STRATEGIES, MethodOptions
from lad.errors import LadError
from lad.io.files import InputPath, OutputPath
from lad.run.config import EvalConfig, check_methods
from lad.run.presets import PRESETS, with_preset
from lad.run.spec import RecordSpec

# ---------------------------------------------------------------- the files a command touches
# A flag naming a file or folder the command reads has `type=InputPath`, one it writes
# `type=OutputPath`; lad.cli.main collects them (with the command's `implied` files) and runs the
# command under lad.io.files.guarding, which refuses an output that is an input. A new command
# inherits the rule by typing its flags so (tests/test_guarantees.py checks that every file flag
# of every command is typed).


def items_or_shapes(text: str) -> str:
    """--data: an items file, or the keyword 'shapes' (generated data, no file)."""
    return text if text == "shapes" else InputPath(text)


def model_path(text: str) -> str:
    """--model: a local folder is an input; a hub id or 'demo' names no file here."""
    return InputPath(text) if Path(text).exists() else text


FILE_TYPES = (InputPath, OutputPath, items_or_shapes, model_path)


def declared_files(
    parser: argparse.ArgumentParser, args: argparse.Namespace
) -> tuple[dict[str, list[Path]], dict[str, Path]]:
    """(inputs, outputs) of the command `args` runs: its typed flags' values, by flag name, and
    the files it writes without a flag (set_defaults(implied=f), f(args) -> outputs)."""
    inputs: dict[str, list[Path]] = {}
    outputs: dict[str, Path] = {}
    for action in parser._actions:
        value = getattr(args, action.dest, None)
        name = (
            max(action.option_strings, key=len)
            if action.option_strings
            else f"the {action.metavar or action.dest} argument"
        )
        for v in value if isinstance(value, list) else [value]:
            if isinstance(v, InputPath):
                inputs.setdefault(name, []).append(Path(v))
            elif isinstance(v, OutputPath):
                outputs[name] = Path(v)
    implied = getattr(args, "implied", None)
    if implied is not None:
        outputs.update({k: Path(v) for k, v in implied(args).items() if v is not None})
    return inputs, outputs


def read_as(read: Callable[[str], Any], text: str, expected: str) -> Any:
    """read(text); where it raises ValueError (or a usage error), the usage error "expected
    EXPECTED, got 'TEXT'" (argparse says which argument)."""
    try:
        return read(text)
    except (ValueError, argparse.ArgumentTypeError):
        raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}") from None


def add_whole(p: Any, *names: str, minimum: int, help: str, default: int | None = None) -> None:
    """A flag taking a whole number >= minimum (`whole`), named in its errors by its first name."""
    p.add_argument(*names, type=whole(minimum, names[0]), default=default, help=help)


def whole(minimum: int, flag: str) -> Callable[[str], int]:
    """An argparse type: a whole number >= minimum. Text that is no number is a usage error
    ("argument --items: ..."); a number out of range is an `Error: --items must be >= 1` line,
    as the library's own checks read, so every refusal names its flag."""

    def parse(text: str) -> int:
        value = read_as(int, text, "a whole number")
        if value < minimum:
            raise LadError(f"{flag} must be >= {minimum}. Got {value}.")
        return value

    return parse


def number(flag: str, low: float, *, closed: bool = True) -> Callable[[str], float]:
    """An argparse type: a number >= low (> low unless `closed`), 'inf' included; NaN refused."""
    where = f"{'>=' if closed else '>'} {low:g}"

    def parse(text: str) -> float:
        value = read_as(float, text, "a number")
        inside = low <= value if closed else low < value  # NaN: False
        if not inside:
            raise LadError(f"{flag} must be a number {where}. Got {text}.")
        return value

    return parse


def add_quiet_flag(
    p: argparse.ArgumentParser,
    help_text: str = "no progress bars (lad's and transformers' loading bars)",
) -> None:
    """--quiet/-q, which every command that prints more than its result takes."""
    p.add_argument("--quiet", "-q", action="store_true", help=help_text)


def add_preset_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--preset",
        choices=list(PRESETS),
        default="paper",
        help="paper: the paper's equations (default); official: the paper's released code, item "
        "for item (docs/methods.md lists what it sets; stated flags still win)",
    )


class HelpFormat(argparse.RawDescriptionHelpFormatter):
    """Every command's help: its description as written (see `command`), and "(default: X)" after
    a flag's help unless the help already speaks of its default or the flag has none (None, an
    empty list, an on/off switch): each default is stated once."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        none = action.default is None or action.default == [] or action.nargs == 0  # a switch
        if "default" in text or none or action.default is argparse.SUPPRESS:
            return text
        return text + " (default: %(default)s)"


def command(
    subparsers: argparse._SubParsersAction,
    name: str,
    short: str | Callable[[argparse.Namespace], int],
    description: str = "",
    *examples: str,
) -> argparse.ArgumentParser:
    """A subcommand whose --help ends in its examples (one command line each).

    `short` may be the command's function instead: its docstring's first line is the one-line
    help, the paragraphs after it the description, and the lines under "Example:" the examples;
    the function is what the command runs. Without a description, the one-line help is it.
    """
    func = None
    if callable(short):
        func, (short, description, examples) = short, _help_of(short)
    parts = [" ".join(part.split()) for part in (description or short).split("\n\n")]
    text = "\n\n".join(textwrap.fill(part, 79) for part in parts if part)
    p = subparsers.add_parser(
        name,
        help=short,
        description=text,
        epilog="example:\n" + "\n".join(f"  {e}" for e in examples),
        formatter_class=HelpFormat,
    )
    if func is not None:
        p.set_defaults(func=func)
    return p


def _help_of(func: Callable[..., Any]) -> tuple[str, str, tuple[str, ...]]:
    """(one-line help, description, examples) of a command function's docstring; an example line
    ending in a backslash goes on in the next."""
    doc = inspect.getdoc(func) or ""
    head, _, example = doc.partition("\n\nExample:\n")
    short, _, description = head.partition("\n\n")
    examples = re.sub(r"\\\s*\n", "", example).splitlines()
    return short, description, tuple(" ".join(e.split()) for e in examples if e.strip())


def method_list(text: str) -> tuple[str, ...]:
    """--methods a,b (also repeated): names of lad.core.methods.METHODS, checked while parsing."""
    return check_methods(tuple(m.strip() for m in text.split(",") if m.strip()))


def methods_given(
    values: list[tuple[str, ...]] | None, default: tuple[str, ...] = ()
) -> tuple[str, ...]:
    """The methods of all --methods/--method flags given, in order, each once (else `default`)."""
    return tuple(dict.fromkeys(m for group in values for m in group)) if values else default


def add_methods_flag(p: argparse.ArgumentParser, default: tuple[str, ...] | None) -> None:
    """--methods a,b on every command that scores methods; `--method X`, repeatable, is the same
    flag's older spelling. None: the flag is required."""
    p.add_argument(
        "--methods",
        "--method",
        dest="methods",
        type=method_list,
        action="append",
        required=default is None,
        metavar="M1,M2",
        help="comma-separated method names; the flag may be repeated"
        + ("" if default is None else f" (default: {','.join(default)})"),
    )


def options_from(cls: Any, args: argparse.Namespace, **more: Any) -> Any:
    """The options dataclass `cls` of the flags its fields name that were given (a flag left at
    None keeps the field's default), then `more`."""
    names = {f.name for f in dataclasses.fields(cls)} - set(more)
    given = {n: getattr(args, n) for n in names if getattr(args, n, None) is not None}
    return cls(**given, **more)


# Every setting declared with its flag (lad.core.methods.flag), by name.
DECLARED = {
    f.name: f
    for cls in (RecordSpec, EvalConfig, MethodOptions)
    for f in dataclasses.fields(cls)
    if "help" in f.metadata
}
PRESET_SET = {name for preset in PRESETS.values() for name in preset}


def add_settings(p: Any, *names: str, of: Any = None, **override: Any) -> None:
    """The flags of declared settings (DECLARED's, or the fields of the dataclass `of`), in order:
    each field's metadata as add_argument's options, its `minimum` (or `above`) as a bounded
    number's type, its text read by PARSERS where the setting has one; `override`: this command's
    own options."""
    fields = DECLARED if of is None else {f.name: f for f in dataclasses.fields(of)}
    for name in names:
        declared = fields[name]
        options = {k: v for k, v in declared.metadata.items() if k not in ("scoring", "limit")}
        flags = options.pop("flags", ("--" + name.replace("_", "-"),))
        default = None if name in PRESET_SET else declared.default
        options["default"] = options.pop("flag_default", default)
        low = options.pop("minimum", None)
        if isinstance(low, int):
            options["type"] = whole(low, flags[0])
        elif low is not None:
            options["type"] = number(flags[0], low)
        if "above" in options:
            options["type"] = number(flags[0], options.pop("above"), closed=False)
        if name in PARSERS:
            options["type"] = PARSERS[name]
        if name in CHOICES:  # MethodOptions' allowed values
            options["choices"] = CHOICES[name]
        p.add_argument(*flags, dest=name, **{**options, **override})


def add_records_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--records", type=InputPath, required=True, help="evaluation records (.jsonl or .parquet)"
    )


def add_lad_flags(p: argparse.ArgumentParser) -> None:
    """LAD's inference options (§4.3), their official-code variants (with --obs-mean, how a
    calibration is fitted, Eq. 1) and --preset; defaults are the paper's."""
    add_preset_flag(p)
    names = ("top_k", "tau", "layer_range", "mixture", "attn_mean", "blank_alpha", "obs_mean")
    add_settings(p, *names)


def _blank_alpha(text: str) -> float | str:
    if text.strip() == "entropy":
        return "entropy"
    value = number("--blank-alpha", 0.0)(text)
    if value == math.inf:  # α scales log P(·|blank) (CapCal): inf has no meaning there
        raise LadError(f"--blank-alpha must be a finite number >= 0 or entropy. Got {text}.")
    return value


def add_image_flags(p: argparse.ArgumentParser) -> None:
    """How pictures are prepared for the processor; they define the records (run.json)."""
    g = p.add_argument_group("image resolution (define the records)")
    add_settings(g, "image_size")
    for flag, end in (("--max-pixels", "upper"), ("--min-pixels", "lower")):
        add_whole(
            g, flag, minimum=1, help=f"pixel budget's {end} end (Qwen2-VL, Qwen2.5-VL processors)"
        )
    g.add_argument(
        "--image-option",
        action="append",
        type=_image_option,
        default=[],
        metavar="KEY=VALUE",
        help="any other processor option, VALUE as JSON if it parses (e.g. max_patches=6 for "
        "InternVL); repeat for several",
    )


def number_or(word: str, expected: str, check: Callable[[float, str], None]) -> Any:
    """An argparse type: the keyword `word`, or a number (as `expected` says) that `check`
    accepts (given the number and the text it was read from)."""

    def parse(text: str) -> float | str:
        if text == word:
            return text
        value = read_as(float, text, f"{expected} or {word!r}")
        check(value, text)
        return value

    return parse


def _check_sigma(value: float, text: str) -> None:
    if not 0 <= value <= 1:
        raise LadError(f"--sofa-sigma must be a number in [0, 1] or 'auto'. Got {text}.")


def _layers(text: str) -> str | tuple[int, ...]:
    if text in LAYER_STRATEGIES:
        return text
    indices = "'top-k', 'all' or comma-separated 0-based layer indices"
    return read_as(lambda t: tuple(int(x) for x in t.split(",")), text, indices)


def image_options(args: argparse.Namespace) -> dict[str, Any]:
    """The processor options the image flags ask for (lad.backends.archs.Arch.processor_options)."""
    budget = {k: getattr(args, k) for k in ("min_pixels", "max_pixels")}
    return {**dict(args.image_option), **{k: v for k, v in budget.items() if v is not None}}


def resolved(args: argparse.Namespace) -> dict[str, Any]:
    """LAD's official-code variants (Eq. 1's average, the mixture, the attention mean, the layer
    range) that were stated or that args.preset sets (stated wins): lad score's and ablate's."""
    names = ("obs_mean", "mixture", "attn_mean", "layer_range")
    return with_preset(args.preset, {n: getattr(args, n, None) for n in names}, names)


def _layer_range(text: str) -> tuple[int, int]:
    try:
        first, last = (int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected FIRST,LAST (0-based), got {text!r}") from None
    if not 0 <= first <= last:
        raise LadError(f"--layer-range must be FIRST,LAST with 0 <= FIRST <= LAST. Got {text}.")
    return first, last


def _image_option(text: str) -> tuple[str, Any]:
    key, sep, value = text.partition("=")
    if not sep or not key.isidentifier():
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    try:
        return key, json.loads(value)
    except json.JSONDecodeError:
        return key, value
    except RecursionError:
        raise argparse.ArgumentTypeError(f"{key}: a value nested too deeply to read") from None


def check_layer_range_flag(
    layer_range: tuple[int, int] | None, num_layers: int | None, args: argparse.Namespace
) -> None:
    """Before model work: a --layer-range, stated or set by --preset, must start at one of the
    model's layers (its end is cut to the last one, as the official code's hooks are). An
    unknown layer count (a hub id not on disk) is checked once the model is loaded."""
    if layer_range is None or num_layers is None or layer_range[0] < num_layers:
        return
    first, last = layer_range
    given = "--layer-range" if args.layer_range is not None else f"--preset {args.preset}"
    raise LadError(
        f"{given}: Eq. 9 would search attention layers {first}..{last}, but {args.model} has "
        f"{num_layers} (0..{num_layers - 1}); pass --layer-range FIRST,LAST within them, e.g. "
        f"--layer-range 0,{num_layers - 1}"
    )


# How the settings' text is read where a bound or a choice does not say it (add_settings).
PARSERS = {
    "model": model_path,
    "clip": model_path,  # lad data coco|flickr8k's CLIP model
    "data": items_or_shapes,
    "layer_range": _layer_range,
    "layers": _layers,
    "blank_alpha": _blank_alpha,
    "repetition_penalty": number_or(
        "model", "a number > 0", lambda value, _: check_repetition_penalty(value)
    ),
    "sofa_sigma": number_or("auto", "a number in [0, 1]", _check_sigma),
}
