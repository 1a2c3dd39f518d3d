"""`lad eval` end to end on a tiny LLaVA: files, resume, reruns, bad input, report, CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lad.cli import main
from lad.data.items import read_items, write_items
from lad.data.shapes import build_shapes, shapes_vocabulary
from lad.errors import CalibrationError, DataError, RunError
from lad.evaluate import evaluate
from lad.run.config import EvalConfig
from lad.testing.tiny import build_tiny_model
from tests.runfiles import comparable, small_config

N = 3
RUN_FILES = (
    "run.json",
    "calibration.jsonl",
    "calibration.json",
    "records.jsonl",
    "perm_records.jsonl",
    "blank_records.jsonl",
    "predictions.jsonl",
    "metrics.json",
)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("tiny") / "llava"
    return str(build_tiny_model("llava", path, words=shapes_vocabulary()))


@pytest.fixture(scope="module")
def bench(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("bench")
    kw = {"num_candidates": N, "setting": "random", "seed": 1, "image_size": 32}
    data = build_shapes(root / "eval", items=4, split="eval", **kw)
    cal = build_shapes(root / "cal", items=2, split="calibration", **kw)
    return data, cal


def _config(tiny: str, bench: tuple[Path, Path], **kw) -> EvalConfig:
    return small_config(tiny, bench, **{"num_candidates": N, **kw})


@pytest.fixture(scope="module")
def full_run(tiny, bench, tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("runs") / "full"
    evaluate(_config(tiny, bench), run)
    return run


def test_eval_writes_every_file(full_run):
    for name in RUN_FILES:
        assert (full_run / name).stat().st_size > 0, name
    metrics = json.loads((full_run / "metrics.json").read_text())
    assert metrics["num_candidates"] == N
    assert metrics["num_items"] == 4 and metrics["num_shuffles"] == 2
    assert set(metrics["methods"]) == {
        "vanilla",
        "pride",
        "blank",
        "lad",
        "attn",
        "attn-purified",
        "perm-avg",
    }
    assert metrics["methods"]["perm-avg"]["forward_passes_per_item"] == N
    assert metrics["methods"]["lad"]["forward_passes_per_item"] == 1
    lines = (full_run / "records.jsonl").read_text().splitlines()
    assert len(lines) == 4 * 2
    preds = (full_run / "predictions.jsonl").read_text().splitlines()
    assert len(preds) == 4 * 2 * 7
    report = full_run / "report"
    assert (report / "index.html").stat().st_size > 0
    for fig in ("confusion.png", "recall.png", "divergence.png", "bias.png"):
        assert (report / fig).stat().st_size > 1000, fig


def test_rerun_recomputes_nothing_and_rescoring_needs_no_model(full_run, tiny, bench, monkeypatch):
    before = {n: comparable(full_run / n) for n in RUN_FILES}

    def no_model(*a, **k):
        raise AssertionError("a finished run must not load the model again")

    monkeypatch.setattr("lad.backends.load_backend", no_model)
    evaluate(_config(tiny, bench), full_run)
    after = {n: comparable(full_run / n) for n in RUN_FILES}
    assert before == after


def test_calibration_records_the_default_preprocessing_and_an_older_run_rescores_unchanged(
    full_run, tiny, bench, tmp_path, monkeypatch
):
    import shutil

    calibration = json.loads((full_run / "calibration.json").read_text())
    assert calibration["preprocessing"] == {
        "chat_template_sha256": None,
        "image_size": None,
        "image_options": {},
    }
    # A run directory whose calibration.json predates "preprocessing": rescored without the
    # model, every file as a run made now (calibration.json gains the key, nothing else changes).
    run = tmp_path / "older"
    shutil.copytree(full_run, run)
    del calibration["preprocessing"]
    (run / "calibration.json").write_text(json.dumps(calibration, indent=1) + "\n")

    def no_model(*a, **k):
        raise AssertionError("rescoring must not load the model")

    monkeypatch.setattr("lad.backends.load_backend", no_model)
    evaluate(_config(tiny, bench), run)
    for name in RUN_FILES:
        assert comparable(run / name) == comparable(full_run / name), name


def test_wall_time_per_stage_is_recorded_and_a_rescoring_adds_none(full_run, tiny, bench, tmp_path):
    import shutil

    timing = json.loads((full_run / "run.json").read_text())["timing"]
    assert set(timing) == {"model_load", "calibration", "evaluation", "perm-avg", "blank"}
    assert all(isinstance(s, float) and s > 0 for s in timing.values())
    metrics = json.loads((full_run / "metrics.json").read_text())
    scoring = metrics["timing"].pop("scoring")
    assert metrics["timing"] == timing and 0 <= scoring < 60
    run = tmp_path / "copy"
    shutil.copytree(full_run, run)
    evaluate(_config(tiny, bench, methods=("vanilla", "lad")), run)  # only rescores
    assert json.loads((run / "run.json").read_text())["timing"] == timing


def test_interrupted_run_resumes_to_identical_files(full_run, tiny, bench, tmp_path, monkeypatch):
    import lad.run.stages as ev

    real = ev._records
    calls: list[int] = []

    def interrupt_after_three(backend, requests, config):
        calls.append(len(requests))
        for i, rec in enumerate(real(backend, requests, config)):
            if i == 3:
                raise KeyboardInterrupt
            yield rec

    run = tmp_path / "run"
    monkeypatch.setattr(ev, "_records", interrupt_after_three)
    with pytest.raises(KeyboardInterrupt):
        evaluate(_config(tiny, bench), run)
    # An interruption mid-line leaves a partial last line; resume must drop it.
    with (run / "calibration.jsonl").open("a") as f:
        f.write('{"item": "half a rec')
    monkeypatch.setattr(ev, "_records", lambda b, r, c: (calls.append(len(r)), real(b, r, c))[1])
    evaluate(_config(tiny, bench), run)
    # calibration: 2 items × 3 shifts = 6 requests; 3 made before the interruption, of which
    # the whole batches (2) are kept, so the resumed call makes the other 4; then the 8
    # evaluation requests, perm-avg's 12 shifts and blank's 8 blank prompts.
    assert calls == [6, 4, 8, 12, 8]
    for name in RUN_FILES:
        assert comparable(run / name) == comparable(full_run / name), name


def test_rerun_with_other_arguments_names_the_argument(full_run, tiny, bench):
    with pytest.raises(RunError, match="--num-shuffles"):
        evaluate(_config(tiny, bench, num_shuffles=3), full_run)


def test_scoring_arguments_may_change_on_rerun(full_run, tiny, bench, tmp_path):
    import shutil

    run = tmp_path / "copy"
    shutil.copytree(full_run, run)
    result = evaluate(_config(tiny, bench, methods=("vanilla", "lad"), top_k=1), run)
    assert set(result.metrics["methods"]) == {"vanilla", "lad"}


def test_num_candidates_mismatch_names_the_line(tiny, bench, tmp_path):
    with pytest.raises(
        DataError, match=r"items.jsonl:1: .* has 3 images but --num-candidates is 4"
    ):
        evaluate(_config(tiny, bench, num_candidates=4), tmp_path / "run")


def test_missing_image_is_named(tiny, bench, tmp_path):
    items = read_items(bench[0])
    items[1].images[0] = tmp_path / "gone.png"
    bad = tmp_path / "bad.jsonl"
    write_items(bad, items)
    with pytest.raises(DataError, match=r"gone\.png"):
        evaluate(_config(tiny, bench, data=str(bad)), tmp_path / "run")


def test_corrupt_image_is_named(tiny, bench, tmp_path):
    items = read_items(bench[0])
    broken = tmp_path / "broken.png"
    broken.write_bytes(b"\x89PNG\r\n\x1a\n not an image")
    items[0].images[2] = broken
    bad = tmp_path / "bad.jsonl"
    write_items(bad, items)
    with pytest.raises(DataError, match=r"broken\.png"):
        evaluate(_config(tiny, bench, data=str(bad)), tmp_path / "run")


def test_calibration_from_another_model_or_n_is_refused(full_run, tiny, bench, tmp_path):
    cal = json.loads((full_run / "calibration.json").read_text())
    other_model = tmp_path / "other-model.json"
    other_model.write_text(json.dumps({**cal, "model": "someone/else"}))
    kw = {"calibration_data": None}
    with pytest.raises(CalibrationError, match="someone/else"):
        evaluate(_config(tiny, bench, calibration=str(other_model), **kw), tmp_path / "a")
    four = build_shapes(tmp_path / "n4", num_candidates=4, items=3, split="eval", image_size=32)
    with pytest.raises(CalibrationError, match="4"):
        evaluate(
            _config(
                tiny,
                bench,
                data=str(four),
                num_candidates=4,
                calibration=str(full_run / "calibration.json"),
                **kw,
            ),
            tmp_path / "b",
        )


def test_cli_eval_and_report(tiny, bench, tmp_path, capsys):
    out = tmp_path / "cli-run"
    args = ["eval", "--model", tiny, "--data", str(bench[0]), "--calibration-data", str(bench[1])]
    args += ["-n", str(N), "--calibration-items", "2", "--num-shuffles", "2", "--quiet"]
    args += ["--methods", "vanilla,pride,lad,attn", "--device", "cpu", "--out", str(out)]
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert "lad" in printed and str(out) in printed and "index.html" in printed
    assert main(["report", str(out), "--out", str(tmp_path / "rep")]) == 0
    assert (tmp_path / "rep" / "index.html").is_file()


def test_cli_reports_bad_input_without_traceback(tmp_path, capsys):
    assert main(["eval", "--data", str(tmp_path / "nope.jsonl"), "--out", str(tmp_path / "r")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("Error: ") and "nope.jsonl" in err
