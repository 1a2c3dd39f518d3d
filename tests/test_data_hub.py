"""`lad data muirbench` and `lad data blink` on parquet files in the hub datasets' schemas.

MuirBench (huggingface.co/datasets/MUIRBENCH/MUIRBENCH, `data/test-*.parquet`): columns idx, task,
image_relation, image_type, question (an `<image>` where it shows a picture), options (list of
strings, "<image>" for a picture option), answer (a letter), image_list (list of `datasets` Image
cells, i.e. struct<bytes: binary, path: string>) and counterpart_idx, as the dataset card lists
them and as lmms-eval's `tasks/muirbench/utils.py` reads them (doc["question"], doc["options"],
doc["image_list"], doc["idx"], doc["task"], doc["image_relation"], doc["image_type"],
doc["answer"]); twins whose answer is the text option "None of the choices provided".

BLINK (huggingface.co/datasets/BLINK-Benchmark/BLINK, one config per task, `<Task>/val-*.parquet`):
columns idx, question, sub_task, image_1 … image_4 (Image cells, null when absent), choices (list
of strings), answer ("(A)", "(B)", …), prompt, explanation, as the dataset card lists them and as
BLINK's own evaluation and HELM's BlinkScenario read them (entry["image_1"], entry["choices"],
entry["answer"] with its parentheses stripped).
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image

from lad.cli import main
from lad.data.blink import import_blink
from lad.data.items import read_items
from lad.data.muirbench import import_muirbench
from lad.errors import DataError

IMAGE = pa.struct([("bytes", pa.binary()), ("path", pa.string())])


def _picture(k: int, fmt: str = "PNG") -> dict:
    buffer = io.BytesIO()
    Image.new("RGB", (16 + k, 12), (20 * k % 256, 90, 160)).save(buffer, format=fmt)
    return {"bytes": buffer.getvalue(), "path": f"p{k}.{fmt.lower()}"}


# ----------------------------------------------------------------------------- MuirBench

MUIR_SCHEMA = pa.schema(
    [(k, pa.string()) for k in ("idx", "task", "image_relation", "image_type", "question")]
    + [("options", pa.list_(pa.string())), ("answer", pa.string())]
    + [("image_list", pa.list_(IMAGE)), ("counterpart_idx", pa.string())]
)
PICK = ["<image>"] * 4
RETRIEVE = "Can you find the images with the same landmark as <image>? Select from the choices."


def _muir(idx, task, question, options, answer, pictures, twin="") -> dict:
    return {
        "idx": idx,
        "task": task,
        "image_relation": "Similar" if task == "Visual Retrieval" else "Narrative",
        "image_type": "Photography",
        "question": question,
        "options": options,
        "answer": answer,
        "image_list": [_picture(k) for k in pictures],
        "counterpart_idx": twin,
    }


MUIR_ROWS = [
    _muir("0", "Visual Retrieval", RETRIEVE, PICK, "C", range(5), "1"),
    _muir("1", "Visual Retrieval", RETRIEVE, [*PICK[:3], "None of the choices provided"], "D",
          range(4), "0"),  # the unanswerable twin
    _muir("2", "Visual Retrieval", RETRIEVE, PICK, "A", range(10, 15)),
    _muir("3", "Visual Retrieval", RETRIEVE, PICK, "B", range(20, 24)),  # a picture short
    _muir("4", "Visual Retrieval", RETRIEVE, PICK, "F", range(30, 35)),  # no option F
    _muir("5", "Counting", "How many dogs are in <image> and <image>?", ["2", "3", "4", "5"],
          "B", range(40, 42)),
    _muir("6", "Image-Text Matching", "Which image shows a red kite over the beach?", PICK, "d",
          range(50, 54)),
    _muir("7", "Visual Retrieval", RETRIEVE, PICK, "D", range(60, 65)),
]  # fmt: skip
MUIR_SKIPS = {
    "Visual Retrieval": {
        "answer not an option": 1,
        "options not pictures": 1,
        "pictures do not match <image> places": 1,
    },
    "Counting": {"options not pictures": 1},
}


@pytest.fixture
def muirbench(tmp_path: Path) -> Path:
    folder = tmp_path / "MUIRBENCH" / "data"
    folder.mkdir(parents=True)
    table = pa.Table.from_pylist(MUIR_ROWS, schema=MUIR_SCHEMA)
    pq.write_table(table.slice(0, 4), folder / "test-00000-of-00002.parquet")
    pq.write_table(table.slice(4), folder / "test-00001-of-00002.parquet")
    return folder


def test_muirbench_picture_options_convert_with_the_question_pictures_in_place(muirbench, tmp_path):
    out = tmp_path / "out" / "muir.jsonl"
    written = import_muirbench(muirbench, out, calibration_items=1, seed=0)
    tasks = written.summary["tasks"]
    assert {t: c["skipped"] for t, c in tasks.items() if c["skipped"]} == MUIR_SKIPS
    assert {t: c["converted"] for t, c in tasks.items()} == {
        "Counting": 0, "Image-Text Matching": 1, "Visual Retrieval": 3,
    }  # fmt: skip
    items = {it.id: it for it in [*read_items(out), *read_items(written.calibration_path)]}
    assert sorted(items) == ["muirbench-0", "muirbench-2", "muirbench-6", "muirbench-7"]
    first = items["muirbench-0"]
    # Worked by hand: pictures 0 (the question's <image>), then 1..4 (the options); answer C.
    assert first.question == first.query == RETRIEVE
    assert first.answer == 2 and first.num_candidates == 4
    assert [p.read_bytes() for p in first.context_images] == [_picture(0)["bytes"]]
    assert [p.read_bytes() for p in first.images] == [_picture(k)["bytes"] for k in (1, 2, 3, 4)]
    assert first.extra["image_relation"] == "Similar" and first.extra["counterpart_idx"] == "1"
    matching = items["muirbench-6"]  # a lowercase letter is still D; no question picture
    assert matching.answer == 3 and matching.context_images == []
    assert all(p.parent == tmp_path / "out" / "muir-pictures" for p in matching.images)


def test_muirbench_cli_prints_and_writes_the_counts(muirbench, tmp_path, capsys):
    out = tmp_path / "m.jsonl"
    args = ["data", "muirbench", str(muirbench), "--task", "Visual Retrieval", "--out", str(out)]
    assert main([*args, "--calibration-items", "1", "--pictures", str(tmp_path / "pics")]) == 0
    printed = capsys.readouterr().out
    assert (
        "  Visual Retrieval: converted 3; skipped 3 (answer not an option: 1, options not "
        "pictures: 1, pictures do not match <image> places: 1)"
    ) in printed
    summary = json.loads((tmp_path / "m.summary.json").read_text())
    assert summary["benchmark"] == "muirbench" and list(summary["tasks"]) == ["Visual Retrieval"]
    assert len(read_items(out)) == 2 and len(list((tmp_path / "pics").iterdir())) == 15


# ----------------------------------------------------------------------------- BLINK

BLINK_SCHEMA = pa.schema(
    [("idx", pa.string()), ("question", pa.string()), ("sub_task", pa.string())]
    + [(f"image_{k}", IMAGE) for k in (1, 2, 3, 4)]
    + [("choices", pa.list_(pa.string())), ("answer", pa.string())]
    + [("prompt", pa.string()), ("explanation", pa.string())]
)
SIMILAR = (
    "Given three similar but different images, take the first image as reference. Can you tell "
    "which one of the latter two images is most similar to the first one?"
)
LATTER = ["The second image", "The third image"]


def _blink(idx, task, question, choices, answer, pictures) -> dict:
    cells = [_picture(k, "JPEG") for k in pictures] + [None] * (4 - len(pictures))
    options = " ".join(f"({chr(65 + k)}) {c}" for k, c in enumerate(choices))
    return {
        "idx": idx,
        "question": question,
        "sub_task": task,
        **{f"image_{k + 1}": cell for k, cell in enumerate(cells)},
        "choices": choices,
        "answer": answer,
        "prompt": f"{question}\nSelect from the following choices.\n{options}",
        "explanation": "",
    }


BLINK_ROWS = [
    _blink("val_Visual_Similarity_1", "Visual_Similarity", SIMILAR, LATTER, "(B)", range(3)),
    _blink("val_Visual_Similarity_2", "Visual_Similarity", SIMILAR, LATTER, "(A)", range(3, 6)),
    _blink("val_Visual_Similarity_3", "Visual_Similarity", SIMILAR, LATTER, "(A)", range(6, 9)),
    _blink("test_Visual_Similarity_1", "Visual_Similarity", SIMILAR, LATTER, "", range(9, 12)),
    _blink("val_Visual_Similarity_4", "Visual_Similarity", SIMILAR, LATTER, "(C)", range(12, 15)),
    _blink("val_Visual_Similarity_5", "Visual_Similarity", SIMILAR,
           ["The first image", "The second image"], "(A)", range(15, 18)),  # reference last
    _blink("val_Counting_1", "Counting", "How many blue floats are there?",
           ["0", "3", "2", "1"], "(B)", range(18, 19)),
]  # fmt: skip
BLINK_SKIPS = {
    "Visual_Similarity": {
        "answer not an option": 1,
        "no answer": 1,
        "reference pictures not first": 1,
    },
    "Counting": {"options not pictures": 1},
}


@pytest.fixture
def blink(tmp_path: Path) -> Path:
    root = tmp_path / "BLINK"
    for task in ("Visual_Similarity", "Counting"):
        (root / task).mkdir(parents=True)
        rows = [r for r in BLINK_ROWS if r["sub_task"] == task]
        split = {"val": [r for r in rows if r["idx"].startswith("val")]}
        split["test"] = [r for r in rows if r["idx"].startswith("test")]
        for name, part in split.items():
            table = pa.Table.from_pylist(part, schema=BLINK_SCHEMA)
            pq.write_table(table, root / task / f"{name}-00000-of-00001.parquet")
    return root


def test_blink_reference_picture_becomes_a_context_picture(blink, tmp_path):
    out = tmp_path / "blink.jsonl"
    written = import_blink(blink, out, calibration_items=0)
    tasks = written.summary["tasks"]
    assert {t: c["skipped"] for t, c in tasks.items()} == BLINK_SKIPS
    items = {it.id: it for it in read_items(out)}
    assert sorted(items) == ["blink-val_Visual_Similarity_1", "blink-val_Visual_Similarity_2",
                             "blink-val_Visual_Similarity_3"]  # fmt: skip
    first = items["blink-val_Visual_Similarity_1"]
    # Worked by hand: image_1 is the reference, image_2 and image_3 the choices; "(B)" is the third.
    assert first.question == SIMILAR and first.answer == 1
    assert [p.read_bytes() for p in first.context_images] == [_picture(0, "JPEG")["bytes"]]
    assert [p.read_bytes() for p in first.images] == [_picture(k, "JPEG")["bytes"] for k in (1, 2)]
    assert first.images[0].suffix == ".jpg"
    assert items["blink-val_Visual_Similarity_2"].answer == 0


def test_blink_cli_one_task_folder_and_errors(blink, tmp_path, capsys):
    out = tmp_path / "sim.jsonl"
    args = ["data", "blink", str(blink / "Visual_Similarity"), "--out", str(out)]
    assert main([*args, "--calibration-items", "1"]) == 0
    printed = capsys.readouterr().out
    assert "Wrote 2 items to" in printed and "Wrote 1 calibration items" in printed
    assert (
        "  Visual_Similarity: converted 3; skipped 3 (answer not an option: 1, no answer: 1, "
        "reference pictures not first: 1)"
    ) in printed
    assert main([*args[:2], str(tmp_path / "nowhere"), "--out", str(out)]) == 1
    assert "no such question file" in capsys.readouterr().err
    assert main([*args, "--task", "Jigsaw"]) == 1
    assert "no question of task 'Jigsaw'" in capsys.readouterr().err
    with pytest.raises(DataError, match="too few to hold out --calibration-items 5"):
        import_blink(blink / "Counting", tmp_path / "c.jsonl")


# ----------------------------------------------------------------------------- a new benchmark


def test_a_new_benchmark_is_one_rule_and_one_registration(tmp_path, monkeypatch, capsys):
    """A toy benchmark (a JSON list: `id`, `task`, `ask`, `pictures`, `right`) registered like
    the three gets its `lad data` command, converter, skip counts and summary from
    lad.data.released."""
    from lad.data import benchmarks
    from lad.data.questions import Benchmark, require
    from lad.data.rules import ANSWER_NOT_AN_OPTION, Choice, answer_position, option_letters

    def choose(row):
        pictures = require(row, "pictures")
        answer = answer_position(require(row, "right"), option_letters(len(pictures)))
        if isinstance(answer, str):
            return ANSWER_NOT_AN_OPTION
        letters = option_letters(len(pictures))
        return Choice(f"toy-{row.fields['id']}", "all", row.fields["ask"], pictures, [], answer,
                      None, letters, {"source": "toy"})  # fmt: skip

    toy = Benchmark(name="toy", title="Toy", choose=choose, task_field="task", embedded=False,
                    help="Convert the toy benchmark.", files="a JSON list",
                    example="lad data toy toy.json --out toy.jsonl")  # fmt: skip
    monkeypatch.setitem(benchmarks.BENCHMARKS, "toy", toy)
    names = []
    for k in range(6):
        Image.new("RGB", (8, 8), (40 * k, 0, 0)).save(tmp_path / f"{k}.png")
        names.append(f"{k}.png")
    rows = [{"id": q, "task": "all", "ask": "Which is red?", "pictures": names[q : q + 2],
             "right": "AZ"[q == 4]} for q in range(5)]  # fmt: skip
    (tmp_path / "toy.json").write_text(json.dumps(rows))
    out = tmp_path / "toy.jsonl"
    assert main(["data", "toy", str(tmp_path / "toy.json"), "--calibration-items", "1",
                 "--out", str(out)]) == 0  # fmt: skip
    assert "  all: converted 4; skipped 1 (answer not an option: 1)" in capsys.readouterr().out
    assert (
        len(read_items(out)) == 3
        and json.loads((tmp_path / "toy.summary.json").read_text())["benchmark"] == "toy"
    )
