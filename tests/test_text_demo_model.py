"""The text demo model shipped with lad (`--model text-demo`; docs/demo-model.md, "The text
demo"): its folder is complete and small, `lad data text-demo` writes its held-out items, `lad
eval` and `lad predict` load it by name (predict with text options), and the harnesses take the
`check_calibration` switch their refusal names."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lad.backends.checkpoint import SHIPPED_MODELS, shipped_model_path
from lad.cli import main
from lad.data.items import read_items
from lad.errors import BackendError, CalibrationError, LadError

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")
SHIPPED += ("chat_template.jinja", "items.jsonl", "items.calibration.jsonl", "text_demo.json")


def test_the_text_demo_folder_is_complete_and_small():
    path = shipped_model_path("text-demo")
    assert path == ROOT / "lad/demo" / SHIPPED_MODELS["text-demo"][0]
    assert {p.name for p in path.iterdir()} >= set(SHIPPED)
    assert json.loads((path / "config.json").read_text())["model_type"] == "llama"
    assert sum(p.stat().st_size for p in path.iterdir()) <= 2 * 2**20
    log = json.loads((path / "text_demo.json").read_text())  # how it was trained
    assert log["seed"] == 0 and set(log["methods"]) >= {"vanilla", "pride", "lad"}
    folder = SHIPPED_MODELS["text-demo"][0]  # installed with the package:
    assert f'"demo/{folder}/*"' in (ROOT / "pyproject.toml").read_text()


def test_a_missing_shipped_file_names_the_model_and_how_to_remake_it(monkeypatch, tmp_path):
    (tmp_path / SHIPPED_MODELS["text-demo"][0]).mkdir()
    monkeypatch.setattr("lad.backends.checkpoint.DEMO_DIR", tmp_path)
    with pytest.raises(BackendError, match=r"text-demo model's files are missing .*items\.jsonl"
                       r".*benchmarks/text_demo\.py .*--ship"):  # fmt: skip
        shipped_model_path("text-demo")


@pytest.fixture(scope="module")
def items(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("text-demo") / "text-demo.jsonl"
    assert main(["data", "text-demo", "--out", str(out)]) == 0
    return out


def test_lad_data_text_demo_writes_the_shipped_held_out_items(items):
    evaluation = read_items(items, num_candidates=4)
    calibration = read_items(items.with_name("text-demo.calibration.jsonl"), num_candidates=4)
    assert (len(evaluation), len(calibration)) == (100, 5)
    assert all(it.is_text for it in evaluation + calibration)
    assert not {it.id for it in evaluation} & {it.id for it in calibration}
    shipped = shipped_model_path("text-demo")
    assert items.read_bytes() == (shipped / "items.jsonl").read_bytes()


@pytest.fixture(scope="module")
def run(items, tmp_path_factory) -> tuple[Path, str]:
    import contextlib
    import io

    out = tmp_path_factory.mktemp("run") / "run"
    argv = ["eval", "--model", "text-demo", "--data", str(items),
            "--calibration-data", str(items.with_name("text-demo.calibration.jsonl")),
            "--items", "3", "--num-shuffles", "1", "--methods", "vanilla,pride,lad",
            "--device", "cpu", "--out", str(out), "-q"]  # fmt: skip
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert main(argv) == 0
    return out, printed.getvalue()


def test_lad_eval_loads_the_text_demo_by_name(run):
    out, printed = run
    rows = {line.split()[0] for line in printed.splitlines() if line.strip()}
    assert {"vanilla", "pride", "lad"} <= rows
    arguments = json.loads((out / "run.json").read_text())["arguments"]
    assert arguments["model"] == "text-demo"  # the name, not this machine's folder
    assert len((out / "records.jsonl").read_text().splitlines()) == 3


def _predict(run, capsys, *more: str) -> str:
    argv = ["predict", "--model", "text-demo", "--calibration", str(run[0] / "calibration.json"),
            "--question", "Which option is a fruit?", "--device", "cpu", *more]  # fmt: skip
    capsys.readouterr()
    code = main(argv)
    captured = capsys.readouterr()
    assert code == 0, captured.err
    return captured.out


def test_lad_predict_takes_text_options(run, capsys):
    options = ["tiger", "paris", "apple", "copper"]
    table = _predict(run, capsys, "--text-options", *options)
    assert "option" in table.splitlines()[1] and "image" not in table
    assert all(word in table for word in options)
    choice = json.loads(_predict(run, capsys, "--json", "--text-options", *options))
    assert len(choice["prob_before"]) == 4 and 0 <= choice["lad"] < 4
    assert choice["labels"] == ["1", "2", "3", "4"]


@pytest.mark.parametrize(
    ("more", "says"),
    [
        (["a.png", "b.png", "--text-options", "x", "y"], "not both"),
        ([], "got neither"),
        (["--text-options", "apple"], "needs at least 2 text options, got 1"),
        (["--text-options", "apple", " "], "text option 1 is blank"),
    ],
)
def test_lad_predict_refuses_bad_candidates_in_one_line(run, capsys, tmp_path, more, says):
    for name in ("a.png", "b.png"):
        (tmp_path / name).write_bytes(b"")
    more = [str(tmp_path / m) if m.endswith(".png") else m for m in more]
    argv = ["predict", "--model", "text-demo", "--calibration", str(run[0] / "calibration.json"),
            "--question", "Which option is a fruit?", "--device", "cpu", *more]  # fmt: skip
    capsys.readouterr()
    assert main(argv) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("Error: ") and says in err[0], err


def test_the_calibration_switch_a_harness_refusal_names_is_a_model_arg(run):
    """lm-eval's --model lad refuses a calibration of another prompt naming
    check_calibration=False; that model_arg is taken and lets it through (N and layers checked)."""
    from lad.harness.contexts import parse_question
    from lad.harness.text_scorer import ChoiceOptions, ContextScorer

    context = "Which option is a fruit?\nA. tiger\nB. paris\nC. apple\nD. copper\nAnswer:"
    question = parse_question("t", 0, context, [" A", " B", " C", " D"])
    calibration = str(run[0] / "calibration.json")  # lad's text prompt, digit labels
    strict = ContextScorer(ChoiceOptions(model="text-demo", calibration=calibration))
    with pytest.raises(CalibrationError, match=r"check_calibration=False"):
        strict.calibrated(question)
    lenient = ChoiceOptions(model="text-demo", calibration=calibration, check_calibration=False)
    assert ContextScorer(lenient).calibrated(question) is not None


def test_harness_model_args_read_check_calibration():
    from lad.harness.args import model_arg_bool
    from lad.harness.runner import HarnessOptions, PictureScorer

    assert [model_arg_bool("x", v) for v in ("False", "true", "0", "1", False, True)] == [
        False, True, False, True, False, True,
    ]  # fmt: skip
    with pytest.raises(LadError, match=r"'check_calibration' model_arg must be True or False"):
        model_arg_bool("check_calibration", "maybe")
    scorer = PictureScorer(HarnessOptions(method="vanilla", check_calibration=False))
    assert scorer.base.check_calibration is False  # every calibration it loads is a clone


def test_the_readme_text_table_is_what_its_commands_print(tmp_path, monkeypatch, capsys):
    """The README's "LAD on text options (demo)" commands, run as written, print its table."""
    import re

    from tests.test_benchmarks_end_to_end import documented_commands

    heading = "## LAD on text options (demo)"
    commands = documented_commands(heading=heading)
    assert [c[:2] for c in commands] == [["data", "text-demo"], ["eval", "--model"]]
    section = (ROOT / "README.md").read_text(encoding="utf-8").split(heading)[1]
    table = re.search(r"```text\n(.*?)```", section, re.S).group(1)
    monkeypatch.chdir(tmp_path)
    for argv in commands:
        assert main(argv) == 0
    printed = capsys.readouterr().out
    start = printed.index("N = 4, 100 items")
    assert printed[start : start + len(table)] == table
