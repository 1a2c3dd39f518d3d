"""lad inside the REAL lmms-eval (issue 25): `python -m lmms_eval --model lad` on the embedded
demo model and a local parquet in MuirBench's published schema, against lad's own `lad eval` and
`lad metrics` on the same items.

Needs the extra (`pip install -e ".[lmms-eval]"`); .ci/run installs it in a venv of its own and
runs this file there (docs/harness.md says why). Skipped, saying so, where lmms-eval is absent.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("lmms_eval", reason="lmms-eval not installed (pip install -e '.[lmms-eval]')")

from lad.core.predictions import read_predictions
from lad.core.records import read_records
from lad.data.items import cyclic_shift, read_items
from tests.harness_fixtures import blink_local_task, local_task, shapes_blink, shapes_muirbench

ROOT = Path(__file__).resolve().parents[1]
N = 4
EVAL_ITEMS = 6
CAL_ITEMS = 3
PLAIN, CIRCULAR = "muir_local", "muir_local_circular"


def _run(*args: str, cwd: Path) -> str:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TOKENIZERS_PARALLELISM": "false"}
    done = subprocess.run(
        [sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout + done.stderr


def _lad(*args: str, cwd: Path) -> str:
    """A lad command in this process (its output), as `python -m lad` runs it."""
    from lad.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(args))
    assert code == 0, err.getvalue()
    return out.getvalue()


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One lmms-eval CLI run of --model lad on MuirBench's own task and lad's circular variant,
    both on a local parquet, and the same parquet through `lad data muirbench` and `lad eval`."""
    import lmms_eval

    from lad.harness import tasks_folder

    root = tmp_path_factory.mktemp("harness")
    parquet = shapes_muirbench(root / "eval", items=EVAL_ITEMS, split="eval", n=N, extras=True)
    cal_parquet = shapes_muirbench(root / "cal", items=CAL_ITEMS, split="calibration", n=N)
    muirbench_yaml = Path(lmms_eval.__file__).parent / "tasks/muirbench/muirbench.yaml"
    tasks = local_task(
        root / "tasks", parquet, PLAIN, muirbench_yaml, "lmms_eval.tasks.muirbench.utils"
    )
    local_task(root / "tasks", parquet, CIRCULAR, tasks_folder() / "muirbench_circular.yaml")
    # lad's own path: convert, calibrate on held-out questions, evaluate.
    for name, path in (("eval", parquet), ("cal", cal_parquet)):
        _lad("data", "muirbench", str(path), "--calibration-items", "0",
             "--out", str(root / f"{name}.jsonl"), cwd=root)  # fmt: skip
    calibration = root / "calibration.json"
    common = ("--model", "demo", "--labels", "upper", "--device", "cpu", "--quiet")
    _lad("calibrate", *common, "--data", str(root / "cal.jsonl"), "--out", str(calibration),
         cwd=root)  # fmt: skip
    out = root / "lmms"
    log = _run(
        "-m", "lmms_eval", "--model", "lad",
        "--model_args", f"model=demo,method=lad,calibration={calibration},output={out}/lad",
        "--tasks", f"{PLAIN},{CIRCULAR}", "--include_path", str(tasks),
        "--output_path", str(out), "--log_samples", "--device", "cpu",
        cwd=root,
    )  # fmt: skip
    (root / "lmms.log").write_text(log)
    # lmms-eval logs an error and exits 0; its results file is the sign it finished.
    assert list(out.rglob("*_results.json")), log[-3000:]
    # The same items through lad eval: the identity order, and all N cyclic shifts.
    items = root / "eval.jsonl"
    run_args = (*common, "--data", str(items), "--calibration", str(calibration), "-n", str(N))
    _lad("eval", *run_args, "--methods", "vanilla,lad", "--num-shuffles", "1",
         "--out", str(root / "eval-plain"), cwd=root)  # fmt: skip
    orders = root / "cyclic.jsonl"
    with orders.open("w") as f:
        for it in read_items(items):
            for s in range(N):
                f.write(json.dumps({"item": it.id, "order": cyclic_shift(N, s)}) + "\n")
    _lad("eval", *run_args, "--methods", "vanilla,lad,perm-avg", "--orders", str(orders),
         "--out", str(root / "eval-cyclic"), cwd=root)  # fmt: skip
    return {"root": root, "out": out, "lad": out / "lad", "log": root / "lmms.log", "tasks": tasks}


def _samples(out: Path, task: str) -> list[dict]:
    (path,) = [p for p in out.rglob(f"*_samples_{task}.jsonl")]
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _results(out: Path) -> dict:
    (path,) = [p for p in out.rglob("*_results.json")]
    return json.loads(path.read_text())["results"]


def _chosen(run_dir: Path, method: str) -> dict[tuple[str, int], int]:
    return {
        (p.item, p.ordering): p.prediction
        for p in read_predictions(run_dir / "predictions.jsonl")
        if p.method == method
    }


def _metrics(run_dir: Path) -> dict:
    text = _lad(
        "metrics", "--records", str(run_dir / "records.jsonl"),
        "--predictions", str(run_dir / "predictions.jsonl"), "--json", cwd=run_dir,
    )  # fmt: skip
    return json.loads(text[text.index("{") :])


@pytest.mark.parametrize(("task", "lad_run"), [(PLAIN, "eval-plain"), (CIRCULAR, "eval-cyclic")])
def test_answers_equal_lad_eval(run: dict[str, Path], task: str, lad_run: str) -> None:
    """Each picture question's reply in lmms-eval's samples is the letter of the option lad
    eval's LAD chooses for the same item (converted by lad data muirbench, context pictures
    included) in the same order; the records are lad eval's."""
    ours = run["lad"] / task / f"n{N}"
    theirs = run["root"] / lad_run
    mine, ref = read_records(ours / "records.jsonl"), read_records(theirs / "records.jsonl")
    where = {k: i for i, k in enumerate(ref.keys())}
    asked = mine.keys()  # (item, ordering) of each record
    assert sorted(asked) == sorted(ref.keys())  # the same requests, context questions included
    assert any(k[0].startswith("muirbench-context-") for k in asked)
    rows = [where[k] for k in asked]
    assert np.array_equal(mine.order, ref.order[rows])
    assert np.array_equal(mine.answer, ref.answer[rows])
    assert np.allclose(mine.logprobs, ref.logprobs[rows], atol=1e-5)
    assert np.allclose(mine.attention, ref.attention[rows], rtol=1e-4, atol=1e-7)
    lad_eval = _chosen(theirs, "lad")
    samples = _samples(run["out"], task)
    replied = {}
    for sample in samples:
        doc = sample["muirbench_score_overall"]
        ordering = sample["lad_acc"]["ordering"] if task == CIRCULAR else 0
        replied[(f"muirbench-{doc['idx']}", ordering)] = sample["filtered_resps"]
    for key, position in lad_eval.items():
        assert replied.pop(key) == "ABCD"[position], key
    if task == PLAIN:  # the question with text options was answered by generation
        assert list(replied) == [("muirbench-text-0", 0)]
        assert isinstance(replied["muirbench-text-0", 0], str)
        assert "1 answered by plain generation" in run["log"].read_text()
    else:  # the circular variant keeps picture questions only
        assert replied == {}
    # vanilla side by side, from the same passes
    assert _chosen(ours, "vanilla") == _chosen(theirs, "vanilla")


def test_audit_numbers_equal_lad_metrics(run: dict[str, Path]) -> None:
    """lad_audit.json (--model lad: vanilla and LAD side by side) holds lad metrics' numbers of
    lad eval's run on the same orderings; lmms-eval's own table holds the same Acc/RStd/Cons.,
    and MuirBench's own metric equals lad's accuracy."""
    audit = json.loads((run["lad"] / "lad_audit.json").read_text())
    assert audit["format"] == "lad-harness-audit/1"
    reference = _metrics(run["root"] / "eval-cyclic")["methods"]
    entry = audit["tasks"][CIRCULAR][str(N)]
    assert entry["num_items"] == EVAL_ITEMS + 2 and entry["num_shuffles"] == N
    assert entry["calibration"]["kind"] == "file"
    for method in ("vanilla", "lad"):
        got = entry["methods"][method]
        for key in ("acc", "acc_std", "rstd", "cons", "recall_by_position", "flip_rate"):
            assert got[key] == pytest.approx(reference[method][key], abs=1e-9), (method, key)
        assert got["ci"] == reference[method]["ci"], method
    table = _results(run["out"])[CIRCULAR]
    for name in ("acc", "rstd", "cons"):
        assert table[f"lad_{name},flexible-extract"] == pytest.approx(reference["lad"][name])
    for name, key in (("flip", "flip_rate"), ("circular", "circular_acc")):
        assert table[f"lad_{name},flexible-extract"] == pytest.approx(reference["lad"][key])
    assert 100 * table["muirbench_score_overall,flexible-extract"] == pytest.approx(
        reference["lad"]["acc"]
    )
    plain = audit["tasks"][PLAIN][str(N)]["methods"]
    plain_reference = _metrics(run["root"] / "eval-plain")["methods"]
    for method in ("vanilla", "lad"):
        for key in ("acc", "rstd", "recall_by_position", "selection_by_position"):
            assert plain[method][key] == pytest.approx(plain_reference[method][key])


def test_audit_of_logged_samples_and_report(run: dict[str, Path]) -> None:
    """`lad harness audit` on lmms-eval's output folder gives the replies' metrics (here LAD's),
    and `lad report` reads both audits."""
    out = run["root"] / "samples-audit"
    _lad("harness", "audit", str(run["out"]), "--out", str(out), cwd=run["root"])
    audit = json.loads((out / "lad_audit.json").read_text())
    assert list(audit["tasks"]) == [CIRCULAR]  # MuirBench's own task carries no audit rows
    got = audit["tasks"][CIRCULAR][str(N)]["methods"]["model"]
    reference = _metrics(run["root"] / "eval-cyclic")["methods"]["lad"]
    for key in ("acc", "acc_std", "rstd", "cons", "recall_by_position", "selection_by_position"):
        assert got[key] == pytest.approx(reference[key]), key
    for key in ("flip_rate", "circular_acc", "any_order_acc", "errors_due_to_order"):
        assert got[key] == pytest.approx(reference[key]), key
    assert got["ci"] == reference["ci"] and got["position_test"] == reference["position_test"]
    for folder in (out, run["lad"]):
        text = _lad("report", str(folder), "--out", str(folder / "report"), cwd=run["root"])
        assert "report:" in text and (folder / "report/index.html").is_file()


def test_calibration_of_another_prompt_is_refused(run: dict[str, Path]) -> None:
    """A calibration fitted under other labels is refused before any record is made, with the
    check lad uses everywhere."""
    from lad.harness.runner import HarnessOptions, PictureScorer

    calibration = run["root"] / "calibration.json"
    scorer = PictureScorer(HarnessOptions(calibration=str(calibration), labels="digits"))
    from lad.errors import CalibrationError, LadError

    with pytest.raises(CalibrationError, match=r"label.*check_calibration=False"):
        scorer.calibrated(CIRCULAR, N, [])
    # The switch the refusal names is one of --model lad's model_args (lmms-eval hands it over
    # as text): the same file is then used, checked for N and the layer count only.
    from lad.harness.model import LadModel

    lenient = LadModel(calibration=str(calibration), labels="digits", check_calibration="False")
    debiaser, source = lenient.scorer.calibrated(CIRCULAR, N, [])
    assert debiaser is not None and source.kind == "file"
    # An unknown model_arg stops it before the model loads, as in lm-eval and Inspect (a null,
    # e.g. lmms-eval's --max_batch_size left unset, passes).
    with pytest.raises(LadError, match=r"unknown --model_args \['soup'\]; --model lad takes "):
        LadModel(calibration=str(calibration), soup="1", max_batch_size=None)


def test_calibration_docs_excluded_with_offset(run: dict[str, Path]) -> None:
    """calibration_docs=2 fits on the circular task's first two questions (documents 0 and N,
    their unshifted forms) and says which --offset leaves all their shifts out; with it, none of
    them is scored, and the audit says so. method=perm-avg (N passes, no calibration needed)
    answers as lad eval's perm-avg, with LAD beside it."""
    out = run["root"] / "docs-calibrated"
    log = _run(
        "-m", "lmms_eval", "--model", "lad",
        "--model_args", f"model=demo,method=perm-avg,calibration_docs=2,output={out}/lad",
        "--tasks", CIRCULAR, "--include_path", str(run["tasks"]), "--offset", str(2 * N),
        "--output_path", str(out), "--log_samples", "--device", "cpu",
        cwd=run["root"],
    )  # fmt: skip
    assert list(out.rglob("*_results.json")), log[-3000:]
    entry = json.loads((out / "lad/lad_audit.json").read_text())["tasks"][CIRCULAR][str(N)]
    first = [f"muirbench-shapes-eval-random-n{N}-0000{k}" for k in range(2)]
    assert entry["calibration"] == {
        "kind": "docs", "doc_ids": [0, N], "items": first, "exclude_offset": 2 * N,
    }  # fmt: skip
    assert entry["num_items"] == EVAL_ITEMS + 2 - 2
    assert "none of them scored" in log
    records = read_records(out / f"lad/{CIRCULAR}/n{N}/records.jsonl")
    assert not set(first) & set(records.items.tolist())
    assert set(entry["methods"]) == {"vanilla", "perm-avg", "lad"}
    perm = _chosen(out / f"lad/{CIRCULAR}/n{N}", "perm-avg")
    reference = _chosen(run["root"] / "eval-cyclic", "perm-avg")
    assert perm == {k: v for k, v in reference.items() if k in perm} and len(perm) == len(records)
    for sample in _samples(out, CIRCULAR):
        row = sample["lad_acc"]
        assert sample["filtered_resps"] == "ABCD"[perm[(row["item"], row["ordering"])]]


def test_blink_circular_equals_lad_data_blink_and_lad_eval(run: dict[str, Path]) -> None:
    """BLINK, a reference picture first and choices naming the candidates in reverse order: lad's
    circular variant under --model lad asks what `lad data blink` + `lad eval` ask, replies with
    the letter of the choice naming the picture LAD picks, and BLINK's own accuracy, lad_acc and
    the audit equal lad metrics' LAD accuracy."""
    from lad.harness import tasks_folder

    root, n, task = run["root"] / "blink", 3, "blink_local_circular"
    parquet = shapes_blink(root / "eval", items=4, split="eval", n=n)
    cal = shapes_blink(root / "cal", items=2, split="calibration", n=n)
    template = tasks_folder() / "blink_art_style_circular.yaml"
    tasks = blink_local_task(root / "tasks", parquet, task, template)
    for name, path in (("eval", parquet), ("cal", cal)):
        _lad("data", "blink", str(path), "--calibration-items", "0",
             "--out", str(root / f"{name}.jsonl"), cwd=root)  # fmt: skip
    common = ("--model", "demo", "--labels", "upper", "--device", "cpu", "--quiet")
    calibration = root / "calibration.json"
    _lad("calibrate", *common, "--data", str(root / "cal.jsonl"), "--out", str(calibration),
         cwd=root)  # fmt: skip
    out = root / "lmms"
    log = _run(
        "-m", "lmms_eval", "--model", "lad",
        "--model_args", f"model=demo,calibration={calibration},output={out}/lad",
        "--tasks", task, "--include_path", str(tasks), "--output_path", str(out),
        "--log_samples", "--device", "cpu", cwd=root,
    )  # fmt: skip
    assert list(out.rglob("*_results.json")), log[-3000:]
    orders = root / "cyclic.jsonl"
    with orders.open("w") as f:
        for it in read_items(root / "eval.jsonl"):
            for s in range(n):
                f.write(json.dumps({"item": it.id, "order": cyclic_shift(n, s)}) + "\n")
    _lad("eval", *common, "--data", str(root / "eval.jsonl"), "--calibration", str(calibration),
         "-n", str(n), "--methods", "vanilla,lad", "--orders", str(orders),
         "--out", str(root / "eval-cyclic"), cwd=root)  # fmt: skip
    ours, theirs = out / "lad" / task / f"n{n}", root / "eval-cyclic"
    mine, ref = read_records(ours / "records.jsonl"), read_records(theirs / "records.jsonl")
    assert sorted(mine.keys()) == sorted(ref.keys())
    where = {k: i for i, k in enumerate(ref.keys())}
    rows = [where[k] for k in mine.keys()]  # noqa: SIM118 (RecordSet.keys is a list)
    assert np.allclose(mine.logprobs, ref.logprobs[rows], atol=1e-5)
    lad_eval = _chosen(theirs, "lad")
    for sample in _samples(out, task):
        row = sample["lad_acc"]
        # position p shows image_{p + 2}, which the choices (in reverse) name with letter n-1-p
        position = lad_eval[(row["item"], row["ordering"])]
        assert sample["filtered_resps"] == "ABC"[n - 1 - position]
        assert row["prediction"] == position
    reference = _metrics(theirs)["methods"]["lad"]
    table = _results(out)[task]
    assert 100 * table["blink_acc,none"] == pytest.approx(reference["acc"])
    assert table["lad_rstd,none"] == pytest.approx(reference["rstd"])
    audit = json.loads((out / "lad/lad_audit.json").read_text())["tasks"][task][str(n)]
    assert audit["methods"]["lad"]["recall_by_position"] == pytest.approx(
        reference["recall_by_position"]
    )


def test_repeat_variant_loads_and_lad_refuses_it(tmp_path: Path) -> None:
    """lmms-eval loads a `_repeat` task (every shift twice); --model lad, greedy, refuses it with
    its reason (a sampling model's floor is what the variant measures)."""
    from lad.harness import tasks_folder

    parquet = shapes_muirbench(tmp_path / "eval", items=2, split="eval", n=N)
    task = "muir_local_circular_repeat"
    template = tasks_folder() / "muirbench_circular_repeat.yaml"
    tasks = local_task(tmp_path / "tasks", parquet, task, template)
    log = _run(
        "-m", "lmms_eval", "--model", "lad",
        "--model_args", f"model=demo,method=vanilla,output={tmp_path}/out/lad",
        "--tasks", task, "--include_path", str(tasks), "--output_path", str(tmp_path / "out"),
        "--device", "cpu", cwd=tmp_path,
    )  # fmt: skip
    assert f"{task}: asks each ordering twice (a *_circular_repeat task)" in log, log[-3000:]
