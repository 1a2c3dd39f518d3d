"""`lad data mmlu|judgments|text`: the files people have -> items of text candidates."""

from __future__ import annotations

import json
import re

import pytest

from lad.cli import main
from lad.data.items import read_items
from lad.data.judgments import JUDGE_QUESTION, import_judgments
from lad.data.mmlu import import_mmlu
from lad.data.textjsonl import answer_index, import_text
from lad.errors import DataError


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _parquet(path, rows):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


MMLU = [
    {"question": f"Q{i}?", "subject": "astronomy" if i % 2 else "law",
     "choices": [f"a{i}", f"b{i}", f"c{i}", f"d{i}"], "answer": i % 4}
    for i in range(8)
]  # fmt: skip
ARC = [
    {"id": "Mercury_1", "question": "Which is a gas?", "answerKey": "B",
     "choices": {"text": ["rock", "steam", "ice"], "label": ["A", "B", "C"]}},
    {"id": "Mercury_2", "question": "Which melts?", "answerKey": "4",
     "choices": {"text": ["iron", "wood", "glass", "ice"], "label": ["1", "2", "3", "4"]}},
    {"id": "Mercury_3", "question": "Which floats?", "answerKey": "E",
     "choices": {"text": ["a stone", "a cork"], "label": ["A", "B"]}},
]  # fmt: skip


@pytest.mark.parametrize("kind", ["jsonl", "parquet"])
def test_mmlu_rows_become_text_items(tmp_path, kind):
    src = (_jsonl if kind == "jsonl" else _parquet)(tmp_path / f"mmlu.{kind}", MMLU)
    out = tmp_path / "mmlu-items.jsonl"
    written = import_mmlu(src, out, task="astronomy", calibration_items=1)
    items = read_items(out) + read_items(written.calibration_path)
    assert sorted(it.id for it in items) == [f"mmlu-astronomy-{i}" for i in (1, 3, 5, 7)]
    one = next(it for it in items if it.id == "mmlu-astronomy-3")
    assert one.candidates == ["a3", "b3", "c3", "d3"] and one.answer == 3 and one.query == "Q3?"
    assert written.summary["tasks"] == {"astronomy": {"converted": 4, "skipped": {}}}


def test_arc_labels_and_other_n(tmp_path):
    src = _parquet(tmp_path / "arc.parquet", ARC)
    written = import_mmlu(src, tmp_path / "arc3.jsonl", num_candidates=3, calibration_items=0)
    (item,) = read_items(tmp_path / "arc3.jsonl")
    assert item.id == "Mercury_1" and item.answer == 1 and item.candidates[1] == "steam"
    assert written.summary["tasks"]["all"]["skipped"] == {"other N": 1, "answer not an option": 1}
    import_mmlu(src, tmp_path / "arc4.jsonl", num_candidates=4, calibration_items=0)
    assert read_items(tmp_path / "arc4.jsonl")[0].answer == 3  # label "4" of "1".."4"


def test_judgments_flat_and_mt_bench_shapes(tmp_path):
    def conv(q, a):
        return [{"role": "user", "content": q}, {"role": "assistant", "content": a}]

    rows = [
        {"question": "Say hi", "answer_a": "hi", "answer_b": "go away", "winner": "model_a"},
        {"question": "Add 2+2", "answer_a": "5", "answer_b": "4", "winner": "B"},
        {"question": "Tie?", "answer_a": "x", "answer_b": "y", "winner": "tie"},
    ]
    flat = import_judgments(_jsonl(tmp_path / "flat.jsonl", rows), tmp_path / "f.jsonl",
                            calibration_items=0)  # fmt: skip
    items = read_items(tmp_path / "f.jsonl")
    assert [it.answer for it in items] == [0, 1] and items[1].candidates == ["5", "4"]
    assert items[0].query == JUDGE_QUESTION.format("Say hi")
    assert flat.summary["tasks"]["all"]["skipped"] == {"tie": 1}
    mt = [
        {"question_id": 81, "model_a": "m1", "model_b": "m2", "winner": "model_b", "judge": "e0",
         "turn": 1, "conversation_a": conv("Write", "ok"), "conversation_b": conv("Write", "good")},
        {"question_id": 81, "model_a": "m1", "model_b": "m2", "winner": "model_a", "judge": "e0",
         "turn": 2, "conversation_a": conv("Write", "ok"), "conversation_b": conv("Write", "good")},
        {"question_id": 82, "model_a": "m1", "model_b": "m3", "winner": "tie (bothbad)",
         "judge": "e0", "turn": 1, "conversation_a": conv("Q", "a"),
         "conversation_b": conv("Q", "b")},
    ]  # fmt: skip
    written = import_judgments(_parquet(tmp_path / "mt.parquet", mt), tmp_path / "mt.jsonl",
                               calibration_items=0)  # fmt: skip
    (item,) = read_items(tmp_path / "mt.jsonl")
    assert item.candidates == ["ok", "good"] and item.answer == 1
    assert item.extra["model_b"] == "m2" and item.extra["question_id"] == 81
    assert written.summary["tasks"]["e0"]["skipped"] == {"second turn": 1, "tie": 1}


def test_generic_text_answers_by_index_letter_or_text(tmp_path):
    rows = [
        {"id": "a", "question": "1+1?", "choices": ["1", "2", "3"], "answer": 1, "topic": "m"},
        {"id": "b", "question": "Sky?", "choices": ["blue", "green", "red"], "answer": "C"},
        {"id": "c", "question": "Grass?", "choices": ["blue", "green", "red"], "answer": "green"},
        {"id": "d", "question": "Dup?", "choices": ["x", "x", "y"], "answer": "x"},
        {"id": "e", "question": " ", "choices": ["x", "y", "z"], "answer": 0},
    ]
    written = import_text(_jsonl(tmp_path / "q.jsonl", rows), tmp_path / "t.jsonl",
                          calibration_items=0)  # fmt: skip
    items = read_items(tmp_path / "t.jsonl")
    assert [(it.id, it.answer) for it in items] == [("a", 1), ("b", 2), ("c", 1)]
    assert items[0].extra == {"topic": "m"}
    skipped = written.summary["tasks"]["all"]["skipped"]
    assert skipped == {"answer text matches several options": 1, "empty question": 1}
    assert answer_index(True, ["x", "y"]) == "no answer"
    assert answer_index(5, ["x", "y"]) == "answer not an option"
    assert answer_index("B", ["A", "C", "B"]) == "answer text matches several options"
    assert answer_index("b", ["yes", "no"]) == 1 and answer_index("no", ["yes", "no"]) == 1


def test_generic_text_missing_field_is_one_line(tmp_path, capsys):
    src = _jsonl(tmp_path / "q.jsonl", [{"prompt": "x", "options": ["a", "b"], "answer": 0}])
    with pytest.raises(DataError, match=r"q.jsonl:1: missing field 'question'.*--question-field"):
        import_text(src, tmp_path / "t.jsonl")
    args = ["data", "text", str(src), "--question-field", "prompt", "--calibration-items", "0"]
    assert main([*args, "--out", str(tmp_path / "t.jsonl")]) == 0
    assert read_items(tmp_path / "t.jsonl")[0].query == "x"
    assert "Wrote 1 items" in capsys.readouterr().out
    assert main(["data", "mmlu", str(src), "--out", str(tmp_path / "m.jsonl")]) == 1
    assert "expected MMLU's fields" in capsys.readouterr().err
    with pytest.raises(DataError, match=r"missing field 'q' \(set it with --question-field\)"):
        import_text(src, tmp_path / "q.jsonl", question_field="q")  # the flag, not the name


_COUNTS = [
    ("--items", "0", "--items must be >= 1. Got 0."),
    ("--calibration-items", "-1", "--calibration-items must be >= 0. Got -1."),
    ("--num-candidates", "1", "--num-candidates must be >= 2. Got 1."),
]


@pytest.mark.parametrize(
    "converter, flag, value, message",
    # judgments are always two candidates: no --num-candidates
    [
        (c, *case)
        for c in ("mmlu", "judgments", "text")
        for case in _COUNTS[: 2 + (c != "judgments")]
    ],
)
def test_text_converters_name_the_flag_out_of_range(
    tmp_path, capsys, converter, flag, value, message
):
    """The text converters read their counts as the released ones do: a count out of range is
    one line naming its flag (it was one line naming --items and --calibration-items together)."""
    src = _jsonl(tmp_path / "q.jsonl", [{"question": "q?", "options": ["a", "b"], "answer": 0}])
    out = tmp_path / "o.jsonl"
    assert main(["data", converter, str(src), flag, value, "--out", str(out)]) == 1
    assert capsys.readouterr().err.strip() == f"Error: {message}"
    assert not out.exists()


def test_a_text_converter_refuses_an_option_it_does_not_take(tmp_path):
    """The released converters' picture options mean nothing to a text file: passed to a text
    converter they are refused, never silently ignored."""
    src = _jsonl(tmp_path / "q.jsonl", [{"question": "q?", "options": ["a", "b"], "answer": 0}])
    with pytest.raises(TypeError, match="images"):
        import_text(src, tmp_path / "o.jsonl", images=str(tmp_path))
    assert not (tmp_path / "o.jsonl").exists()


@pytest.mark.parametrize("converter", ["mmlu", "judgments", "text", "text-demo"])
def test_a_text_converter_refuses_a_folder_out_before_reading(tmp_path, capsys, converter):
    """--out naming a folder is one line naming the flag, as for every other converter, before
    the input is read (it came as "o.jsonl: Is a directory" once the conversion had run)."""
    (tmp_path / "o.jsonl").mkdir()
    source = [] if converter == "text-demo" else [str(tmp_path / "missing.jsonl")]
    assert main(["data", converter, *source, "--out", str(tmp_path / "o.jsonl")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and re.search(r"--out .*o\.jsonl is a folder", err[0]), err


def test_an_output_name_too_long_is_refused_before_any_file(tmp_path, capsys):
    """Every declared output's name is checked against the file system's limit before the
    command runs: text-demo wrote its items file, then failed on the longer calibration name."""
    out = tmp_path / ("b" * 240 + ".jsonl")  # fits; its .calibration.jsonl sibling does not
    assert main(["data", "text-demo", "--out", str(out)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and re.search(r"^Error: its calibration file .* 255 bytes", err[0]), err
    assert list(tmp_path.iterdir()) == []
