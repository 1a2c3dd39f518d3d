"""The guarantees of docs/errors.md that hold for every command (issue 23): no output over an
input, one line and never a traceback, bounded resources, and messages that say the truth.

The first tests enumerate every subcommand from lad's own argparse parsers, so a command added
later is covered without a new test.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from lad.cli import _command_parser, build_parser, main
from lad.cli.flags import FILE_TYPES, InputPath, OutputPath, declared_files
from lad.core.records import write_records
from tests.synthetic import SyntheticModel


@pytest.fixture(autouse=True)
def no_model(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a refused input must be caught before the model loads")

    monkeypatch.setattr("lad.backends.load_backend", refuse)


def one_error(capsys, argv: list, pattern: str) -> str:
    """`lad ARGV` exits 1 with exactly one `Error: ...` line matching `pattern`."""
    import re

    capsys.readouterr()
    assert main([str(a) for a in argv]) == 1
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), err
    assert re.search(pattern, lines[0]), lines[0]
    assert "Traceback" not in err
    return lines[0]


# ---------------------------------------------------------------- every command's files


def _commands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    """(command words, its parser) for every leaf command: eval, data coco, demo train, ..."""
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        yield path, parser
        return
    for name, sub in subs[0].choices.items():
        yield from _commands(sub, (*path, name))


COMMANDS = dict(_commands(build_parser()))

# Flags whose help speaks of files but that take none (a count, a method name).
NOT_FILES = {
    "calibration_items", "items", "json", "labels", "method", "num_candidates", "task",
    "sc_samples", "question", "text_options",
}  # fmt: skip
FILE_WORDS = ("file", "folder", "director", ".json", "path", "checkpoint", "png", "images")


def test_every_command_is_enumerated():
    assert {" ".join(c) for c in COMMANDS} >= {
        "eval", "calibrate", "predict", "report", "score", "metrics", "ablate", "data shapes",
        "data coco", "data flickr8k", "data import", "data mmiu", "demo train",
    }  # fmt: skip


@pytest.mark.parametrize("command", sorted(COMMANDS), ids=" ".join)
def test_every_file_flag_declares_itself(command):
    """A flag that names a file or folder is typed as an input or an output, so lad.cli runs the
    command under lad.io.files.guarding (a new flag left untyped fails here)."""
    untyped = []
    for action in COMMANDS[command]._actions:
        text = f"{action.help or ''} {action.metavar or ''}".lower()
        looks = any(w in text for w in FILE_WORDS) or action.dest in ("out", "data", "model")
        flag = action.nargs != 0 and action.dest != "help" and action.dest not in NOT_FILES
        if looks and flag and action.type not in FILE_TYPES:
            untyped.append(action.dest)
    assert not untyped, f"lad {' '.join(command)}: untyped file flags {untyped}"


def _file_actions(parser: argparse.ArgumentParser, kind: type) -> list[argparse.Action]:
    types = {InputPath: (InputPath, *FILE_TYPES[2:]), OutputPath: (OutputPath,)}[kind]
    return [a for a in parser._actions if a.type in types]


HARMLESS = {"methods": "vanilla"}  # values of required flags that are neither files nor numbers


def _argv(command, parser, values: dict[str, str], tmp: Path) -> list[str]:
    """A command line for `command` giving `values` (dest → value) and a harmless value to
    every other required flag or positional."""
    argv, given = list(command), dict(values)
    for group in parser._mutually_exclusive_groups:
        if group.required and not any(a.dest in given for a in group._group_actions):
            first = group._group_actions[0]
            given[first.dest] = first.choices[0] if first.choices else "q"
    for action in parser._actions:
        if action.dest in given or not (action.required or not action.option_strings):
            continue
        if action.nargs == 0 or action.dest == "help":
            continue
        if action.choices:
            given[action.dest] = next(iter(action.choices))
        elif action.type in FILE_TYPES:
            given[action.dest] = str(tmp / f"other-{action.dest}")
        else:
            given[action.dest] = HARMLESS.get(action.dest, "1")
    for action in parser._actions:
        if action.dest not in given:
            continue
        value = given[action.dest]
        if action.option_strings:
            argv += [action.option_strings[-1], value]
        else:
            argv += [value, value] if action.nargs in ("+", "*") else [value]
    return argv


def _pairs():
    for command, parser in sorted(COMMANDS.items()):
        for out in _file_actions(parser, OutputPath):
            for inp in _file_actions(parser, InputPath):
                yield pytest.param(
                    command, out.dest, inp.dest, id=f"{' '.join(command)}:{out.dest}={inp.dest}"
                )


@pytest.mark.parametrize(("command", "out", "inp"), list(_pairs()))
def test_no_output_is_an_input(command, out, inp, tmp_path, capsys, monkeypatch):
    """Every command, every output flag = every input flag: refused at once, the file kept."""
    parser = COMMANDS[command]
    monkeypatch.setattr(
        parser, "_defaults", {**parser._defaults, "func": _never}
    )  # the command itself must not run
    victim = tmp_path / "victim.jsonl"
    victim.write_text("precious\n")
    argv = _argv(command, parser, {out: str(victim), inp: str(victim)}, tmp_path)
    one_error(capsys, argv, r"is the same file as")
    assert victim.read_text() == "precious\n"


def _output_pairs():
    for command, parser in sorted(COMMANDS.items()):
        outs = _file_actions(parser, OutputPath)
        for i, first in enumerate(outs):
            for second in outs[i + 1 :]:
                yield pytest.param(
                    command, first.dest, second.dest, id=f"{' '.join(command)}:{first.dest}"
                )


@pytest.mark.parametrize(("command", "first", "second"), list(_output_pairs()))
def test_no_file_is_written_twice(command, first, second, tmp_path, capsys, monkeypatch):
    """Two outputs of one command that are the same file (score --save-calibration and --out,
    demo train --out and --figure) are refused before any work."""
    parser = COMMANDS[command]
    monkeypatch.setattr(parser, "_defaults", {**parser._defaults, "func": _never})
    same = str(tmp_path / "same.png")
    argv = _argv(command, parser, {first: same, second: same}, tmp_path)
    one_error(capsys, argv, r"is the same file as .*: a command writes each of its files once")


def _never(args):
    raise AssertionError("the command ran although an output is one of its inputs")


def _implied_cases():
    for command, parser in sorted(COMMANDS.items()):
        implied = parser._defaults.get("implied")
        if implied is None:
            continue
        for inp in _file_actions(parser, InputPath):
            yield pytest.param(command, inp.dest, id=f"{' '.join(command)}:{inp.dest}")


@pytest.mark.parametrize(("command", "inp"), list(_implied_cases()))
def test_no_implied_output_is_an_input(command, inp, tmp_path, capsys, monkeypatch):
    """The files a command writes without a flag (a calibration split beside --out, calibrate's
    records file, a run directory's files) are never one of its inputs either."""
    parser = COMMANDS[command]
    monkeypatch.setattr(parser, "_defaults", {**parser._defaults, "func": _never})
    out = tmp_path / "made.jsonl"
    probe = build_parser().parse_args(_argv(command, parser, {"out": str(out)}, tmp_path))
    _, outputs = declared_files(_command_parser(build_parser(), probe), probe)
    implied = [p for name, p in outputs.items() if name != "--out"]
    assert implied
    for victim in implied:
        victim.parent.mkdir(parents=True, exist_ok=True)
        victim.write_text("precious\n")
        argv = _argv(command, parser, {"out": str(out), inp: str(victim)}, tmp_path)
        one_error(capsys, argv, r"is the same file as")
        assert victim.read_text() == "precious\n"


def test_the_writer_refuses_a_file_the_command_read(tmp_path):
    """A file read through lad's readers while a command runs is an input from then on, though
    no flag declared it; files inside a declared output folder may be read back and rewritten."""
    from lad.errors import LadError
    from lad.io.files import guarding, read_json, write_text

    read = tmp_path / "read.json"
    read.write_text("{}")
    run = tmp_path / "run"
    run.mkdir()
    (run / "run.json").write_text("{}")
    with guarding({}, {"--out": run}):
        read_json(read)
        read_json(run / "run.json")
        with pytest.raises(LadError, match=r"read\.json is the same file as input .*read\.json"):
            write_text(tmp_path / "x" / ".." / "read.json", "{}")
        write_text(run / "run.json", '{"again": 1}')
    assert read.read_text() == "{}"


# ---------------------------------------------------------------- inputs destroyed (3)


def test_mmiu_calibration_split_over_its_question_file(tmp_path, capsys):
    questions = tmp_path / "mm.calibration.jsonl"
    questions.write_text("[]")
    one_error(
        capsys,
        ["data", "mmiu", questions, "--out", tmp_path / "mm.jsonl"],
        r"its calibration file .*mm\.calibration\.jsonl is the same file as the file argument",
    )
    assert questions.read_text() == "[]"


@pytest.mark.parametrize("flag", ["--prompt-template", "--chat-template"])
def test_calibrate_out_over_its_template(tmp_path, capsys, flag):
    template = tmp_path / "t.txt"
    template.write_text("Which image shows {query}?")
    items = tmp_path / "items.jsonl"
    items.write_text("")
    one_error(
        capsys,
        ["calibrate", "--data", items, flag, template, "--out", template],
        rf"--out .*t\.txt is the same file as {flag} .*t\.txt",
    )
    assert template.read_text() == "Which image shows {query}?"


# ---------------------------------------------------------------- tracebacks (7)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    """A tiny LLaVA checkpoint and a shapes items file of N = 2."""
    from lad.data.shapes import build_shapes, shapes_vocabulary
    from lad.testing.tiny import build_tiny_model

    root = tmp_path_factory.mktemp("tiny")
    build_tiny_model("llava", root / "model", words=shapes_vocabulary())
    build_shapes(root / "bench", num_candidates=2, items=2, split="eval", image_size=16)
    return root


def _calibrate_with(tiny: Path, tmp_path: Path, *extra) -> list:
    return ["calibrate", "--model", tiny / "model", "--data", tiny / "bench/items.jsonl",
            "--items", 1, "--device", "cpu", "--quiet", "--out", tmp_path / "c.json",
            *extra]  # fmt: skip


@pytest.fixture
def loads(monkeypatch):
    """The real model loader (the checks of these tests happen while it loads)."""
    from lad.backends.load import load_backend

    monkeypatch.setattr("lad.backends.load_backend", load_backend)


@pytest.mark.parametrize(
    ("body", "raised"),
    [
        ("{{ 1/0 }}", "ZeroDivisionError"),
        ("{{ range(200000)|list }}", "OverflowError"),
        ("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}", "RecursionError"),
    ],
)
def test_chat_template_that_fails_while_rendering(tiny, tmp_path, capsys, loads, body, raised):
    template = tmp_path / "bad.jinja"
    template.write_text(body)
    one_error(
        capsys,
        _calibrate_with(tiny, tmp_path, "--chat-template", template),
        rf"--chat-template .*bad\.jinja: its chat template cannot render .*\({raised}",
    )


def test_json_reader_on_non_utf8_and_on_parquet(tmp_path, capsys):
    latin = tmp_path / "latin.json"
    latin.write_bytes(b'[{"question": "caf\xe9"}]')
    one_error(
        capsys,
        ["data", "mmiu", latin, "--out", tmp_path / "o.jsonl"],
        r"latin\.json: not UTF-8 text \(byte 0xe9, line 1\); a JSON question file must be saved",
    )
    parquet = tmp_path / "all.parquet"
    parquet.write_bytes(b"PAR1\xf4\x00\x00")
    one_error(
        capsys,
        ["data", "import", parquet, "--images", tmp_path, "--out", tmp_path / "o.jsonl"],
        r"all\.parquet: is a Parquet file, not a JSON annotation file",
    )
    one_error(
        capsys,
        ["calibrate", "--data", parquet, "--out", tmp_path / "c.json"],
        r"all\.parquet: is a Parquet file, not an items file \(UTF-8 text\)",
    )


@pytest.mark.parametrize(
    ("flag", "value", "pattern"),
    [
        ("--seed", "-1", r"--seed must be in 0\.\.4294967295\. Got -1\."),
        ("--lr", "nan", r"--lr must be a positive finite number\. Got nan\."),
        ("--lr", "-1", r"--lr must be a positive finite number\. Got -1\.0\."),
    ],
)
def test_demo_train_bad_numbers_before_any_work(
    tmp_path, capsys, monkeypatch, flag, value, pattern
):
    def no_training(*args, **kwargs):
        raise AssertionError("training began")

    monkeypatch.setattr("lad.demo.train._seed_everything", no_training)
    one_error(capsys, ["demo", "train", "--out", tmp_path / "m", flag, value], pattern)


def test_malicious_pickle_weights_are_one_line(tiny, tmp_path, capsys, loads):
    model = tmp_path / "model"
    shutil.copytree(tiny / "model", model)
    for weights in model.glob("*.safetensors"):
        weights.unlink()

    class Evil:
        def __reduce__(self):
            return (os.system, ("echo pwned",))

    import pickle

    (model / "pytorch_model.bin").write_bytes(pickle.dumps(Evil()))
    with warnings.catch_warnings(record=True) as shown:  # a warning is a line on stderr too
        warnings.simplefilter("always")
        line = one_error(
            capsys,
            [
                "calibrate",
                "--model",
                model,
                "--data",
                tiny / "bench/items.jsonl",
                "--items",
                1,
                "--device",
                "cpu",
                "--quiet",
                "--out",
                tmp_path / "c.json",
            ],
            r"cannot load model '.*model' \(its weights: pytorch_model\.bin\): \w+",
        )
    assert "pwned" not in line
    assert not [w for w in shown if "pickle" in str(w.message)]


# ---------------------------------------------------------------- bounded resources (2 + 3)


@pytest.fixture
def items(tiny) -> Path:
    return tiny / "bench/items.jsonl"


@pytest.mark.parametrize(
    ("flags", "pattern"),
    [
        (["--image-size", "100000"], r"--image-size 100000: an image side of 100,000 pixels is "
         r"above lad's limit of 4,096; set LAD_MAX_IMAGE_SIZE=100000"),
        (["--max-pixels", "1000000000"], r"--max-pixels 1000000000: a pixel budget of "
         r"1,000,000,000 pixels is above lad's limit of 16,777,216; set LAD_MAX_PIXEL_BUDGET"),
    ],
)  # fmt: skip
def test_image_sizes_are_bounded(items, tmp_path, capsys, flags, pattern):
    one_error(
        capsys,
        [
            "eval",
            "--data",
            items,
            "-n",
            2,
            "--calibration-items",
            1,
            "--out",
            tmp_path / "r",
            *flags,
        ],
        pattern,
    )


def test_a_limit_can_be_raised(items, tmp_path, capsys, monkeypatch):
    from lad.errors import BackendError

    def loading(*args, **kwargs):
        raise BackendError("the checks passed; the model would load now")

    monkeypatch.setattr("lad.backends.load_backend", loading)
    monkeypatch.setenv("LAD_MAX_IMAGE_SIZE", "5000")
    one_error(
        capsys,
        [
            "eval",
            "--data",
            items,
            "-n",
            2,
            "--calibration-items",
            1,
            "--image-size",
            4500,
            "--out",
            tmp_path / "r",
        ],
        r"the model would load now",
    )


def test_prompt_template_size_is_bounded(items, tmp_path, capsys):
    big = tmp_path / "big.txt"
    big.write_text("{query} " + "x" * 70_000)
    one_error(
        capsys,
        ["calibrate", "--data", items, "--prompt-template", big, "--out", tmp_path / "c.json"],
        r"--prompt-template .*big\.txt: a prompt template of 70,008 bytes is above lad's limit "
        r"of 65,536; set LAD_MAX_PROMPT_TEMPLATE=70008 to allow it",
    )


def test_question_length_is_bounded(tiny, tmp_path, capsys):
    long = tmp_path / "long.jsonl"
    line = json.loads((tiny / "bench/items.jsonl").read_text().splitlines()[0])
    line["images"] = [str(tiny / "bench" / p) for p in line["images"]]
    line["question"] = "Which? " * 3000
    long.write_text(json.dumps(line) + "\n")
    one_error(
        capsys,
        ["calibrate", "--data", long, "--out", tmp_path / "c.json"],
        r"long\.jsonl:1: 'question': a query or question of 21,000 characters is above lad's "
        r"limit of 16,384; set LAD_MAX_QUERY",
    )


def test_chat_template_output_is_bounded(tiny, tmp_path, capsys, loads):
    template = tmp_path / "huge.jinja"
    template.write_text("{% for i in range(99999) %}{% for j in range(99999) %}x{% endfor %}"
                        "{% endfor %}")  # fmt: skip
    one_error(
        capsys,
        _calibrate_with(tiny, tmp_path, "--chat-template", template),
        r"--chat-template .*huge\.jinja: its chat template writes more than 1,048,576 characters "
        r"for one prompt, lad's limit; set LAD_MAX_CHAT_TEXT higher",
    )


# ---------------------------------------------------------------- saying the truth (13)


def _shapes(root: Path, items: int, **kw) -> Path:
    from lad.data.shapes import build_shapes

    return build_shapes(root, num_candidates=2, items=items, image_size=16, **kw)


def test_calibration_data_with_fewer_items_than_asked(tmp_path, capsys):
    data = _shapes(tmp_path / "e", 3, split="eval")
    cal = _shapes(tmp_path / "c", 5, split="calibration")
    one_error(
        capsys,
        [
            "eval",
            "--data",
            data,
            "--calibration-data",
            cal,
            "-n",
            2,
            "--calibration-items",
            50,
            "--out",
            tmp_path / "r",
        ],
        r"c/items\.jsonl: holds 5 items but --calibration-items asks for 50; pass "
        r"--calibration-items 5",
    )


def test_calibrate_on_evaluation_with_fewer_items_than_asked(tmp_path, capsys):
    data = _shapes(tmp_path / "e", 4, split="eval")
    argv = ["eval", "--data", data, "--calibrate-on", "evaluation", "-n", 2,
            "--calibration-items", 10, "--out", tmp_path / "r"]  # fmt: skip
    capsys.readouterr()
    assert main([str(a) for a in argv]) == 1
    (error,) = capsys.readouterr().err.strip().splitlines()  # no warning before the refusal
    assert error.startswith("Error: ") and "e/items.jsonl: holds 4 items but " in error
    assert "--calibration-items asks for 10; pass --calibration-items 4" in error


def test_question_items_with_a_caption_calibration_file(tmp_path, capsys):
    data = _shapes(tmp_path / "e", 3, split="eval")
    asked = tmp_path / "e" / "questions.jsonl"
    lines = [json.loads(x) for x in data.read_text().splitlines()]
    asked.write_text("".join(json.dumps({**x, "question": "Which one?"}) + "\n" for x in lines))
    cal = _shapes(tmp_path / "c", 2, split="calibration")
    one_error(
        capsys,
        [
            "eval",
            "--data",
            asked,
            "--calibration-data",
            cal,
            "-n",
            2,
            "--calibration-items",
            1,
            "--out",
            tmp_path / "r",
        ],
        r"--calibration-data .*c/items\.jsonl holds caption items but --data .*questions\.jsonl "
        r"holds question items",
    )


def test_score_on_the_records_of_a_running_eval(tmp_path, capsys):
    from lad.run.lock import RunLock

    model = SyntheticModel(num_candidates=4, num_layers=6)
    write_records(tmp_path / "records.jsonl", model.eval_records(6, num_shuffles=2))
    write_records(tmp_path / "calibration.jsonl", model.calibration_records(3))
    argv = [
        "score",
        "--records",
        tmp_path / "records.jsonl",
        "--calibration-records",
        tmp_path / "calibration.jsonl",
        "--method",
        "lad",
        "--out",
        tmp_path / "p.jsonl",
    ]
    with RunLock(tmp_path):  # as a lad eval still writing this folder holds it
        capsys.readouterr()
        assert main([str(a) for a in argv]) == 0
        err = capsys.readouterr().err
    assert err.startswith(f"Warning: {tmp_path} is being written by a running lad eval (pid ")
    assert "these are the 12 records of" in err and "written so far, not the finished run" in err
    capsys.readouterr()
    assert main([str(a) for a in argv]) == 0
    assert capsys.readouterr().err == ""  # once it has finished, nothing to say


def test_nul_byte_in_a_prompt_template(items, tmp_path, capsys):
    template = tmp_path / "nul.txt"
    template.write_text("Which image shows\x00 {query}?")
    one_error(
        capsys,
        ["calibrate", "--data", items, "--prompt-template", template, "--out", tmp_path / "c.json"],
        r"--prompt-template .*nul\.txt: holds the control character '\\x00' on line 1; a prompt "
        "template is plain text",
    )


def test_out_a_dangling_symlink(items, tmp_path, capsys):
    (tmp_path / "r").symlink_to(tmp_path / "gone")
    one_error(
        capsys,
        ["eval", "--data", items, "-n", 2, "--calibration-items", 1, "--out", tmp_path / "r"],
        r"--out .*/r is a symlink to .*gone, which does not exist",
    )


def test_ablate_on_an_empty_records_file(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    (run / "run.json").write_text(json.dumps({"format": "lad-run/1", "arguments": {}}))
    (run / "records.jsonl").write_text("")
    (run / "calibration.json").write_text("{}")
    one_error(capsys, ["ablate", run], r"records\.jsonl: holds no records; rerun its lad eval")


def test_metrics_on_an_empty_records_file(tmp_path, capsys):
    (tmp_path / "records.jsonl").write_text("")
    (tmp_path / "p.jsonl").write_text(
        '{"item": "a", "ordering": 0, "method": "lad", "chosen": 0}\n'
    )
    one_error(
        capsys,
        ["metrics", "--records", tmp_path / "records.jsonl", "--predictions", tmp_path / "p.jsonl"],
        r"records\.jsonl: holds no records; nothing to measure",
    )


def test_unknown_hub_model_is_one_line_without_retries(tmp_path):
    """Offline (HF_HUB_OFFLINE) the hub is not asked; with an unreachable hub it is asked once:
    either way one line and no warnings of retries."""
    code = "from lad.backends.load import load_backend; load_backend('nosuchorg/x')"
    env = {k: v for k, v in os.environ.items() if "OFFLINE" not in k}
    cases = [
        ({**env, "HF_HUB_OFFLINE": "1"}, "HF_HUB_OFFLINE is set, so the hub is not asked"),
        ({**env, "HF_ENDPOINT": "http://127.0.0.1:9"}, r"the hub (http://127.0.0.1:9) cannot be"),
    ]
    for environment, message in cases:
        environment["PYTHONPATH"] = os.pathsep.join(sys.path)
        environment["HF_HOME"] = str(tmp_path / "hf")
        done = subprocess.run(
            [sys.executable, "-c", code], env=environment, capture_output=True, text=True
        )
        last = done.stderr.strip().splitlines()[-1]
        assert last.startswith("lad.errors.BackendError: --model nosuchorg/x: not a local folder")
        assert message in last
        assert "retry" not in done.stderr.lower() and "warning" not in done.stderr.lower()


def test_tau_overflow_is_one_line_without_numpy_warnings(tmp_path, capsys):
    import warnings

    from lad.core.calibrate import Calibration

    model = SyntheticModel(num_candidates=4, num_layers=6)
    records = model.eval_records(4, num_shuffles=1)
    # Every candidate attended below its prior: tau * log(a / prior) is -inf for all (Eq. 12).
    records.attention[:] = records.attention * 0.01
    write_records(tmp_path / "records.jsonl", records)
    Calibration().fit(model.calibration_records(2)).save(tmp_path / "cal.json")
    argv = ["score", "--records", tmp_path / "records.jsonl", "--calibration",
            tmp_path / "cal.json", "--method", "lad", "--tau", "1e308", "--out",
            tmp_path / "p.jsonl"]  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a numpy RuntimeWarning would fail the command
        one_error(capsys, argv, r"method 'lad': its scores overflow to infinity or NaN")


# ---------------------------------------------------------------- hostile inputs, every command


def _hostile(kind: str, folder: Path) -> Path:
    """A file or folder a hostile but realistic user could pass where lad reads one."""
    path = folder / f"hostile-{kind}"
    contents = {
        "latin-1": b'{"caption": "caf\xe9"}\n',
        "parquet": b"PAR1\xf4\x15\x00\x00PAR1",
        "nul": b'{"id": "a\x00"}\n',
        "empty": b"",
        "png": b"\x89PNG\r\n\x1a\n\x00\x00",
        "not-json": b"{oops\n",
    }
    if kind == "folder":
        path.mkdir()
    elif kind == "dangling":
        path.symlink_to(folder / "gone")
    elif kind == "missing":
        pass
    else:
        path.write_bytes(contents[kind])
    return path


HOSTILE = ("latin-1", "parquet", "nul", "empty", "png", "not-json", "folder", "dangling", "missing")


def _input_flags():
    for command, parser in sorted(COMMANDS.items()):
        for action in _file_actions(parser, InputPath):
            yield pytest.param(command, action.dest, id=f"{' '.join(command)}:{action.dest}")


@pytest.mark.parametrize(("command", "inp"), list(_input_flags()))
def test_hostile_inputs_never_a_traceback(command, inp, tmp_path, capsys, monkeypatch):
    """Every command, every input flag, every hostile file: exit 1 with one `Error:` line (or
    argparse's usage, exit 2), never an exception escaping lad."""
    from lad.errors import BackendError

    def loading(*args, **kwargs):
        raise BackendError("the checks passed; the model would load now")

    monkeypatch.setattr("lad.backends.load_backend", loading)
    monkeypatch.setattr("lad.demo.train._seed_everything", _no_training)
    parser = COMMANDS[command]
    for kind in HOSTILE:
        folder = tmp_path / kind
        folder.mkdir()
        argv = _argv(
            command, parser, {inp: str(_hostile(kind, folder)), "out": str(folder / "o")}, folder
        )
        if command == ("eval",):  # generated shapes data, when not the input under test: small
            argv += ["--items", "2", "--calibration-items", "1"]
        capsys.readouterr()
        try:
            code = main(argv)
        except SystemExit as e:  # argparse: usage and exit 2
            code = e.code
        err = capsys.readouterr().err
        assert "Traceback" not in err, (kind, err)
        assert code in (1, 2), (kind, code, err)
        if code == 1:
            errors = [line for line in err.splitlines() if line.startswith("Error: ")]
            assert len(errors) == 1, (kind, err)


def _no_training(*args, **kwargs):
    from lad.errors import LadError

    raise LadError("the checks passed; training would start now")


def test_default_calibration_items_of_a_smaller_file_are_said_and_recorded(
    tmp_path, capsys, monkeypatch
):
    """Unstated, --calibration-items is 5 or all a smaller calibration file holds: the run says
    so and run.json records the number it calibrates on."""
    from lad.errors import BackendError

    data = _shapes(tmp_path / "e", 3, split="eval")
    cal = _shapes(tmp_path / "c", 2, split="calibration")

    def loading(*args, **kwargs):
        raise BackendError("the checks passed; the model would load now")

    monkeypatch.setattr("lad.backends.load_backend", loading)
    out = tmp_path / "r"
    argv = ["eval", "--data", data, "--calibration-data", cal, "-n", 2, "--out", out]
    capsys.readouterr()
    assert main([str(a) for a in argv]) == 1
    err = capsys.readouterr().err
    assert f"Note: {cal} holds 2 calibration items: calibrating on 2" in err
    assert json.loads((out / "run.json").read_text())["arguments"]["calibration_items"] == 2


def test_chat_template_file_size_is_bounded(tiny, tmp_path, capsys, loads):
    template = tmp_path / "big.jinja"
    template.write_text("{{ messages }}" + " " * (1 << 20))
    one_error(
        capsys,
        _calibrate_with(tiny, tmp_path, "--chat-template", template),
        r"--chat-template .*big\.jinja: a chat template of 1,048,590 bytes is above lad's limit of "
        r"1,048,576; set LAD_MAX_CHAT_TEMPLATE=1048590 to allow it",
    )


@pytest.mark.parametrize("flag", ["--prompt-template", "--chat-template"])
def test_a_binary_template_is_named_for_what_it_is(tiny, tmp_path, capsys, loads, flag):
    template = tmp_path / "t.parquet"
    template.write_bytes(b"PAR1\x15\x04\x15")
    one_error(
        capsys,
        _calibrate_with(tiny, tmp_path, flag, template),
        r"t\.parquet: (cannot read the Jinja file \()?is a Parquet file, not a (prompt template "
        r"file|Jinja chat template file)",
    )
