"""`lad` command line: parses arguments, calls one library function, prints. No logic lives here.

Each command group is a module with `register(subparsers)`; the library never imports this package.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from lad.errors import LadError

COMMAND_MODULES = ("run", "score", "ablate", "data", "demo")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="lad",
        description="Remove position bias from multimodal LLMs that choose among N images.",
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(f"lad.cli.{name}").register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except LadError as e:
        print(f"Error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("Interrupted; what was written so far is kept.", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
