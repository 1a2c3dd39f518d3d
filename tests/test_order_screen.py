"""The screen for order-dependent questions (lad.data.screen): the questions of each converter
whose gold would move when lad shows the candidates in another order are skipped and counted per
task as "order-dependent question"; the benchmarks' own wordings that only name the context
pictures, or every candidate, pass."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lad.data.blink import import_blink
from lad.data.mmiu import read_mmiu
from lad.data.mmlu import import_mmlu
from lad.data.muirbench import import_muirbench
from lad.data.screen import ORDER_DEPENDENT, picture_question_reason, text_question_reason
from lad.data.textjsonl import import_text
from tests.data_fixtures import make_images
from tests.test_data_hub import BLINK_SCHEMA, MUIR_SCHEMA, PICK, SIMILAR, _blink, _muir
from tests.test_data_mmiu import FAKE, FORGERY, FORGERY_OPTIONS, I2I_QUESTION, RELATIONSHIP, _row

# The benchmarks' own wordings (BLINK's Jigsaw and Art_Style prompts, MMIU's, MuirBench's): each
# ordinal names a context picture, or the candidates together.
JIGSAW = (
    "Given the first image with the lower right corner missing, can you tell which one of the "
    "second image or the third image is the missing part?"
)
ART = (
    "Given the following images of art paintings, use the first image as the reference image, "
    "and determine which one of the second or the third image shares the same style as the "
    "reference image?"
)
PASS = [
    (SIMILAR, 1, 2),  # "the first image" is the reference; "the latter two images" both choices
    (JIGSAW, 1, 2),
    (ART, 1, 2),
    (I2I_QUESTION, 1, 4),  # MMIU: "The query image is the first image."
    (FAKE, 0, 4),
    ("Which image shows what happens next after <image><image>?", 2, 4),
    ("Which image is the next image in the sequence <image><image><image>?", 3, 4),
    ("Which image shows the dog on the left side of the sofa?", 0, 4),
]
FLAG = [
    ("Which image is more similar to the first image than the second image is?", 1, 2),
    ("Is the left image or the other one brighter?", 0, 2),
    ("Which image is the same as image 3?", 0, 4),
    ("Which picture is a crop of the last image?", 0, 4),
    ("Compare option B with the others: which one differs?", 0, 4),
    ("Which is taken right after the second option?", 0, 4),
    ("<image> Which option shows the image on the right, zoomed in?", 1, 3),
    ("Is the former a painting?", 0, 2),
]


@pytest.mark.parametrize(("question", "context", "n"), PASS)
def test_questions_naming_only_context_or_every_candidate_pass(question, context, n):
    assert picture_question_reason(question, context, n) is None


@pytest.mark.parametrize(("question", "context", "n"), FLAG)
def test_questions_naming_a_candidate_by_its_place_are_caught(question, context, n):
    assert picture_question_reason(question, context, n) == ORDER_DEPENDENT


def test_text_options_pointing_at_other_options():
    fine = ["apple", "a stone", "P(A and B)", "None of these", "Vitamin A", "I and II only"]
    assert text_question_reason("Which is a fruit?", fine) is None
    for bad in ("All of the above", "none of the above.", "Both A and C", "(A), (B)", "B then A"):
        assert text_question_reason("Which?", ["x", "y", bad]) == ORDER_DEPENDENT, bad
    assert text_question_reason("What is wrong with option (B)?", ["x", "y"]) == ORDER_DEPENDENT
    assert text_question_reason("Which is the second choice?", ["x", "y"]) == ORDER_DEPENDENT
    assert text_question_reason("Please answer a few questions. Which?", ["x", "y"]) is None


def _skipped(summary: dict) -> dict[str, int]:
    return {t: c["skipped"].get(ORDER_DEPENDENT, 0) for t, c in summary["tasks"].items()}


def test_blink_counts_what_it_removes_per_task(tmp_path: Path):
    second = ["The second image", "The third image"]
    rows = [
        _blink("val_Visual_Similarity_1", "Visual_Similarity", SIMILAR, second, "(B)", range(3)),
        _blink("val_Visual_Similarity_2", "Visual_Similarity",
               "Which image is more similar to the first image than the second image is?",
               second, "(A)", range(3, 6)),
        _blink("val_Jigsaw_1", "Jigsaw", JIGSAW, second, "(A)", range(6, 9)),
        _blink("val_Jigsaw_2", "Jigsaw", "Does the second image fit the missing corner?",
               second, "(A)", range(9, 12)),
    ]  # fmt: skip
    path = tmp_path / "blink.parquet"
    pq.write_table(pa.Table.from_pylist(rows, schema=BLINK_SCHEMA), path)
    written = import_blink(path, tmp_path / "b.jsonl", calibration_items=0)
    assert _skipped(written.summary) == {"Jigsaw": 1, "Visual_Similarity": 1}
    assert {t: c["converted"] for t, c in written.summary["tasks"].items()} == {
        "Jigsaw": 1, "Visual_Similarity": 1,
    }  # fmt: skip


def test_muirbench_counts_what_it_removes_per_task(tmp_path: Path):
    retrieve = "Can you find the images with the same landmark as <image>?"
    rows = [
        _muir("0", "Visual Retrieval", retrieve, PICK, "C", range(5)),
        _muir("1", "Visual Retrieval", "Which image shows the landmark of <image> from the left "
              "image's side?", PICK, "A", range(5, 10)),
        _muir("2", "Image-Text Matching", "Which image matches: a kite over the beach?", PICK,
              "B", range(10, 14)),
        _muir("3", "Image-Text Matching", "Which image matches the caption of option A better "
              "than option C does?", PICK, "B", range(14, 18)),
    ]  # fmt: skip
    folder = tmp_path / "data"
    folder.mkdir()
    pq.write_table(pa.Table.from_pylist(rows, schema=MUIR_SCHEMA), folder / "test.parquet")
    written = import_muirbench(folder, tmp_path / "m.jsonl", calibration_items=0)
    assert _skipped(written.summary) == {"Image-Text Matching": 1, "Visual Retrieval": 1}


def test_mmiu_counts_what_it_removes(tmp_path: Path):
    root = tmp_path / "MMIU"
    rows = [
        _row(FORGERY, 0, 4, FORGERY_OPTIONS, FAKE, "B"),
        _row(FORGERY, 1, 4, FORGERY_OPTIONS, "Is the fourth image a fake of the first image?", "A"),
        _row(FORGERY, 2, 4, FORGERY_OPTIONS, FAKE, "C"),
    ]
    folder = root / RELATIONSHIP[FORGERY] / FORGERY
    folder.mkdir(parents=True)
    names = make_images(folder, 12)
    for q in range(3):
        for i in range(4):
            (folder / names[q * 4 + i]).rename(folder / f"{FORGERY}_{q}_{i}.jpg")
    (root / "q.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    _, converted = read_mmiu(root / "q.jsonl", images_dir=root)
    assert dict(converted.skipped[FORGERY]) == {ORDER_DEPENDENT: 1}
    assert converted.converted[FORGERY] == 2


def test_text_converters_count_what_they_remove(tmp_path: Path):
    mmlu = [
        {"question": "Which is a planet?", "subject": "astronomy",
         "choices": ["Mars", "Sirius", "Vega", "Rigel"], "answer": 0},
        {"question": "Which are planets?", "subject": "astronomy",
         "choices": ["Mars", "Venus", "Sirius", "Both A and B"], "answer": 3},
        {"question": "Which is a gas giant?", "subject": "astronomy",
         "choices": ["Jupiter", "Mars", "Venus", "None of the above"], "answer": 0},
        {"question": "Which is right?", "subject": "logic",
         "choices": ["p", "q", "r", "s"], "answer": 1},
    ]  # fmt: skip
    src = tmp_path / "mmlu.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in mmlu))
    written = import_mmlu(src, tmp_path / "out.jsonl", calibration_items=0)
    assert _skipped(written.summary) == {"astronomy": 2, "logic": 0}
    rows = [
        {"question": "Which word is a fruit?", "options": ["apple", "stone"], "answer": 0},
        {"question": "Is option B a fruit?", "options": ["apple", "pear"], "answer": 0},
    ]
    src = tmp_path / "text.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    written = import_text(src, tmp_path / "t.jsonl", calibration_items=0)
    assert _skipped(written.summary) == {"all": 1}
