"""`lad data mmiu` on MMIU's question files as released.

Fixture rows copy the released schema field for field: the objects of
github.com/OpenGVLab/MMIU `results/<task>/qwen3-vl/metadata_info.json` (commit e8963c2), e.g.
forensic_detection_forgerynet's first question (context "You are a judge in a photography
competition, ...\\nSelect from the following choices.\\nA: the first image\\n...") and
image2image_retrieval's ("The query image is the first image.", options "A: The second image"
... "D: The fifth image", context "Select from the following choices.\\n" + options), with the
model's answer key dropped; image paths `./<relationship>/<task>/<task>_<q>_<i>.jpg`. all.parquet
has the same columns (input_image_path a list of strings). The order of question and context is
MMIU's own evaluation prompt's (VLMEvalKit/test_qwen3_vl.py: `tasks_exist` get question + "\\n" +
context, the others context + "\\n" + question). The nested layout is InternVL's MMIU evaluation:
{"input": {question, context, input_image_path}, "output": {"output_text"}}.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lad.cli import main
from lad.data.items import read_items
from lad.data.mmiu import QUESTION_FIRST, instruction, option_images, read_mmiu
from lad.errors import DataError
from tests.data_fixtures import make_images

FORGERY = "forensic_detection_forgerynet"
I2I = "image2image_retrieval"
JUDGE = (
    "You are a judge in a photography competition, and now you are given the four images. Please "
    "examine the details and tell which one of them is most likely to be a fake photograph."
)
FAKE = "Which image is most likely to be a fake photograph?"
FORGERY_OPTIONS = "A: the first image\nB: the second image\nC: the third image\nD: the fourth image"
I2I_OPTIONS = "A: The second image\nB: The third image\nC: The fourth image\nD: The fifth image"
I2I_QUESTION = (
    "Please retrieve the most similar scene to the query in the candidate.The query image is the "
    "first image."
)
RELATIONSHIP = {FORGERY: "Low-level-semantic", I2I: "High-level-obj-semantic"}


def _row(task: str, q: int, n: int, options: str, question: str, output, context=None) -> dict:
    if context is None:
        context = (JUDGE + "\n" if task == FORGERY else "") + (
            "Select from the following choices.\n" + options + ("\n" if task == FORGERY else "")
        )
    return {
        "task": task,
        "visual_input_component": (
            "natural image and synthetic image" if task == FORGERY else "['natural_image']"
        ),
        "source": "forgerynet" if task == FORGERY else "places365_retrieval",
        "options": options,
        "question": question,
        "context": context,
        "input_image_path": [f"./{RELATIONSHIP[task]}/{task}/{task}_{q}_{i}.jpg" for i in range(n)],
        "output": output,
    }


def _rows() -> list[dict]:
    forgery = [
        _row(FORGERY, 0, 4, FORGERY_OPTIONS, FAKE, "B"),
        _row(FORGERY, 1, 4, FORGERY_OPTIONS, FAKE, "D"),
        _row(FORGERY, 2, 4, FORGERY_OPTIONS, FAKE, " c "),  # MMIU's scorer: trimmed, any case
        _row(FORGERY, 3, 4, FORGERY_OPTIONS, FAKE, "A"),
        _row(FORGERY, 4, 4, FORGERY_OPTIONS, FAKE, None),  # no answer
        _row(FORGERY, 5, 4, FORGERY_OPTIONS, FAKE, "E"),  # not an option
        _row(FORGERY, 6, 4, FORGERY_OPTIONS, "", "A", context=""),  # nothing asked
        _row(FORGERY, 7, 4, "A: Yes\nB: No", "Is the first image real?", "A"),
        _row(FORGERY, 8, 4, "A: the first image\nB: the first image", FAKE, "A"),
        _row(FORGERY, 9, 3, "A: the first image\nB: the second image", FAKE, "B"),  # 3rd: context
        _row(FORGERY, 10, 2, "A: the first image\nB: the second image", FAKE, "B"),  # N = 2
    ]
    i2i = [_row(I2I, q, 5, I2I_OPTIONS, I2I_QUESTION, out) for q, out in enumerate("CDBA")]
    return forgery + i2i


FORGERY_SKIPS = {  # with --num-candidates 4
    "answer not an option": 1,
    "other N": 1,
    "empty question": 1,
    "no answer": 1,
    "not one option per image": 1,
    "options not images": 1,
    "reference pictures not first": 1,
}


@pytest.fixture
def release(tmp_path: Path) -> tuple[Path, list[dict]]:
    """The folder MMIU's zips were extracted in (`<relationship>/<task>/<file>`) and the rows."""
    root = tmp_path / "MMIU"
    rows = _rows()
    for task, relationship in RELATIONSHIP.items():
        folder = root / relationship / task
        paths = [p for r in rows if r["task"] == task for p in r["input_image_path"]]
        for name, p in zip(make_images(folder, len(paths)), paths, strict=True):
            (folder / name).rename(folder / Path(p).name)
    return root, rows


def test_options_that_name_images():
    assert option_images(FORGERY_OPTIONS) == [("A", 0), ("B", 1), ("C", 2), ("D", 3)]
    assert option_images("A. The second image.\nB. the first image\n") == [("A", 1), ("B", 0)]
    assert option_images("A: Yes\nB: No") is None
    assert option_images("A: The sky in the first image\nB: the second image") is None
    assert option_images("") is None


def test_context_loses_only_its_list_of_options():
    assert instruction(_row(FORGERY, 0, 4, FORGERY_OPTIONS, FAKE, "B")["context"]) == JUDGE
    assert instruction(_row(I2I, 0, 5, I2I_OPTIONS, I2I_QUESTION, "C")["context"]) == ""
    assert instruction("Look closely.\nA: Yes\n") == "Look closely."
    assert I2I in QUESTION_FIRST and FORGERY not in QUESTION_FIRST


def _write_parquet(path: Path, rows: list[dict]) -> Path:
    schema = pa.schema(
        [(k, pa.string()) for k in ("task", "visual_input_component", "source", "options")]
        + [("question", pa.string()), ("context", pa.string())]
        + [("input_image_path", pa.list_(pa.string())), ("output", pa.string())]
    )
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), path)
    return path


def _nested(row: dict) -> dict:
    return {
        "task": row["task"],
        "options": row["options"],
        "input": {k: row[k] for k in ("question", "context", "input_image_path")},
        "output": {"output_text": row["output"]},
    }


def _shape(items) -> list[tuple]:
    return [
        (it.id, it.answer, it.question, [p.name for p in it.images],
         [p.name for p in it.context_images])
        for it in items
    ]  # fmt: skip


def test_every_released_format_gives_the_same_items(release, tmp_path):
    root, rows = release
    files = {
        "parquet": _write_parquet(tmp_path / "all.parquet", rows),
        "json": tmp_path / "all.json",
        "jsonl": tmp_path / "all.jsonl",
        "nested": tmp_path / "internvl.jsonl",
    }
    files["json"].write_text(json.dumps(rows, indent=2))
    files["jsonl"].write_text("".join(json.dumps(r) + "\n" for r in rows))
    files["nested"].write_text("".join(json.dumps(_nested(r)) + "\n" for r in rows))
    shapes = {}
    for name, path in files.items():
        task, converted = read_mmiu(path, task=FORGERY, images_dir=root, num_candidates=4)
        assert task == FORGERY
        assert dict(converted.skipped[FORGERY]) == FORGERY_SKIPS, name
        shapes[name] = _shape(converted.items)
    assert len({json.dumps(s) for s in shapes.values()}) == 1
    # Worked by hand from the rows: answers B, D, c (C), A; context first (forgerynet is not
    # among MMIU's question-first tasks), the list of options dropped.
    asked = JUDGE + "\n" + FAKE
    assert shapes["parquet"] == [
        (f"{FORGERY}-{q:05d}", answer, asked, [f"{FORGERY}_{q}_{i}.jpg" for i in range(4)], [])
        for q, answer in ((0, 1), (1, 3), (2, 2), (3, 0))
    ]


def test_reference_pictures_become_context_pictures(release, tmp_path):
    root, rows = release
    path = _write_parquet(tmp_path / "all.parquet", rows)
    _, converted = read_mmiu(path, task=I2I, images_dir=root)
    assert not converted.skipped
    for q, (item, output) in enumerate(zip(converted.items, "CDBA", strict=True)):
        # "C: The fourth image" is candidate 2 of the second..fifth images; the first is context.
        assert item.answer == "ABCD".index(output)
        assert [p.name for p in item.images] == [f"{I2I}_{q}_{i}.jpg" for i in (1, 2, 3, 4)]
        assert [p.name for p in item.context_images] == [f"{I2I}_{q}_0.jpg"]
        assert item.question == I2I_QUESTION  # question first; the context was only options


def test_cli_writes_items_calibration_and_summary(release, tmp_path, capsys):
    root, rows = release
    path = _write_parquet(tmp_path / "all.parquet", rows)
    out = tmp_path / "out" / "forgery.jsonl"
    args = ["data", "mmiu", str(path), "--task", FORGERY, "--images", str(root), "-n", "4"]
    assert main([*args, "--calibration-items", "1", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "Wrote 3 items to" in printed and "Wrote 1 calibration items to" in printed
    assert (
        f"  {FORGERY}: converted 4; skipped 7 (answer not an option: 1, empty question: 1, "
        "no answer: 1, not one option per image: 1, options not images: 1, other N: 1, "
        "reference pictures not first: 1)"
    ) in printed
    summary = json.loads((tmp_path / "out" / "forgery.summary.json").read_text())
    assert summary["tasks"] == {FORGERY: {"converted": 4, "skipped": FORGERY_SKIPS}}
    assert (summary["items"], summary["calibration_items"]) == (3, 1)
    evaluation = read_items(out, num_candidates=4)
    calibration = read_items(tmp_path / "out" / "forgery.calibration.jsonl", num_candidates=4)
    ids = sorted(it.id for it in [*evaluation, *calibration])
    assert ids == [f"{FORGERY}-{q:05d}" for q in range(4)]  # disjoint, all converted
    again = tmp_path / "out" / "again.jsonl"
    assert main([*args, "--calibration-items", "1", "--out", str(again)]) == 0
    assert again.read_text() == out.read_text()  # same seed, same split
    # Context pictures travel through the items file.
    i2i = tmp_path / "i2i.jsonl"
    i2i_args = ["data", "mmiu", str(path), "--task", I2I, "--images", str(root)]
    assert main([*i2i_args, "--calibration-items", "1", "--out", str(i2i)]) == 0
    back = read_items(i2i)
    assert all(len(it.context_images) == 1 and it.num_candidates == 4 for it in back)


def test_old_image_layout_and_task_file_beside_its_images(release, tmp_path):
    root, rows = release
    # all.json of the GitHub repository wrote ../MMIU-Benchmark/<task>/<file>.
    old = [
        {**r, "input_image_path": [f"../MMIU-Benchmark/{r['task']}/{Path(p).name}"
                                   for p in r["input_image_path"]]}
        for r in rows
    ]  # fmt: skip
    (tmp_path / "old.json").write_text(json.dumps(old))
    folder = root / RELATIONSHIP[FORGERY]
    _, converted = read_mmiu(
        tmp_path / "old.json", task=FORGERY, images_dir=folder, num_candidates=4
    )
    assert len(converted.items) == 4
    # A task's own metadata_info.json finds the pictures beside it without --images.
    task_file = root / RELATIONSHIP[I2I] / I2I / "metadata_info.json"
    task_file.write_text(json.dumps([r for r in rows if r["task"] == I2I]))
    assert len(read_mmiu(task_file)[1].items) == 4


def test_what_cannot_be_read_is_named(release, tmp_path, capsys):
    root, rows = release
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(rows[0]) + "\n{not json\n")
    with pytest.raises(DataError, match=r"bad.jsonl:2: not valid JSON .*one question per line"):
        read_mmiu(bad)
    gone = dict(rows[0], input_image_path=["./Low-level-semantic/gone.jpg", "./x.jpg"],
                options="A: the first image\nB: the second image")  # fmt: skip
    (tmp_path / "gone.json").write_text(json.dumps([gone]))
    with pytest.raises(DataError, match=r"entry 0: image './Low-level-semantic/gone.jpg' is not"):
        read_mmiu(tmp_path / "gone.json", images_dir=root)
    _, converted = read_mmiu(tmp_path / "gone.json", images_dir=root, skip_missing=True)
    assert dict(converted.skipped[FORGERY]) == {"missing image": 1}
    no_question = {k: v for k, v in rows[0].items() if k != "question"}
    (tmp_path / "nq.json").write_text(json.dumps([no_question]))
    with pytest.raises(DataError, match="entry 0: missing field 'question'"):
        read_mmiu(tmp_path / "nq.json")
    both = tmp_path / "both.json"
    both.write_text(json.dumps(rows))
    # lad data without --task or -n converts the whole file: every task and N, a cell each.
    out = tmp_path / "x.jsonl"
    flags = ["--images", str(root), "--calibration-items", "0", "--out", str(out)]
    assert main(["data", "mmiu", str(both), *flags]) == 0
    capsys.readouterr()
    cells = Counter((it.extra["task"], it.num_candidates) for it in read_items(out))
    assert cells == {(FORGERY, 2): 1, (FORGERY, 4): 4, (I2I, 4): 4}, cells
    with pytest.raises(DataError, match="no question of task 'nope'"):
        read_mmiu(both, task="nope")
    # Two N in one task: the user chooses.
    with pytest.raises(DataError, match=r"\(N = 2 \(1\), N = 4 \(4\)\); choose one"):
        read_mmiu(both, task=FORGERY, images_dir=root)
    _, two = read_mmiu(both, task=FORGERY, images_dir=root, num_candidates=2)
    assert len(two.items) == 1 and two.skipped[FORGERY]["other N"] == 4


def test_a_null_top_level_task_is_the_nested_one(release, tmp_path):
    """The task a nested row is filtered by is the one its items carry (and build their prompt
    by): a top-level "task": null falls back to input.task for both."""
    root, rows = release
    path = tmp_path / "nested.jsonl"
    nested = []
    for r in rows:
        row = _nested(r)
        row["input"]["task"], row["task"] = row["task"], None
        nested.append(row)
    path.write_text("".join(json.dumps(r) + "\n" for r in nested))
    task, converted = read_mmiu(path, task=I2I, images_dir=root)
    assert task == I2I and converted.items
    assert {item.extra["task"] for item in converted.items} == {I2I}
    assert all(item.id.startswith(I2I) for item in converted.items)
    assert all(item.question == I2I_QUESTION for item in converted.items)


def test_a_null_top_level_task_is_the_nested_one_in_parquet_too(release, tmp_path):
    """all.parquet's task column is read first to skip other tasks' rows; a null there is not
    another task: the row's nested input.task decides, as in JSON, for the counts too."""
    root, rows = release
    nested = []
    for r in rows:
        row = _nested(r)
        row["input"]["task"], row["task"] = row["task"], None
        nested.append(row)
    jsonl = tmp_path / "nested.jsonl"
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in nested))
    parquet = tmp_path / "nested.parquet"
    pq.write_table(pa.Table.from_pylist(nested), parquet)
    _, from_json = read_mmiu(jsonl, task=I2I, images_dir=root)
    task, converted = read_mmiu(parquet, task=I2I, images_dir=root)
    assert task == I2I and converted.items
    assert [i.id for i in converted.items] == [i.id for i in from_json.items]
    assert all(item.question == I2I_QUESTION for item in converted.items)
