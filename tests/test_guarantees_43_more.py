"""Issue 43's guarantees, the cases a second hostile battery found: every setting that sizes a
run's work bounded (wherever it is set); a finished run's own files never another command's
output; a refusal before the first write (--orders); a pipe never read as a samples file; a
suite's text values strings; every error one line."""

from __future__ import annotations

import json
import os

import pytest

from lad.cli import main
from lad.errors import LadError
from tests.test_guarantees_43 import SUITE, _snapshot, one_error


@pytest.mark.parametrize(
    ("flag", "value", "says"),
    [
        ("--num-shuffles", 10**9, "a shuffle count of 1,000,000,000 orderings per item"),
        ("--sc-samples", 10**9, "a self-consistency count of 1,000,000,000 paths per prompt"),
        ("--max-new-tokens", 10**9, "a reply of 1,000,000,000 tokens"),
        ("--batch-size", 10**6, "a batch of 1,000,000 prompts"),
    ],
)
def test_every_setting_that_sizes_a_run_is_bounded(tmp_path, capsys, flag, value, says):
    from lad.run.config import eval_config

    # The command line, refused before any file is read (--data names none) or model loads.
    argv = ["eval", "--data", tmp_path / "none.jsonl", flag, value, "--out", tmp_path / "run"]
    one_error(capsys, argv, f"{flag} {value}: {says} is above lad's limit")
    assert not (tmp_path / "run").exists()
    # A suite's settings and the library go through the same EvalConfig.
    with pytest.raises(LadError, match=says):
        eval_config(**{flag.removeprefix("--").replace("-", "_"): value})
    suite = tmp_path / "s.toml"
    key = flag.removeprefix("--").replace("-", "_")
    suite.write_text(SUITE.format(settings=f"{key} = {value}", more="") + '[[models]]\nname = "m"'
                     '\npath = "demo"\n')  # fmt: skip
    one_error(capsys, ["suite", "run", suite, "--out", tmp_path / "o"], says)
    assert not (tmp_path / "o").exists()


def test_generated_benchmarks_are_bounded(tmp_path, capsys):
    one_error(capsys, ["data", "shapes", "--items", 10**9, "--out", tmp_path / "s"],
              "--items 1000000000: a generated benchmark of 1,000,000,000 items is above "
              "lad's limit of 100,000; set LAD_MAX_GENERATED_ITEMS")  # fmt: skip
    assert not (tmp_path / "s").exists()
    # lad eval draws them into its run: refused before the run is begun.
    one_error(capsys, ["eval", "--items", 10**9, "--out", tmp_path / "run"], "--items 1000000000")
    assert not (tmp_path / "run").exists()
    one_error(capsys, ["eval", "--calibration-items", 200_000, "--out", tmp_path / "run"],
              "--calibration-items 200000: a generated benchmark of 200,000 items")  # fmt: skip
    assert not (tmp_path / "run").exists()


def test_a_runs_own_files_are_no_other_commands_output(tmp_path, capsys):
    from tests.synthetic import SyntheticModel
    from tests.test_ablate import write_run_dir

    run = write_run_dir(tmp_path / "run", SyntheticModel(num_candidates=3, seed=2), items=8)
    assert main(["score", "--records", str(run / "records.jsonl"), "--methods", "vanilla",
                 "--out", str(tmp_path / "p.jsonl")]) == 0  # fmt: skip
    from lad.core.methods import MethodOptions
    from lad.evaluate import score_run

    score_run(run, ("vanilla", "lad"), MethodOptions(), write_report=False)
    before = _snapshot(run)
    says = "a file lad eval writes in the run"
    for argv in (
        ["export", run, "--format", "facet-probe", "--out", run / "metrics.json"],
        ["score", "--records", run / "records.jsonl", "--methods", "vanilla", "--out",
         run / "predictions.jsonl"],
        ["metrics", "--records", run / "records.jsonl", "--predictions", tmp_path / "p.jsonl",
         "--out", run / "metrics.json"],
        ["report", run, "--out", run / "run.json"],
    ):  # fmt: skip
        one_error(capsys, argv, says)
    assert _snapshot(run) == before
    # Its report folder is the report's own.
    assert main(["report", str(run), "--out", str(run / "report")]) == 0


def test_refusals_and_reads_of_this_battery(tmp_path, capsys):
    # --orders is read before the run directory is begun.
    rows = [{"id": f"q{k}", "query": "Q?", "candidates": ["a", "b"], "answer": k % 2}
            for k in range(8)]  # fmt: skip
    data = tmp_path / "t.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    orders = tmp_path / "o.jsonl"
    orders.write_text('{"x": [1, 2, "a"]}\n')
    argv = ["eval", "--model", tmp_path, "--data", data, "-n", "2", "--orders", orders]
    one_error(capsys, [*argv, "--out", tmp_path / "run"], "missing key 'item'")
    assert not (tmp_path / "run").exists()
    # A pipe named like a samples file is refused, not read forever.
    logs = tmp_path / "logs"
    logs.mkdir()
    os.mkfifo(logs / "samples_x.jsonl")
    one_error(capsys, ["harness", "audit", logs, "--out", tmp_path / "a"], "not a regular file")
    # A suite's model path, cell id and setting are strings (5 is not the model named '5').
    for more in ('[[models]]\nname = "m"\npath = 5', "setting = 5"):
        suite = tmp_path / "s.toml"
        suite.write_text(SUITE.format(settings="", more=more))
        one_error(capsys, ["suite", "run", suite, "--model", "demo", "--out", tmp_path / "so"],
                  "must be a string, got 5")  # fmt: skip
    # A library's message holding line breaks (pyarrow's) is printed as one line.
    bad = tmp_path / "x.parquet"
    bad.write_bytes(b"PAR1" + b"\0" * 100 + b"PAR1")
    one_error(capsys, ["data", "muirbench", bad, "--out", tmp_path / "m.jsonl"],
              "cannot read it as Parquet")  # fmt: skip
