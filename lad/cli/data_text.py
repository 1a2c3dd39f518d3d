"""`lad data mmlu|judgments|text`: items of text candidates from the files people have;
`lad data text-demo`: the shipped text demo's held-out items."""

from __future__ import annotations

import argparse
from pathlib import Path

from lad.cli.flags import InputPath, OutputPath, command
from lad.errors import DataError

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


TEXT_COMMANDS = (*_TEXT, "text-demo")


def register_text(commands: argparse._SubParsersAction) -> None:
    """Add the text converters and `text-demo` to `lad data` (lad.cli.data)."""
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
            p.add_argument(
                "--num-candidates", "-n", type=int, help="keep only questions with N options"
            )
        p.add_argument("--items", type=int, default=None, help="evaluation items (default: all)")
        p.add_argument(
            "--calibration-items",
            type=int,
            default=5,
            help="questions held out to OUT's .calibration.jsonl sibling (default 5)",
        )
        p.add_argument("--seed", type=int, default=0, help="seed of the held-out choice")
        p.add_argument("--out", type=OutputPath, required=True, help="output items file (.jsonl)")
        p.set_defaults(func=_run_text, converter=name, implied=_outputs)
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
    p.set_defaults(func=_run_text_demo, implied=_demo_outputs)


def _outputs(args: argparse.Namespace) -> tuple[dict, dict]:
    from lad.data.builders import calibration_path_for

    out = Path(args.out)
    summary = out.with_name(out.stem + ".summary.json")
    return {}, {"its calibration file": calibration_path_for(out), "its summary": summary}


def _demo_outputs(args: argparse.Namespace) -> tuple[dict, dict]:
    from lad.data.builders import calibration_path_for

    return {}, {"its calibration file": calibration_path_for(Path(args.out))}


def _run_text_demo(args: argparse.Namespace) -> int:
    from lad.demo.text import write_text_demo_items

    if not str(args.out).endswith(".jsonl"):
        raise DataError(f"--out must be a .jsonl file. Got {str(args.out)!r}.")
    for path, count in write_text_demo_items(args.out).items():
        print(f"written: {path} ({count} items)")
    return 0


def _run_text(args: argparse.Namespace) -> int:
    from lad.data.judgments import import_judgments
    from lad.data.mmlu import import_mmlu
    from lad.data.released import summary_lines
    from lad.data.textjsonl import import_text

    if not str(args.out).endswith(".jsonl"):
        raise DataError(f"--out must be a .jsonl file. Got {str(args.out)!r}.")
    split = {
        "task": args.task,
        "items": args.items,
        "calibration_items": args.calibration_items,
        "seed": args.seed,
    }
    if args.converter == "judgments":
        written = import_judgments(args.path, args.out, **split)
    elif args.converter == "mmlu":
        written = import_mmlu(args.path, args.out, num_candidates=args.num_candidates, **split)
    else:
        fields = ("question_field", "options_field", "answer_field", "task_field")
        named = {name: getattr(args, name) for name in fields}
        written = import_text(
            args.path, args.out, num_candidates=args.num_candidates, **named, **split
        )
    for line in summary_lines(written):
        print(line)
    return 0
