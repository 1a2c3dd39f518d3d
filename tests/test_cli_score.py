import json

import numpy as np
import pytest

from lad.cli import build_parser, main
from lad.core.predictions import read_predictions
from lad.core.records import read_records, write_records
from tests.synthetic import SyntheticModel


@pytest.fixture
def run_dir(tmp_path):
    model = SyntheticModel(num_candidates=4, num_layers=6)
    write_records(tmp_path / "records.jsonl", model.eval_records(20, num_shuffles=3))
    write_records(tmp_path / "calibration.jsonl", model.calibration_records(5))
    write_records(tmp_path / "perm.parquet", model.perm_records(20))
    return tmp_path


def test_score_then_metrics(run_dir, capsys):
    d = run_dir
    code = main(["score", "--records", str(d / "records.jsonl"),
                 "--calibration-records", str(d / "calibration.jsonl"),
                 "--method", "vanilla", "--method", "lad", "--method", "perm-avg",
                 "--perm-records", str(d / "perm.parquet"),
                 "--save-calibration", str(d / "calibration.json"),
                 "--out", str(d / "predictions.jsonl")])  # fmt: skip
    assert code == 0
    out = capsys.readouterr().out
    assert "lad" in out and "written:" in out
    preds = read_predictions(d / "predictions.jsonl")
    assert len(preds) == 3 * 60 and {p.method for p in preds} == {"vanilla", "lad", "perm-avg"}
    assert json.loads((d / "calibration.json").read_text())["format"] == "lad-calibration/1"

    assert main(["metrics", "--records", str(d / "records.jsonl"),
                 "--predictions", str(d / "predictions.jsonl"), "--json",
                 "--out", str(d / "metrics.json")]) == 0  # fmt: skip
    metrics = json.loads(capsys.readouterr().out)
    assert metrics == json.loads((d / "metrics.json").read_text())
    assert set(metrics["methods"]) == {"vanilla", "lad", "perm-avg"}
    assert metrics["methods"]["perm-avg"]["forward_passes_per_item"] == 4.0


def test_score_with_a_saved_calibration_matches_fitting(run_dir, capsys):
    d = run_dir
    common = ["score", "--records", str(d / "records.jsonl"), "--method", "lad",
              "--top-k", "1", "--tau", "3", "--layers", "top-k", "--mixture", "log"]  # fmt: skip
    fit = ["--calibration-records", str(d / "calibration.jsonl"),
           "--save-calibration", str(d / "cal.json")]  # fmt: skip
    assert main([*common, *fit, "--out", str(d / "a.jsonl")]) == 0
    assert main([*common, "--calibration", str(d / "cal.json"), "--out", str(d / "b.jsonl")]) == 0
    a, b = read_predictions(d / "a.jsonl"), read_predictions(d / "b.jsonl")
    np.testing.assert_allclose([p.scores for p in a], [p.scores for p in b])


def test_a_calibration_of_another_runs_model_is_refused(tmp_path, capsys):
    """Records beside a run.json say how they were made: a calibration of another model is
    refused in one line naming --no-calibration-check, as lad eval and lad predict refuse it."""
    from lad.run.rundir import RunDir

    model = SyntheticModel(num_candidates=4, num_layers=6)  # the same N and L on both sides
    for name in ("demo", "text-demo"):
        RunDir(tmp_path / name).begin({"model": name}, {})
        write_records(tmp_path / name / "records.jsonl", model.eval_records(8, num_shuffles=2))
        write_records(tmp_path / name / "calibration.jsonl", model.calibration_records(5))
    records, demo = str(tmp_path / "text-demo" / "records.jsonl"), tmp_path / "demo"
    score = ["score", "--records", records, "--method", "lad"]
    fit = ["--calibration-records", str(demo / "calibration.jsonl")]
    saved = ["--save-calibration", str(tmp_path / "demo.json")]
    assert main(["score", "--records", str(demo / "records.jsonl"), "--method", "lad", *fit,
                 *saved, "--out", str(tmp_path / "a.jsonl")]) == 0  # fmt: skip
    capsys.readouterr()
    for given in (["--calibration", str(tmp_path / "demo.json")], fit):
        assert main([*score, *given, "--out", str(tmp_path / "b.jsonl")]) == 1
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith(f"Error: {given[1]}: ")
        assert "'demo' but the records' is 'text-demo'" in err and "--no-calibration-check" in err
        assert not (tmp_path / "b.jsonl").exists()
        skipped = [*score, *given, "--no-calibration-check", "--out", str(tmp_path / "b.jsonl")]
        assert main(skipped) == 0
        (tmp_path / "b.jsonl").unlink()
    own = ["--calibration-records", str(tmp_path / "text-demo" / "calibration.jsonl")]
    assert main([*score, *own, "--out", str(tmp_path / "c.jsonl")]) == 0  # its own run's: used


def test_layers_and_no_prior(run_dir, capsys):
    d = run_dir
    assert main(["score", "--records", str(d / "records.jsonl"), "--method", "attn-purified",
                 "--layers", "1,3", "--no-prior", "--out", str(d / "p.jsonl")]) == 0  # fmt: skip
    assert len(read_predictions(d / "p.jsonl")) == len(read_records(d / "records.jsonl"))


def test_method_needing_a_calibration_without_one(run_dir, capsys):
    d = run_dir
    code = main(["score", "--records", str(d / "records.jsonl"), "--method", "pride",
                 "--out", str(d / "p.jsonl")])  # fmt: skip
    assert code == 1
    assert capsys.readouterr().err == (
        "Error: PriDe's prior comes from a calibration: fit one on calibration records "
        "(--calibration-records) or load a calibration.json (--calibration)\n"
    )
    assert not (d / "p.jsonl").exists()


def test_bad_record_line_is_a_clean_error(run_dir, capsys):
    d = run_dir
    lines = (d / "records.jsonl").read_text().splitlines()
    lines[4] = lines[4].replace('"answer":', '"answr":')
    (d / "records.jsonl").write_text("\n".join(lines) + "\n")
    code = main(["metrics", "--records", str(d / "records.jsonl"),
                 "--predictions", str(d / "nothing.jsonl")])  # fmt: skip
    assert code == 1
    err = capsys.readouterr().err
    assert err.startswith(f"Error: {d / 'records.jsonl'}:5: missing key 'answer'")


def test_incomplete_calibration_names_item_and_shift(run_dir, capsys):
    d = run_dir
    lines = (d / "calibration.jsonl").read_text().splitlines()
    (d / "calibration.jsonl").write_text("\n".join(lines[:-1]) + "\n")
    args = ["score", "--records", str(d / "records.jsonl"), "--method", "lad",
            "--calibration-records", str(d / "calibration.jsonl"),
            "--out", str(d / "p.jsonl")]  # fmt: skip
    assert main(args) == 1
    assert "item 'cal-00004' lacks cyclic shift 3" in capsys.readouterr().err
    assert main([*args, "--allow-partial"]) == 0


def test_bad_layers_argument(run_dir, capsys):
    with pytest.raises(SystemExit):
        main(["score", "--records", "r", "--method", "lad", "--layers", "x", "--out", "p"])
    assert "expected 'top-k', 'all' or comma-separated" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["score", "metrics"])
def test_help_ends_with_an_example(command):
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command").choices[command]
    help_text = sub.format_help()
    assert "example:" in help_text
    assert help_text.rstrip().splitlines()[-1].strip().startswith(f"lad {command} ")
