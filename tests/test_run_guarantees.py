"""Issue 31's classes on the run side, each closed by one rule: a harness audit lists only folders
inside itself (lad.run.audits.audit_folders), and a repetition penalty the logits cannot take is
refused before any model work (lad.backends.checkpoint.check_repetition_penalty)."""

from __future__ import annotations

import json
import re

import pytest

from lad.cli import main


def _audit(folder, listed: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    audit = {"format": "lad-harness-audit/1", "tasks": {"t": {"4": {"folder": listed}}}}
    (folder / "lad_audit.json").write_text(json.dumps(audit))


@pytest.mark.parametrize("listed", ["../elsewhere", "/etc", "link", "", "a/\u0000", "."])
def test_an_audit_may_not_point_outside_itself(tmp_path, capsys, listed):
    (tmp_path / "elsewhere").mkdir()
    audit = tmp_path / "audit"
    _audit(audit, listed)
    (audit / "link").symlink_to(tmp_path / "elsewhere")
    assert main(["report", str(audit), "--out", str(tmp_path / "r")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "outside the audit's folder" in err[0], err


@pytest.mark.parametrize("tasks", [[], {"t": ["4"]}, {"t": None}, "t"])
def test_an_audit_whose_tasks_are_not_objects_is_one_error_line(tmp_path, capsys, tasks):
    audit = tmp_path / "audit"
    audit.mkdir()
    (audit / "lad_audit.json").write_text(
        json.dumps({"format": "lad-harness-audit/1", "tasks": tasks})
    )
    assert main(["report", str(audit), "--out", str(tmp_path / "r")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "'tasks' must be an object of objects" in err[0], err


@pytest.mark.parametrize("entry", [3, None, {"folder": 1}, {}])
def test_an_audit_entry_without_a_folder_name_is_one_error_line(tmp_path, capsys, entry):
    audit = tmp_path / "audit"
    audit.mkdir()
    tasks = {"t": {"4": entry}}
    (audit / "lad_audit.json").write_text(
        json.dumps({"format": "lad-harness-audit/1", "tasks": tasks})
    )
    assert main(["report", str(audit), "--out", str(tmp_path / "r")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "must be an object with a 'folder'" in err[0], err


@pytest.mark.parametrize("penalty", ["1e308", "1e-300", "inf"])
def test_a_penalty_the_logits_cannot_take_is_refused_before_the_model(tmp_path, capsys, penalty):
    out = tmp_path / "run"
    assert main(["eval", "--repetition-penalty", penalty, "--out", str(out), "-q"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--repetition-penalty must be a number > 0" in err[0], err
    assert not out.exists()  # refused before the run directory or the model


def test_a_calibration_file_mixing_questions_and_captions_is_refused_before_the_run(
    tmp_path, capsys
):
    """Caption items evaluated, a calibration file whose items are partly questions: refused as
    one line before the run begins (it was refused only after the model loaded)."""
    for name, split in (("ev", "eval"), ("cal", "calibration")):
        argv = ["data", "shapes", "--items", "5", "-n", "2", "--split", split]
        assert main([*argv, "--out", str(tmp_path / name)]) == 0
    cal = tmp_path / "cal" / "items.jsonl"
    rows = [json.loads(line) for line in cal.read_text().splitlines()]
    rows[0]["question"] = "Which picture shows two shapes?"
    cal.write_text("".join(json.dumps(row) + "\n" for row in rows))
    capsys.readouterr()
    argv = ["eval", "--data", str(tmp_path / "ev" / "items.jsonl"), "--calibration-data", str(cal)]
    assert main([*argv, "-n", "2", "--quiet", "--out", str(tmp_path / "run")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "holds question and caption items but --data" in err[0], err
    assert not (tmp_path / "run").exists()


def test_eval_top_k_above_a_hub_models_layers_is_refused_before_any_record(
    tmp_path, capsys, monkeypatch
):
    """A model whose layers preflight cannot read (a hub id) is checked once it loads, before
    its first record: K > L was refused only at scoring, after every stage had run."""
    import lad.run.preflight

    monkeypatch.setattr(lad.run.preflight, "model_num_layers", lambda model: None)
    out = tmp_path / "r"
    argv = ["eval", "--items", "2", "--num-shuffles", "1", "--top-k", "99", "--quiet"]
    assert main([*argv, "--out", str(out)]) == 1
    assert re.fullmatch(
        r"Error: --top-k 99 is more than the \d+ layers of demo\n", capsys.readouterr().err
    )
    assert not list(out.glob("*.jsonl")) or all(f.stat().st_size == 0 for f in out.glob("*.jsonl"))
