"""The harness's parts that need no lmms-eval: adapters, circular shifts, audit rows and metrics,
picture files, task YAMLs, options and `lad harness` (issue 25). Hand-worked cases; the real
harness is tests/test_harness.py."""

from __future__ import annotations

import importlib
import io
import json
import re
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from lad.cli import main
from lad.errors import LadError
from lad.harness import tasks_folder
from lad.harness.adapters import blink, muirbench, picture_choice
from lad.harness.audit import rows_metrics
from lad.harness.circular import _blink_shift, _muirbench_shift, audit_row, blink_positions
from lad.harness.pictures import PictureFiles
from lad.harness.runner import HarnessOptions

# Pictures are opaque to adapters: strings stand for them here.
MUIR = {
    "idx": "7",
    "question": "Which picture shows the same street as <image>?",
    "options": ["<image>", "<image>", "<image>"],
    "answer": "B",
    "image_list": ["q", "a", "b", "c"],
}
BLINK = {
    "idx": "val_Art_Style_3",
    "question": "Which image shares the style of the first image?",
    "choices": ["the third image", "the second image"],
    "answer": "(A)",
    "image_1": "ref",
    "image_2": "x",
    "image_3": "y",
    "image_4": None,
}


def test_muirbench_picture_question() -> None:
    choice = muirbench(MUIR)
    assert choice is not None
    assert choice.item == "muirbench-7"  # as lad data muirbench names it
    assert choice.question == MUIR["question"]  # <image> kept: the context picture's place
    assert choice.candidates == ["a", "b", "c"] and choice.context == ["q"]
    assert choice.answer == 1 and choice.replies == ["A", "B", "C"]
    assert choice.order == [0, 1, 2] and choice.ordering == 0


@pytest.mark.parametrize(
    "change",
    [
        {"options": ["<image>", "None of the choices provided", "<image>"]},  # a text option
        {"image_list": ["a", "b", "c"]},  # not one picture per <image> place
        {"question": "<image>"},  # nothing asked
        {"options": ["<image>"], "image_list": ["q", "a"]},  # one option
    ],
)
def test_muirbench_other_questions_are_not_picture_questions(change: dict) -> None:
    assert muirbench({**MUIR, **change}) is None


def test_blink_candidates_in_picture_order_reply_with_choice_letters() -> None:
    choice = blink(BLINK)
    assert choice is not None
    assert choice.item == "blink-val_Art_Style_3"
    assert choice.candidates == ["x", "y"] and choice.context == ["ref"]
    # (A) names the third image, shown second; the picture shown first is choice (B).
    assert choice.answer == 1 and choice.replies == ["B", "A"]


@pytest.mark.parametrize(
    "change",
    [
        {"choices": ["left", "right"]},
        {"choices": ["the second image", "the second image"]},
        {"choices": ["the first image", "the second image"]},  # the unnamed third is not first
        {"choices": ["the second image", "the fourth image"]},  # no fourth picture
    ],
)
def test_blink_other_questions_are_not_picture_questions(change: dict) -> None:
    assert blink({**BLINK, **change}) is None


def test_adapter_chosen_by_schema() -> None:
    assert picture_choice(MUIR).item == "muirbench-7"
    assert picture_choice(BLINK).item == "blink-val_Art_Style_3"
    assert picture_choice({"question": "q", "answer": "A"}) is None


def test_muirbench_cyclic_shift_by_hand() -> None:
    """Shift 1 shows original options 1, 2, 0 (lad's cyclic_shift); the answer (b) moves to A."""
    choice = muirbench(MUIR)
    doc = {**_muirbench_shift(dict(MUIR), choice, 1), "lad_item": choice.item, "lad_shift": 1}
    assert doc["image_list"] == ["q", "b", "c", "a"] and doc["answer"] == "A"
    shifted = muirbench(doc)
    assert shifted.item == "muirbench-7" and shifted.ordering == 1
    assert shifted.order == [1, 2, 0] and shifted.answer == 0
    assert shifted.original_candidates() == ["a", "b", "c"]
    assert shifted.order[shifted.answer] == choice.answer  # the same picture is right
    assert audit_row(doc, [0, 1, 2], "C") == {
        "item": "muirbench-7",
        "ordering": 1,
        "order": [1, 2, 0],
        "answer": 0,
        "prediction": 2,
    }
    assert audit_row(doc, [0, 1, 2], "")["prediction"] == -1


def test_blink_cyclic_shift_by_hand() -> None:
    """Shift 1 of [x, y] shows [y, x]: y (the answer) sits at image_2, which choice (B) names."""
    choice = blink(BLINK)
    doc = {**_blink_shift(dict(BLINK), choice, 1), "lad_item": choice.item, "lad_shift": 1}
    assert (doc["image_2"], doc["image_3"], doc["image_1"]) == ("y", "x", "ref")
    assert doc["answer"] == "(B)"
    shifted = blink(doc)
    assert shifted.candidates == ["y", "x"] and shifted.answer == 0
    assert shifted.original_candidates() == ["x", "y"]
    assert blink_positions(BLINK["choices"]) == [1, 0]
    row = audit_row(doc, blink_positions(doc["choices"]), "A")  # (A): the third image, at 1
    assert (row["answer"], row["prediction"], row["order"]) == (0, 1, [1, 0])


def _rows() -> list[dict]:
    """Two items, N = 2, each under both shifts; the model always answers position 0."""
    rows = []
    for item in ("a", "b"):
        for s, order in ((0, [0, 1]), (1, [1, 0])):
            answer = order.index(0)  # image 0 is right
            rows.append(
                {"item": item, "ordering": s, "order": order, "answer": answer, "prediction": 0}
            )
    return rows


def test_rows_metrics_by_hand() -> None:
    (n, metrics), *_ = rows_metrics(_rows()).items()
    m = metrics["methods"]["model"]
    assert n == 2 and metrics["num_items"] == 2 and metrics["num_shuffles"] == 2
    assert m["acc"] == 50.0 and m["acc_by_shuffle"] == [100.0, 0.0]
    assert m["acc_std"] == pytest.approx(np.std([100, 0], ddof=1))
    assert m["recall_by_position"] == [100.0, 0.0]
    assert m["rstd"] == pytest.approx(np.std([100, 0], ddof=1))
    assert m["cons"] == 0.0  # image 0 at shift 0, image 1 at shift 1
    assert m["selection_by_position"] == [100.0, 0.0]


def test_picture_files(tmp_path: Path) -> None:
    files = PictureFiles(tmp_path / "pictures")
    buffer = io.BytesIO()
    Image.new("RGB", (5, 3), (10, 20, 30)).save(buffer, format="JPEG")
    data = buffer.getvalue()
    path = files.path({"bytes": data, "path": "x.jpg"})
    assert path.suffix == ".jpg" and path.read_bytes() == data  # unchanged bytes
    assert files.path({"bytes": data, "path": None}) == path  # named by content
    picture = Image.new("RGB", (4, 4), (200, 0, 0))
    png = files.path(picture)
    with Image.open(png) as im:
        assert im.format == "PNG" and np.array_equal(np.asarray(im), np.asarray(picture))


def test_task_yamls_name_functions_that_exist() -> None:
    yamls = sorted(tasks_folder().glob("*.yaml"))
    assert {p.stem for p in yamls} >= {"muirbench_circular", "blink_forensic_detection_circular"}
    for path in yamls:
        text = path.read_text()
        assert re.search(r"^task: (\S+)$", text, re.M).group(1) == path.stem
        for ref in re.findall(r"!function (lad\.[\w.]+)", text):
            module, name = ref.rsplit(".", 1)
            assert callable(getattr(importlib.import_module(module), name)), ref


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"method": "cot"}, "'method' model_arg must be one of"),
        ({"method": "lad"}, "method=lad needs a calibration"),
        ({"calibration": "c.json", "calibration_docs": 5}, "not both"),
        ({"method": "vanilla", "calibration_docs": 0}, "calibration_docs must be >= 1"),
        ({"method": "vanilla", "calibration": "missing.json"}, "no such file"),
    ],
)
def test_options_refused(kwargs: dict, message: str) -> None:
    with pytest.raises(LadError, match=re.escape(message)):
        HarnessOptions(**kwargs)


def _lad(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = main(list(args))
    return code, out.getvalue(), err.getvalue()


def test_cli_tasks_and_audit(tmp_path: Path) -> None:
    code, out, _ = _lad("harness", "tasks")
    assert code == 0 and Path(out.strip()) == tasks_folder()
    model = tmp_path / "out" / "some__model"
    model.mkdir(parents=True)
    lines = [json.dumps({"doc_id": i, "lad_acc": row}) for i, row in enumerate(_rows())]
    (model / "20260101_000000_samples_muirbench_circular.jsonl").write_text("\n".join(lines))
    (model / "20260101_000000_samples_muirbench.jsonl").write_text('{"doc_id": 0}\n')
    code, out, err = _lad("harness", "audit", str(tmp_path / "out"))
    assert code == 0, err
    audit = json.loads((tmp_path / "out/lad_audit.json").read_text())
    assert list(audit["tasks"]) == ["muirbench_circular"]
    entry = audit["tasks"]["muirbench_circular"]["2"]
    assert entry["methods"]["model"]["acc"] == 50.0
    folder = tmp_path / "out" / entry["folder"]
    assert json.loads((folder / "metrics.json").read_text())["methods"]["model"]["cons"] == 0.0
    code, out, _ = _lad("report", str(tmp_path / "out"), "--out", str(tmp_path / "report"))
    assert code == 0 and (tmp_path / "report/index.html").is_file()
    code, _, err = _lad("harness", "audit", str(tmp_path / "nowhere"))
    assert code == 1 and err.startswith("Error: ") and err.count("\n") == 1


def test_calibration_folder_one_per_n(tmp_path: Path) -> None:
    """calibration=FOLDER: its calibration files serve their N (other .json files are passed
    over); a question of an N none serves, or one fitted under other labels, is refused before
    any record is made."""
    from lad.core.calibrate import Calibration, Fingerprint
    from lad.core.labels import get_scheme
    from lad.core.prompts import QUESTION, prompt_sha256
    from lad.errors import CalibrationError
    from lad.harness.runner import PictureScorer
    from lad.run.debiaser import Debiaser
    from tests.synthetic import SyntheticModel

    records = SyntheticModel(num_candidates=4).calibration_records(2)
    scheme = get_scheme("upper")
    made = Fingerprint(
        model="demo",
        labels=tuple(scheme.labels(4)),
        prompt_sha256=prompt_sha256(QUESTION, scheme, 4),
        preprocessing=Debiaser().spec.preprocessing(),
    )
    Calibration().fit(records, made).save(tmp_path / "calibration.json")
    (tmp_path / "metrics.json").write_text('{"num_candidates": 4}')
    scorer = PictureScorer(HarnessOptions(calibration=str(tmp_path), output=str(tmp_path / "o")))
    debiaser, source = scorer.calibrated("muirbench", 4, [])
    assert source.kind == "file" and source.path == str(tmp_path / "calibration.json")
    assert debiaser.calibration_.num_candidates == 4
    with pytest.raises(CalibrationError, match="no calibration for N = 5"):
        scorer.calibrated("muirbench", 5, [])
    digits = PictureScorer(
        HarnessOptions(calibration=str(tmp_path), labels="digits", output=str(tmp_path / "o"))
    )
    with pytest.raises(CalibrationError, match="label"):
        digits.calibrated("muirbench", 4, [])


def test_adapters_and_converters_share_one_rule(tmp_path: Path) -> None:
    """Every row of the hub fixtures: the adapter sees a picture question exactly when `lad data`
    converts it (or skips it only for its answer), with the same id, question, answer and
    context (the converter's pictures are the cells' bytes)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from lad.data.blink import import_blink
    from lad.data.items import read_items
    from lad.data.muirbench import import_muirbench
    from tests.test_data_hub import BLINK_ROWS, BLINK_SCHEMA, MUIR_ROWS, MUIR_SCHEMA

    for rows, schema, convert, answer_skips in (
        (MUIR_ROWS, MUIR_SCHEMA, import_muirbench, 1),  # no option F
        (BLINK_ROWS, BLINK_SCHEMA, import_blink, 2),  # no option C; the test split's blank
    ):
        source = tmp_path / f"{convert.__name__}.parquet"
        pq.write_table(pa.Table.from_pylist(rows, schema=schema), source)
        out = tmp_path / f"{convert.__name__}.jsonl"
        convert(source, out, calibration_items=0)
        items = {it.id: it for it in read_items(out)}
        choices = [c for c in map(picture_choice, rows) if c is not None]
        answered = {c.item: c for c in choices if c.answer is not None}
        assert sorted(answered) == sorted(items)
        assert len(choices) - len(answered) == answer_skips
        for item_id, item in items.items():
            choice = answered[item_id]
            assert (choice.question, choice.answer) == (item.question, item.answer)
            for cells, files in ((choice.context, item.context_images),
                                 (choice.candidates, item.images)):  # fmt: skip
                assert [c["bytes"] for c in cells] == [p.read_bytes() for p in files]


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({"top_k": True}, "'top_k' model_arg must be a whole number. Got True."),
        ({"top_k": 2.7}, "'top_k' model_arg must be a whole number. Got 2.7."),
        ({"top_k": "2.7"}, "'top_k' model_arg must be a whole number. Got '2.7'."),
        ({"batch_size": [4]}, "'batch_size' model_arg must be a whole number. Got [4]."),
        ({"tau": False}, "'tau' model_arg must be a number. Got False."),
        ({"top_k": float("inf")}, "'top_k' model_arg must be a whole number. Got inf."),
    ],
)
def test_a_number_model_arg_is_a_number_not_a_bool_nor_a_cut_float(given, message) -> None:
    from lad.harness.args import read_model_args
    from lad.harness.text_scorer import ChoiceOptions

    with pytest.raises(LadError, match=re.escape(message)):
        read_model_args(ChoiceOptions, {"method": "vanilla", **given})
    read = read_model_args(ChoiceOptions, {"method": "vanilla", "top_k": 3.0, "tau": "inf"})
    assert read.options.top_k == 3 and read.options.tau == float("inf")
