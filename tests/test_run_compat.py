"""Run directories across lad versions and writers, read through the one RunDir.

tests/data/run-d76e89a holds a run made by lad at d76e89a (before the package layout; its
README says how), on another machine: resuming it here gives the same items, orderings and
choices, and floats equal to float tolerance (another CPU's kernels round the last digits
otherwise; docs/formats.md, "What is byte-identical"). On one machine, a run cut the same way and
resumed gives the bytes of the run made uninterrupted. `lad report` and
`lad ablate` accept exactly the same run directories — lad eval's, the harness's (with and without
the model's evidence), an older harness folder without "format" — and refuse the same tampered
ones.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from typing import Any

import pytest

from lad.cli import main
from lad.core.methods import MethodOptions
from lad.core.scoring import score_records
from lad.errors import LadError
from lad.harness.audit import write_audit_folder, write_rows_audit
from lad.harness.runner import CalibrationSource, TaskResult
from lad.outputs.ablate import ablate, load_runs
from lad.outputs.report import write_report
from lad.run.rundir import RunDir

FIXTURE = Path(__file__).parent / "data" / "run-d76e89a"
ARGS = ["--items", "6", "--num-shuffles", "2", "--calibration-items", "2", "--batch-size", "2"]
ARGS += ["--methods", "vanilla,pride,lad,attn,attn-purified,perm-avg", "-q"]
SAME_BYTES = (
    "records.jsonl",
    "perm_records.jsonl",
    "calibration.jsonl",
    "calibration.json",
    "predictions.jsonl",
)


# Across machines the same model's floats differ in the 7th significant digit (log-probs ~1e-6,
# attention ~1e-7, measured on two CPUs): far inside this, far outside any choice's margin.
TOLERANCE = 1e-5


def _same(made: Any, expected: Any, where: str) -> None:
    """`made` equals `expected`: strings, whole numbers and structure exactly, floats to
    TOLERANCE (relative or absolute)."""
    if isinstance(expected, float) and isinstance(made, (int, float)):
        assert math.isclose(made, expected, rel_tol=TOLERANCE, abs_tol=TOLERANCE), where
    elif isinstance(expected, dict):
        assert isinstance(made, dict) and made.keys() >= expected.keys(), where
        for key, value in expected.items():
            _same(made[key], value, f"{where}.{key}")
    elif isinstance(expected, list):
        assert isinstance(made, list) and len(made) == len(expected), where
        for i, (a, b) in enumerate(zip(made, expected, strict=True)):
            _same(a, b, f"{where}[{i}]")
    else:
        assert type(made) is type(expected) and made == expected, where


def _json_lines(path: Path) -> list[Any]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _interrupted(finished: Path, run: Path) -> Path:
    """`finished` as an interrupted session leaves it (as the fixture's partial/): records cut
    after 5 of their 12 lines and half of the sixth, nothing made after them."""
    shutil.copytree(finished, run)
    for later in ("calibration.json", "perm_records.jsonl", "predictions.jsonl", "metrics.json"):
        (run / later).unlink()
    shutil.rmtree(run / "report", ignore_errors=True)
    lines = (run / "records.jsonl").read_bytes().splitlines(keepends=True)
    (run / "records.jsonl").write_bytes(b"".join(lines[:5]) + lines[5][: len(lines[5]) // 2])
    return run


@pytest.fixture(scope="module")
def resumed(tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("compat") / "run"
    shutil.copytree(FIXTURE / "partial", run)
    assert main(["eval", *ARGS, "--out", str(run)]) == 0
    return run


def test_resuming_a_run_made_by_d76e89a_gives_its_results(resumed):
    for name in SAME_BYTES:
        made, expected = resumed / name, FIXTURE / "expected" / name
        if name.endswith(".jsonl"):
            _same(_json_lines(made), _json_lines(expected), name)
        else:
            _same(json.loads(made.read_text()), json.loads(expected.read_text()), name)
    made = json.loads((resumed / "metrics.json").read_text())
    expected = json.loads((FIXTURE / "expected" / "metrics.json").read_text())
    for metrics in (made, expected):
        metrics.pop("timing"), metrics.pop("source", None)
    # Every number d76e89a wrote is there; keys lad has added since (the audit) come beside.
    _same(made, expected, "metrics.json")


def test_a_run_resumed_on_its_machine_gives_the_uninterrupted_bytes(tmp_path):
    whole = tmp_path / "whole"
    assert main(["eval", *ARGS, "--out", str(whole)]) == 0
    again = _interrupted(whole, tmp_path / "again")
    assert main(["eval", *ARGS, "--out", str(again)]) == 0
    for name in SAME_BYTES:
        assert (again / name).read_bytes() == (whole / name).read_bytes(), name


def _accepted(run: Path, out: Path) -> tuple[bool, bool]:
    """Whether lad report and lad ablate accept `run` (each raising a LadError if not)."""
    verdicts = []
    for read in (lambda: write_report([run], out), lambda: ablate(load_runs([run]))):
        try:
            read()
            verdicts.append(True)
        except LadError:
            verdicts.append(False)
    return verdicts[0], verdicts[1]


def _made_by_d76e89a(run: Path) -> Path:
    """The fixture's run as d76e89a finished it (its metrics.json has no "source")."""
    shutil.copytree(FIXTURE / "partial", run)
    for made in (FIXTURE / "expected").iterdir():
        shutil.copyfile(made, run / made.name)
    return run


def _harness_folder(resumed: Path, folder: Path, with_evidence: bool = True) -> Path:
    """What --model lad writes for one (task, N): through lad.harness.runner."""
    run = RunDir(resumed)
    records, calibration = run.records, run.calibration()
    methods = ["vanilla", "lad"] if with_evidence else ["vanilla"]
    scored = score_records(
        records, methods, calibration if with_evidence else None, MethodOptions()
    )
    source = CalibrationSource("file", path="calibration.json") if with_evidence else None
    result = TaskResult(
        "task",
        records,
        scored,
        calibration if with_evidence else None,
        source or CalibrationSource("none"),
    )
    write_audit_folder(result, folder, {"model": "demo", "labels": "digits", "method": "lad"})
    return folder


def _rows_folder(resumed: Path, folder: Path) -> Path:
    """What lad harness audit writes for any model's logged answers."""
    records = RunDir(resumed).records
    rows = [
        {"item": i, "ordering": int(o), "order": order.tolist(), "answer": int(a), "prediction": 0}
        for i, o, order, a in zip(
            records.items, records.ordering, records.order, records.answer, strict=True
        )
    ]
    write_rows_audit({"task": rows}, folder, "samples.jsonl")
    return folder / "lad_audit" / "task" / f"n{records.num_candidates}"


def _pre_format_harness(folder: Path) -> Path:
    """A harness folder as lad wrote it before run.json had a "format"."""
    run = json.loads((folder / "run.json").read_text())
    (folder / "run.json").write_text(json.dumps({"arguments": run["arguments"]}, indent=2))
    metrics = json.loads((folder / "metrics.json").read_text())
    metrics.pop("source")
    (folder / "metrics.json").write_text(json.dumps(metrics, indent=2))
    return folder


def test_report_and_ablate_accept_the_same_run_directories(resumed, tmp_path):
    accepted = {
        "lad eval's": resumed,
        "made by d76e89a": _made_by_d76e89a(tmp_path / "old"),
        "the harness's": _harness_folder(resumed, tmp_path / "harness"),
        "the harness's, no calibration": _harness_folder(resumed, tmp_path / "none", False),
        "any model's answers": _rows_folder(resumed, tmp_path / "rows"),
        "a harness folder without format": _pre_format_harness(
            _harness_folder(resumed, tmp_path / "older")
        ),
    }
    for what, run in accepted.items():
        assert _accepted(run, tmp_path / "out") == (True, True), what


def _cut_record(run: Path) -> None:
    lines = (run / "records.jsonl").read_text().splitlines(keepends=True)
    (run / "records.jsonl").write_text("".join(lines[:3] + lines[4:]))


def _other_run_json(run: Path) -> None:
    stored = json.loads((run / "run.json").read_text())
    stored["arguments"]["seed"] = 7
    (run / "run.json").write_text(json.dumps(stored, indent=2))


def test_report_and_ablate_refuse_the_same_tampered_runs(resumed, tmp_path):
    for tamper in (_cut_record, _other_run_json):
        run = shutil.copytree(resumed, tmp_path / tamper.__name__)
        tamper(run)
        assert _accepted(run, tmp_path / "out") == (False, False), tamper.__name__


def test_a_record_deleted_is_one_error_line_for_every_reader(resumed, tmp_path, capsys):
    run = shutil.copytree(resumed, tmp_path / "cut")
    _cut_record(run)
    for command in (["ablate", str(run), "--out", str(tmp_path / "a")], ["report", str(run)]):
        assert main(command) == 1
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "orderings the other items have" in err[0], (command, err)


def test_another_runs_run_json_is_refused_by_the_report(resumed, tmp_path, capsys):
    run = shutil.copytree(resumed, tmp_path / "swapped")
    _other_run_json(run)
    assert main(["report", str(run)]) == 1
    err = capsys.readouterr().err
    assert "computed from other records or arguments" in err and "metrics.json" in err
