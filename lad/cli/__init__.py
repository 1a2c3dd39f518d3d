"""`lad` command line: parses arguments, calls one library function, prints. No logic lives here.

Each command group is a module with `register(subparsers)`; the library never imports this package.
"""

from __future__ import annotations

import argparse
import importlib
import signal
import sys

from lad.cli.flags import declared_files
from lad.core.fingerprint import CalibrationMismatch
from lad.errors import LadError, SettingError, os_error_message
from lad.io.files import guarding

COMMAND_MODULES = (
    "run",
    "score",
    "ablate",
    "data",
    "demo",
    "harness",
    "suite",
    "export",
    "serve",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="lad",
        description="Remove position bias from multimodal LLMs that choose among N images.\n"
        "Each command has --help with an example (lad eval --help).",
        epilog="example:\n  lad eval   # lad's demo model on the shapes benchmark, on CPU; "
        "writes runs/default",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(f"lad.cli.{name}").register(subparsers)
    return parser


def parse(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """Like parse_args, but an unknown flag is reported with the usage of the command it was
    given to (`lad eval --bogus` shows `lad eval`'s usage, not `lad`'s). A command that passes
    another tool's flags on (`set_defaults(passthrough=[])`) gets them in `args.passthrough`."""
    args, extra = parser.parse_known_args(argv)
    if getattr(args, "passthrough", None) is not None:  # a command taking another tool's flags
        args.passthrough = [*args.passthrough, *extra]
    elif extra:
        _command_parser(parser, args).error(f"unrecognized arguments: {' '.join(extra)}")
    return args


def _command_parser(
    parser: argparse.ArgumentParser, args: argparse.Namespace
) -> argparse.ArgumentParser:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            chosen = action.choices.get(getattr(args, action.dest, None))
            if chosen is not None:
                return _command_parser(chosen, args)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = None
    try:
        if getattr(signal.getsignal(signal.SIGINT), "lad_start_up", False):
            # lad.__main__ quieted Ctrl-C while lad started: KeyboardInterrupt from here on
            signal.signal(signal.SIGINT, signal.default_int_handler)
        parser = build_parser()
        args = parse(parser, argv)
        inputs, outputs = declared_files(_command_parser(parser, args), args)
        if outputs:
            from lad.run.rundir import check_not_run_files

            check_not_run_files(outputs)  # a finished run's own files are its lad eval's
        with guarding(inputs, outputs):
            return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print("Interrupted; what was written so far is kept.", file=sys.stderr)
        return 130
    except (LadError, OSError) as e:
        if isinstance(e, CalibrationMismatch):  # skipped on purpose by this flag
            e.skip = "--no-calibration-check"
        message = str(e) if isinstance(e, LadError) else os_error_message(e)
        if isinstance(e, SettingError) and hasattr(args, e.name):  # the command's flag for it
            message = "--" + e.name.replace("_", "-") + message[len(e.name) :]
        print(f"Error: {_one_line(message)}", file=sys.stderr)
    return 1


def _one_line(message: str) -> str:
    """An error as one line: a library's message quoted in it (pyarrow's, a template's) may hold
    line breaks."""
    return " ".join(message.splitlines()) if "\n" in message or "\r" in message else message


if __name__ == "__main__":
    sys.exit(main())
