"""`lad suite run|list`: the paper's tables (or a suite file of your own) from one command, thin
over lad.evaluate.run_suite and lad.suites."""

from __future__ import annotations

import argparse

from lad.cli.flags import InputPath, OutputPath, add_settings, command, model_path


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "suite", help="run a suite of cells (the paper's tables) and print one table"
    )
    commands = p.add_subparsers(dest="suite_command", required=True, metavar="COMMAND")
    run = command(commands, "run", _run)
    run.add_argument("suite", type=InputPath, help="a built-in suite's name, or a suite .toml")
    run.add_argument(
        "--data-root",
        type=InputPath,
        action="append",
        default=[],
        metavar="[NAME=]DIR",
        help="where the benchmarks live: DIR (one benchmark's folder, or the folder of each "
        "benchmark's own), or NAME=DIR for one benchmark; repeatable",
    )
    run.add_argument(
        "--model",
        type=model_path,
        help="run this model alone (default: the suite's models); a suite model's name works",
    )
    add_settings(run, "trust_remote_code")
    run.add_argument(
        "--compare", metavar="NAME", help="the paper's model the difference line is against"
    )
    run.add_argument("--out", type=OutputPath, required=True, help="folder of the suite's runs")
    command(commands, "list", _list)


def _run(args: argparse.Namespace) -> int:
    """run every cell of a suite, resumably, and print its table

    Run every (task, N, setting) cell of a suite for its models (or --model alone): each cell's
    data converted once from your download into OUT/data/, one lad eval run directory per model
    and cell in OUT/<model>/<cell>/ (a finished one is only rescored), then one table with the
    paper's published numbers beside lad's and the difference. Built-in suites: table1, table5,
    blink, muirbench (lad suite list).

    Example:
        lad suite run table5 --model llava-hf/llava-onevision-qwen2-7b-ov-hf --data-root MMIU \\
            --out runs/table5
        lad suite run table1 --data-root coco=COCO --data-root flickr8k=Flickr8k --out runs/t1
    """
    from lad.evaluate import run_suite
    from lad.io.files import check_output_dir
    from lad.suites import load_suite

    suite = load_suite(args.suite)
    check_output_dir(args.out)
    result = run_suite(
        suite,
        args.out,
        data_roots=args.data_root,
        model=args.model,
        compare=args.compare,
        trust_remote_code=bool(args.trust_remote_code),
    )
    print(result.table)
    print(f"\nrun directories: {args.out}/<model>/<cell>/")
    return 0


def _list(args: argparse.Namespace) -> int:
    """list the built-in suites

    The built-in suites and what they run.

    Example:
        lad suite list
    """
    from lad.suites import built_in_names, load_suite

    for name in built_in_names():
        suite = load_suite(name)
        print(f"{name:<12}{suite.title} ({len(suite.cells)} cells)")
    return 0
