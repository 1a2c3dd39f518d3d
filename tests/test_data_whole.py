"""A released benchmark converts whole: `lad data blink PATH` without --task or -n writes every
task and every N into one items file (each item keeps its task and N), holds out calibration items
of every N across its tasks, summarises per (task, N) cell, and `lad eval` runs on the result
with a cell per (task, N). Rows in BLINK's parquet schema (tests/test_data_hub.py)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lad.cli import main
from lad.data.blink import import_blink
from lad.data.items import read_items
from lad.errors import DataError
from tests.test_data_hub import BLINK_SCHEMA, LATTER, SIMILAR, _blink

FOUR = ["The first image", "The second image", "The third image", "The fourth image"]
ASK_FOUR = "Which image shows the same object as the others, from another view?"


def _rows() -> list[dict]:
    """Visual_Similarity: 7 questions of N = 2 (a reference and two candidates); Art_Style: 4 of
    N = 2; Multi-view: 7 of N = 4 and one without an answer (skipped, its N known); Counting: one
    whose choices are text (skipped before its N is known)."""
    rows, pic = [], 0
    for task, count in (("Visual_Similarity", 7), ("Art_Style", 4)):
        for k in range(count):
            rows.append(_blink(f"val_{task}_{k}", task, SIMILAR, LATTER, f"({'AB'[k % 2]})",
                               range(pic, pic + 3)))  # fmt: skip
            pic += 3
    for k in range(8):
        answer = f"({'ABCD'[k % 4]})" if k < 7 else ""
        rows.append(_blink(f"val_Multi-view_{k}", "Multi-view", ASK_FOUR, FOUR, answer,
                           range(pic, pic + 4)))  # fmt: skip
        pic += 4
    rows.append(_blink("val_Counting_0", "Counting", "How many?", ["0", "1"], "(A)", [pic]))
    return rows


@pytest.fixture
def whole(tmp_path: Path) -> Path:
    root = tmp_path / "BLINK"
    rows = _rows()
    for task in dict.fromkeys(r["sub_task"] for r in rows):
        (root / task).mkdir(parents=True)
        part = [r for r in rows if r["sub_task"] == task]
        table = pa.Table.from_pylist(part, schema=BLINK_SCHEMA)
        pq.write_table(table, root / task / "val-00000-of-00001.parquet")
    return root


def _cells(items) -> Counter:
    return Counter((it.extra["task"], it.num_candidates) for it in items)


def test_blink_converts_every_task_and_n_into_one_file(whole, tmp_path, capsys):
    out = tmp_path / "blink.jsonl"
    assert main(["data", "blink", str(whole), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    evaluation, held = read_items(out), read_items(tmp_path / "blink.calibration.jsonl")
    assert _cells([*evaluation, *held]) == {
        ("Visual_Similarity", 2): 7, ("Art_Style", 2): 4, ("Multi-view", 4): 7
    }  # fmt: skip
    # --calibration-items 5 of each N, its tasks in turn as the files are read (Art_Style/
    # before Visual_Similarity/): Art_Style, Visual_Similarity, Art_Style, ...
    assert _cells(held) == {("Visual_Similarity", 2): 2, ("Art_Style", 2): 3, ("Multi-view", 4): 5}
    assert not {it.id for it in evaluation} & {it.id for it in held}
    assert "Wrote 8 items to" in printed and "Wrote 10 calibration items to" in printed
    assert "  Visual_Similarity N=2: converted 7, held out 2" in printed
    assert "  Multi-view N=4: converted 7, held out 5; skipped 1 (no answer: 1)" in printed
    assert "  Counting (N not known): skipped 1 (options not pictures: 1)" in printed
    summary = json.loads((tmp_path / "blink.summary.json").read_text())
    cells = {(c["task"], c["num_candidates"]): c for c in summary["cells"]}
    assert cells[("Art_Style", 2)] == {
        "task": "Art_Style", "num_candidates": 2, "converted": 4, "held_out": 3, "items": 1,
        "skipped": {},
    }  # fmt: skip
    assert cells[("Multi-view", 4)]["skipped"] == {"no answer": 1}
    assert cells[("Counting", None)]["converted"] == 0
    assert summary["tasks"]["Multi-view"] == {"converted": 7, "skipped": {"no answer": 1}}
    # The same conversion again holds out the same items.
    again = import_blink(whole, tmp_path / "again.jsonl")
    assert [it.id for it in read_items(again.calibration_path)] == [it.id for it in held]


def test_num_candidates_and_task_still_narrow(whole, tmp_path):
    two = import_blink(whole, tmp_path / "two.jsonl", num_candidates=2)
    items = [*read_items(two.items_path), *read_items(two.calibration_path)]
    assert _cells(items) == {("Visual_Similarity", 2): 7, ("Art_Style", 2): 4}
    cells = {(c["task"], c["num_candidates"]): c for c in two.summary["cells"]}
    assert cells[("Multi-view", 4)]["skipped"] == {"no answer": 1, "other N": 7}
    one = import_blink(whole, tmp_path / "one.jsonl", task="Multi-view", calibration_items=2)
    assert _cells(read_items(one.items_path)) == {("Multi-view", 4): 5}


def test_a_refused_whole_conversion_leaves_nothing(whole, tmp_path):
    out = tmp_path / "new" / "deeper" / "blink.jsonl"
    with pytest.raises(DataError, match=r"4 questions converted .*too few to hold out"):
        import_blink(whole, out, task="Art_Style", calibration_items=4)
    with pytest.raises(
        DataError, match=r"7 questions of N = 4 converted, too few .*leave that N out"
    ):
        import_blink(whole, out, calibration_items=7)
    assert not (tmp_path / "new").exists()
    assert main(["data", "blink", str(whole), "--calibration-items", "7", "--out", str(out)]) == 1
    assert not (tmp_path / "new").exists()


def test_lad_eval_runs_a_cell_per_task_and_n(whole, tmp_path):
    out = tmp_path / "blink.jsonl"
    import_blink(whole, out)  # 5 calibration items of each N, lad eval's default |D_cal|
    run = tmp_path / "run"
    args = ["eval", "--model", "demo", "--data", str(out), "--out", str(run)]
    args += ["--calibration-data", str(tmp_path / "blink.calibration.jsonl")]
    args += ["--num-shuffles", "2", "--methods", "vanilla,lad", "--device", "cpu", "--quiet"]
    assert main(args) == 0
    metrics = json.loads((run / "metrics.json").read_text())
    assert sorted(metrics["cells"]) == ["Art_Style N=2", "Multi-view N=4", "Visual_Similarity N=2"]
    assert {c: m["num_items"] for c, m in metrics["cells"].items()} == {
        "Visual_Similarity N=2": 5, "Art_Style N=2": 1, "Multi-view N=4": 2
    }  # fmt: skip
    # Each N calibrates on exactly that N's held-out items.
    held = read_items(tmp_path / "blink.calibration.jsonl")
    for n in (2, 4):
        used = {json.loads(line)["item"] for line in (run / f"n{n}" / "calibration.jsonl").open()}
        assert used == {it.id for it in held if it.num_candidates == n}


def test_muirbench_converts_every_n_too(tmp_path):
    from lad.data.muirbench import import_muirbench
    from tests.test_data_hub import MUIR_SCHEMA, PICK, RETRIEVE, _muir

    match = "Which image shows a red kite over the beach?"
    rows = [_muir(f"r{k}", "Visual Retrieval", RETRIEVE, PICK, "ABCD"[k], range(5 * k, 5 * k + 5))
            for k in range(3)]  # fmt: skip
    for k, n in enumerate((2, 3, 2, 3)):
        pictures = range(20 + 4 * k, 20 + 4 * k + n)
        rows.append(_muir(f"m{k}", "Image-Text Matching", match, PICK[:n], "AB"[k % 2], pictures))
    folder = tmp_path / "MUIRBENCH" / "data"
    folder.mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist(rows, schema=MUIR_SCHEMA), folder / "test.parquet")
    written = import_muirbench(folder, tmp_path / "m.jsonl", calibration_items=1)
    items, held = read_items(written.items_path), read_items(written.calibration_path)
    assert _cells([*items, *held]) == {
        ("Visual Retrieval", 4): 3, ("Image-Text Matching", 2): 2, ("Image-Text Matching", 3): 2
    }  # fmt: skip
    assert Counter(it.num_candidates for it in held) == {2: 1, 3: 1, 4: 1}
