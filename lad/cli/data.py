"""`lad data shapes|coco|flickr8k|import|mmiu|muirbench|blink|mmlu|judgments|text|text-demo`:
build benchmark items files; the text ones (mmlu, judgments, text) from the files people have,
`text-demo` the shipped text demo's held-out items."""

from __future__ import annotations

import argparse
from pathlib import Path

from lad.cli.flags import (
    InputPath,
    OutputPath,
    add_quiet_flag,
    add_settings,
    add_whole,
    command,
    options_from,
    read_as,
    whole,
)
from lad.data.builders import BuildOptions
from lad.data.questions import Benchmark
from lad.data.shapes import SPLITS
from lad.errors import DataError
from lad.io.files import check_output_dir, check_output_file


def register(subparsers: argparse._SubParsersAction) -> None:
    from lad.data.benchmarks import BENCHMARKS

    names = ("shapes", "coco", "flickr8k", "import", *BENCHMARKS, *_TEXT, "text-demo")
    short = "build benchmark items: " + ", ".join(names)
    about = "Build benchmark items files (the items format: docs/formats.md)."
    example = "lad data shapes --num-candidates 4 --items 100 --out data/shapes"
    parser = command(subparsers, "data", short, about, example)
    commands = parser.add_subparsers(dest="data_command", required=True, metavar="DATASET")
    _register_shapes(commands)
    for name, (help_text, example) in _REAL.items():
        _register_real(commands, name, help_text, example)
    _register_import(commands)
    for benchmark in BENCHMARKS.values():
        _register_released(commands, benchmark)
    _register_text(commands)


def _register_shapes(commands: argparse._SubParsersAction) -> None:
    p = command(commands, "shapes", _run_shapes)
    add_settings(p, "num_candidates", "setting", of=BuildOptions)
    add_settings(p, "items", of=BuildOptions, default=100)
    add_settings(p, "seed", of=BuildOptions)
    p.add_argument(
        "--split",
        choices=SPLITS,
        default="eval",
        help="which of the benchmark's disjoint item sets to draw",
    )
    p.add_argument(
        "--picture-side",
        type=whole(1, "--picture-side"),
        default=64,
        metavar="PIXELS",
        help="side of each drawn square picture (not lad eval's --image-size, which resizes "
        "pictures for the model)",
    )
    # The flag's old name, kept working but not shown: it read like lad eval's resize.
    p.add_argument(
        "--image-size", type=whole(1, "--image-size"), dest="picture_side", help=argparse.SUPPRESS
    )
    add_whole(p, "--max-shapes", minimum=1, default=2, help="objects per image, 1 to 4")
    p.add_argument(
        "--position-weights",
        type=_floats,
        default=None,
        help="comma-separated share of answers at each position (default: uniform)",
    )
    p.add_argument(
        "--out", type=OutputPath, required=True, help="output folder (items.jsonl and images/)"
    )
    options = [a.dest for a in p._actions if a.dest not in ("help", "picture_side", "out")]
    p.set_defaults(options=options)  # build_shapes' keywords


def _floats(text: str) -> list[float]:
    return read_as(lambda t: [float(x) for x in t.split(",")], text, "numbers separated by commas")


def _run_shapes(args: argparse.Namespace) -> int:
    """Draw the shapes benchmark: coloured shapes, each query describing exactly one image.

    Example:
        lad data shapes --num-candidates 4 --setting adversarial --items 200 --split eval \\
            --seed 0 --out data/shapes-eval
    """
    from lad.data.shapes import build_shapes

    check_output_dir(args.out)
    given = {name: getattr(args, name) for name in args.options}
    path = build_shapes(args.out, image_size=args.picture_side, **given)
    print(f"Wrote {args.items} items to {path}")
    return 0


_REAL = {  # lad data coco|flickr8k: (help, example)
    "coco": (
        "Build an MS-COCO benchmark from its own annotation files.",
        "lad data coco --images val2014 --captions captions_val2014.json --instances "
        "instances_val2014.json --setting adversarial --num-candidates 4 --items 1000 "
        "--out coco-adv-4.jsonl",
    ),
    "flickr8k": (
        "Build a Flickr8k benchmark from its caption token file.",
        "lad data flickr8k --images Flicker8k_Dataset --captions Flickr8k.token.txt "
        "--setting random --num-candidates 4 --items 1000 --out flickr-random-4.jsonl",
    ),
}


def _register_real(
    commands: argparse._SubParsersAction, name: str, help_text: str, example: str
) -> None:
    p = command(commands, name, help_text, "", example)
    p.add_argument(
        "--images", type=InputPath, required=True, help="folder holding the dataset's images"
    )
    p.add_argument(
        "--captions", type=InputPath, required=True, help="the dataset's caption annotation file"
    )
    if name == "coco":
        p.add_argument(
            "--instances",
            type=InputPath,
            help="instances_*.json (categories; required for adversarial)",
        )
    names = ("num_candidates", "setting", "items", "seed", "calibration_items", "clip")
    add_settings(p, *names, "device", "batch_size", of=BuildOptions)
    p.add_argument(
        "--skip-missing", action="store_true", help="leave out listed images absent on disk"
    )
    p.add_argument("--out", type=OutputPath, required=True, help="output items file (.jsonl)")
    p.set_defaults(func=_run_real, dataset=name, implied=_calibration_split)


def _run_real(args: argparse.Namespace) -> int:
    from lad.data.builders import build_from_files

    _items_out(args.out)  # an output that is an input: refused by lad.cli.main
    options = options_from(BuildOptions, args)
    result = build_from_files(args.dataset, vars(args), args.out, options, args.skip_missing)
    print(f"Wrote {args.items} items to {result.items_path}")
    if result.calibration_path is not None:
        print(f"Wrote {args.calibration_items} calibration items to {result.calibration_path}")
    if result.cache is not None:
        hits, misses = result.cache.hits, result.cache.misses
        print(
            f"CLIP embeddings: {hits['images']} images and {hits['texts']} captions from the "
            f"cache, {misses['images']} and {misses['texts']} computed"
        )
    if result.skipped_anchors:
        print(f"{result.skipped_anchors} anchors skipped: too few images passed the filters")
    return 0


def _calibration_split(args: argparse.Namespace) -> dict:
    """The calibration items written beside --out X.jsonl, as X.calibration.jsonl (none with
    --calibration-items 0)."""
    from lad.data.builders import calibration_path_for

    if getattr(args, "calibration_items", None) == 0:
        return {}
    return {"its calibration file": calibration_path_for(Path(args.out))}


def _released_outputs(args: argparse.Namespace) -> dict:
    """What a released-benchmark or text converter writes beside --out X.jsonl:
    X.calibration.jsonl, X.summary.json and, where pictures are extracted, X-pictures/ unless
    --pictures says."""
    outputs = _calibration_split(args)
    out = Path(args.out)
    from lad.data.released import pictures_folder, summary_path_for

    outputs["its summary"] = summary_path_for(out)
    if "pictures" in vars(args) and args.pictures is None:
        outputs["its pictures folder"] = pictures_folder(out, None)
    return outputs


def _items_out(text: str) -> Path:
    if not text.endswith(".jsonl"):
        raise DataError(f"--out must be a .jsonl file. Got {text!r}.")
    return check_output_file(text)


def _register_import(commands: argparse._SubParsersAction) -> None:
    p = command(commands, "import", _run_import)
    p.add_argument("file", type=InputPath, help="the official annotations JSON file")
    p.add_argument(
        "--images", type=InputPath, required=True, help="folder holding the images it names"
    )
    p.add_argument("--out", type=OutputPath, required=True, help="output items file (.jsonl)")


def _run_import(args: argparse.Namespace) -> int:
    """Convert the paper's official evaluation file (annotations_{N}_1_{mode}.json).

    Example:
        lad data import annotations_4_1_adversarial.json --images val2014 --out coco-adv-4.jsonl
    """
    from lad.data.official import import_official

    _items_out(args.out)
    imported = import_official(args.file, args.images, args.out)
    print(f"Wrote {imported.items} items to {args.out}")
    if imported.derived_ids:
        stem = Path(args.file).stem
        print(
            f"The entries have no 'id': each item's id is the file's name and the entry's "
            f"position ({stem}-0 … {stem}-{imported.items - 1})"
        )
    return 0


def _register_released(commands: argparse._SubParsersAction, benchmark: Benchmark) -> None:
    """`lad data <benchmark>` for a released benchmark (lad.data.benchmarks)."""
    p = command(commands, benchmark.name, benchmark.description, "", benchmark.example)
    title = benchmark.title
    if benchmark.embedded:
        p.add_argument(
            "path", type=InputPath, help=f"a {title} .parquet file, or a folder searched for them"
        )
        p.add_argument("--task", help="convert only this task (default: every task)")
    else:
        p.add_argument("file", type=InputPath, help=f"{title} question file: {benchmark.files}")
        p.add_argument("--task", help="the task to convert (needed when the file holds several)")
        p.add_argument(
            "--images",
            type=InputPath,
            help=f"the folder {title}'s pictures were extracted in (default: beside the file)",
        )
    add_whole(
        p,
        "--num-candidates",
        "-n",
        minimum=2,
        help="keep only questions with N candidates (else all)",
    )
    if benchmark.embedded:
        p.add_argument(
            "--pictures",
            type=OutputPath,
            help="folder the pictures are written to (default: OUT's -pictures sibling)",
        )
    _held_out(p, "questions of each N held out to OUT's .calibration.jsonl sibling")
    if not benchmark.embedded:
        p.add_argument(
            "--skip-missing",
            action="store_true",
            help="leave out questions whose images are absent",
        )
    add_quiet_flag(p, "print only what was written, not the counts per task")
    p.add_argument("--out", type=OutputPath, required=True, help="output items file (.jsonl)")
    p.set_defaults(func=_run_released, benchmark=benchmark.name, implied=_released_outputs)


def _held_out(p: argparse.ArgumentParser, calibration: str) -> None:
    """A converter's --items, --calibration-items (default 5) and --seed of the held-out choice."""
    add_whole(p, "--items", minimum=1, help="evaluation items (default: all)")
    add_whole(p, "--calibration-items", minimum=0, default=5, help=calibration)
    p.add_argument("--seed", type=int, default=0, help="seed of the held-out choice")


def _run_released(args: argparse.Namespace) -> int:
    from lad.data.benchmarks import BENCHMARKS
    from lad.data.released import Options, convert, summary_lines

    benchmark = BENCHMARKS[args.benchmark]
    source = args.path if benchmark.embedded else args.file
    options = options_from(Options, args, whole=True)  # every task and N, a cell each (lad eval)
    task, written = convert(benchmark, source, _items_out(args.out), options)
    if benchmark.one_task and args.task:
        print(f"{benchmark.title} task {task}:")
    for line in summary_lines(written, per_task=not args.quiet):
        print(line)
    return 0


_TEXT = {
    "mmlu": (
        "Convert MMLU- or ARC-style multiple choice as lm-evaluation-harness's datasets store "
        "them (MMLU: question, subject, choices, answer; ARC: question, choices {text, label}, "
        "answerKey) into items of text candidates.",
        "lad data mmlu mmlu/all/test-00000-of-00001.parquet --task astronomy --out astro.jsonl",
    ),
    "judgments": (
        "Convert pairwise judgments (question, answer_a, answer_b, winner; or MT-Bench's "
        "conversation_a, conversation_b, winner) into items of two text candidates; ties and "
        "second turns are skipped and counted.",
        "lad data judgments mt_bench_human_judgments/human.parquet --out judge.jsonl",
    ),
    "text": (
        "Convert a generic file of text multiple-choice questions (one per row: a question, its "
        "options as a list of texts, its answer as an index, a letter or an option's text) into "
        "items of text candidates.",
        "lad data text questions.jsonl --options-field choices --out mcq.jsonl",
    ),
}


def _register_text(commands: argparse._SubParsersAction) -> None:
    """The text converters and `text-demo`."""
    for name, (description, example) in _TEXT.items():
        p = command(commands, name, description.split(" (")[0], description, example)
        p.add_argument(
            "path", type=InputPath, help="a JSON Lines, JSON or .parquet file (or folder)"
        )
        if name == "text":
            p.add_argument("--question-field", default="question", help="default: question")
            p.add_argument("--options-field", help="default: options, else choices")
            p.add_argument("--answer-field", default="answer", help="default: answer")
            p.add_argument("--task-field", help="the field that names a row's task (default: none)")
        p.add_argument("--task", help="convert only this task (default: every task)")
        if name != "judgments":
            help = "keep only questions with N options"
            add_whole(p, "--num-candidates", "-n", minimum=2, help=help)
        _held_out(p, "questions held out to OUT's .calibration.jsonl sibling (default 5)")
        p.add_argument("--out", type=OutputPath, required=True, help="output items file (.jsonl)")
        options = [a.dest for a in p._actions if a.dest not in ("help", "path", "out")]
        p.set_defaults(func=_run_text, converter=name, options=options, implied=_released_outputs)
    p = command(
        commands,
        "text-demo",
        "Write the held-out items of the shipped text demo model",
        "Write the held-out items of the text demo model shipped with lad (--model text-demo: "
        "100 questions 'Which option is a fruit?' of 4 word options, drawn when it was trained) "
        "to OUT, and its 5 calibration items to OUT's .calibration.jsonl sibling "
        "(docs/demo-model.md, 'The text demo').",
        "lad data text-demo --out data/text-demo.jsonl",
    )
    p.add_argument("--out", type=OutputPath, required=True, help="output items file (.jsonl)")
    p.set_defaults(func=_run_text_demo, implied=_calibration_split)


def _run_text_demo(args: argparse.Namespace) -> int:
    from lad.demo.text import write_text_demo_items

    _items_out(str(args.out))
    for path, count in write_text_demo_items(args.out).items():
        print(f"written: {path} ({count} items)")
    return 0


def _run_text(args: argparse.Namespace) -> int:
    from lad.data import judgments, mmlu, textjsonl
    from lad.data.released import summary_lines

    _items_out(str(args.out))
    convert = {
        "judgments": judgments.import_judgments,
        "mmlu": mmlu.import_mmlu,
        "text": textjsonl.import_text,
    }[args.converter]
    options = {name: getattr(args, name) for name in args.options}  # the converter's own flags
    for line in summary_lines(convert(args.path, args.out, **options)):
        print(line)
    return 0
