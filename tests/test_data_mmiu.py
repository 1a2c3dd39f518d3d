"""`lad data mmiu`: MMIU question files in their released format (as in github.com/OpenGVLab/MMIU:
a JSON list of {"task", "visual_input_component", "source", "options", "question", "context",
"input_image_path", "output"}) become items for the tasks whose options are the images."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lad.cli import main
from lad.data.items import read_items
from lad.data.mmiu import import_mmiu, option_images, read_mmiu
from lad.errors import DataError
from tests.data_fixtures import make_images

ORDINAL_OPTIONS = "A: the first image\nB: the second image\nC: the third image\nD: the fourth image"


def _entry(task: str, k: int, n: int, options: str, question: str, output: str) -> dict:
    category = "Low-level-semantic" if "forensic" in task else "High-level-obj-semantic"
    paths = [f"./{category}/{task}/{task}_{k}_{j}.jpg" for j in range(n)]
    return {
        "task": task,
        "visual_input_component": "natural image and synthetic image",
        "source": "forgerynet",
        "options": options,
        "question": question,
        "context": f"Please examine the details.\nSelect from the following choices.\n{options}\n",
        "input_image_path": paths,
        "output": output,
    }


FORGERY = "forensic_detection_forgerynet"
QUESTION = "Which image is most likely to be a fake photograph?"
# (options, output, expected answer): option order and case vary as in MMIU's files.
FORGERY_QUESTIONS = [
    (ORDINAL_OPTIONS, "B", 1),
    (ORDINAL_OPTIONS + "\n", "D", 3),  # q_bench+-style trailing newline
    (ORDINAL_OPTIONS.replace("the", "The"), "A", 0),  # text2image_retrieval's capitals
    ("A: the third image\nB: the first image\nC: the fourth image\nD: the second image", "A", 2),
    (ORDINAL_OPTIONS, "C", 2),
    (ORDINAL_OPTIONS, "A", 0),
]


def _write_task(root: Path, task: str, entries: list[dict]) -> Path:
    """A task folder as MMIU ships it: metadata_info.json and its images."""
    folder = root / ("Low-level-semantic" if "forensic" in task else "High-level-obj-semantic")
    folder = folder / task
    count = sum(len(e["input_image_path"]) for e in entries)
    names = iter(make_images(folder, count))
    for e in entries:
        for p in e["input_image_path"]:
            (folder / next(names)).rename(folder / Path(p).name)
    path = folder / "metadata_info.json"
    path.write_text(json.dumps(entries))
    return path


@pytest.fixture
def mmiu(tmp_path: Path) -> tuple[Path, Path, Path]:
    """(MMIU root, forgerynet's metadata_info.json, an all.json of three tasks)."""
    root = tmp_path / "MMIU"
    forgery = [
        _entry(FORGERY, k, 4, options, QUESTION, output)
        for k, (options, output, _) in enumerate(FORGERY_QUESTIONS)
    ]
    # Not one image per option: a question whose options are words, one about two images.
    forgery.append(_entry(FORGERY, 6, 4, "A: Yes\nB: No\n", "Is the first image real?", "A"))
    forgery.append(_entry(FORGERY, 7, 2, "A: the first image\nB: the second image\n", "?", "B"))
    task_file = _write_task(root, FORGERY, forgery)
    retrieval = [
        _entry(
            "image2image_retrieval",
            k,
            5,
            "A: The second image\nB: The third image\nC: The fourth image\nD: The fifth image",
            "Please retrieve the most similar scene to the query in the candidate.The query "
            "image is the first image.",
            "C",
        )
        for k in range(2)
    ]
    _write_task(root, "image2image_retrieval", retrieval)
    all_json = tmp_path / "VLMEvalKit" / "all.json"
    all_json.parent.mkdir()
    all_json.write_text(json.dumps(forgery + retrieval, indent=2))
    return root, task_file, all_json


def test_options_that_name_images(mmiu):
    assert option_images(ORDINAL_OPTIONS) == [("A", 0), ("B", 1), ("C", 2), ("D", 3)]
    assert option_images("A. The second image.\nB. the first image\n") == [("A", 1), ("B", 0)]
    assert option_images("A: Yes\nB: No") is None
    assert option_images("A: The sky in the first image\nB: the second image") is None
    assert option_images("") is None


def test_task_file_converts_to_the_expected_items(mmiu):
    # No --images: the images are found beside the task's own file.
    task, items, skipped = read_mmiu(mmiu[1], num_candidates=4)
    assert task == FORGERY
    assert [it.answer for it in items] == [a for _, _, a in FORGERY_QUESTIONS]
    assert dict(skipped) == {"options not images": 1, "other N": 1}
    for k, it in enumerate(items):
        assert it.id == f"{FORGERY}-{k:05d}"
        assert it.question == QUESTION and it.query == QUESTION
        assert [p.name for p in it.images] == [f"{FORGERY}_{k}_{j}.jpg" for j in range(4)]
        assert it.extra == {"source": "mmiu", "task": FORGERY, "mmiu_index": k}


def test_cli_holds_out_calibration_items_and_counts_skips(mmiu, tmp_path, capsys):
    root, task_file, _ = mmiu
    out = tmp_path / "forgery.jsonl"
    args = ["data", "mmiu", str(task_file), "--images", str(root), "-n", "4"]
    assert main([*args, "--calibration-items", "2", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert f"Wrote 4 items of task {FORGERY}" in printed
    assert "Wrote 2 calibration items" in printed
    assert "Skipped 2 questions (options not images: 1, other N: 1)" in printed
    evaluation = read_items(out, num_candidates=4)
    calibration = read_items(tmp_path / "forgery.calibration.jsonl", num_candidates=4)
    ids = [it.id for it in evaluation] + [it.id for it in calibration]
    assert sorted(ids) == [f"{FORGERY}-{k:05d}" for k in range(6)]  # disjoint, all converted
    by_id = {it.id: it for it in [*evaluation, *calibration]}
    for k, (_, _, answer) in enumerate(FORGERY_QUESTIONS):
        assert by_id[f"{FORGERY}-{k:05d}"].answer == answer
        assert by_id[f"{FORGERY}-{k:05d}"].question == QUESTION
    # Same seed, same split; the items file round-trips its questions.
    again = tmp_path / "again.jsonl"
    assert main([*args, "--calibration-items", "2", "--out", str(again)]) == 0
    assert again.read_text() == out.read_text()


def test_all_json_needs_a_task_and_finds_images_under_the_root(mmiu, tmp_path, capsys):
    root, _, all_json = mmiu
    out = str(tmp_path / "x.jsonl")
    assert main(["data", "mmiu", str(all_json), "--images", str(root), "--out", out]) == 1
    err = capsys.readouterr().err
    assert f"holds 2 tasks; choose one with --task: {FORGERY} (8), image2image_retrieval (2)" in err
    args = ["data", "mmiu", str(all_json), "--images", str(root), "--out", out]
    assert main([*args, "--task", "image2image_retrieval", "--calibration-items", "0"]) == 1
    err = capsys.readouterr().err
    assert "0 questions of task 'image2image_retrieval' have one image per option" in err
    assert "not one option per image: 2" in err
    # Two N in one task: the user chooses.
    assert main([*args, "--task", FORGERY]) == 1
    assert "(N = 2 (1), N = 4 (6)); choose one with --num-candidates" in capsys.readouterr().err
    result = import_mmiu(all_json, out, task=FORGERY, images_dir=root, num_candidates=2,
                         calibration_items=0)  # fmt: skip
    assert (result.items, result.skipped) == (1, {"options not images": 1, "other N": 6})


def test_bad_entries_are_named(mmiu, tmp_path):
    root, task_file, _ = mmiu
    entries = json.loads(task_file.read_text())
    entries[2]["output"] = "E"
    task_file.write_text(json.dumps(entries))
    with pytest.raises(DataError, match=r"entry 2: 'output' 'E' is not one of the options"):
        read_mmiu(task_file)
    entries[2]["output"] = "A"
    del entries[3]["options"]
    task_file.write_text(json.dumps(entries))
    with pytest.raises(DataError, match=r"entry 3: missing key 'options'"):
        read_mmiu(task_file)
    entries[3]["options"] = ORDINAL_OPTIONS
    entries[0]["input_image_path"][1] = "./Low-level-semantic/gone.jpg"
    task_file.write_text(json.dumps(entries))
    with pytest.raises(DataError, match=r"entry 0: image './Low-level-semantic/gone.jpg' is not"):
        read_mmiu(task_file, images_dir=root)
    _, items, skipped = read_mmiu(task_file, images_dir=root, num_candidates=4, skip_missing=True)
    assert skipped["missing image"] == 1 and len(items) == 5
    with pytest.raises(DataError, match="no question of task 'nope'"):
        read_mmiu(task_file, task="nope")
