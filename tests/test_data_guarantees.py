"""What lad guarantees for converted data (docs/errors.md, "Converted data"), one test per class:
names unique by construction, paths confined to the folder the user named, one error line
instead of a traceback, what lad writes is what its own reader reads, bounded memory, and a
refusal or a killed run leaving nothing behind. Fixtures are the released schemas of
tests/test_data_hub.py and tests/test_data_mmiu.py, written with pyarrow."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image

from lad.cli import main
from lad.data.blink import import_blink
from lad.data.items import read_items
from lad.data.mmiu import read_mmiu
from lad.data.muirbench import import_muirbench
from lad.errors import DataError
from lad.io.files import read_json
from tests.data_fixtures import make_images
from tests.test_data_hub import (
    BLINK_SCHEMA,
    LATTER,
    MUIR_SCHEMA,
    PICK,
    RETRIEVE,
    SIMILAR,
    _blink,
    _muir,
)
from tests.test_data_mmiu import FAKE, FORGERY, FORGERY_OPTIONS, _row

ROOT = Path(__file__).resolve().parent.parent


def _one_error(capsys, args: list) -> str:
    code = main([str(a) for a in args])
    captured = capsys.readouterr()
    assert code == 1, captured
    assert captured.err.startswith("Error: ") and captured.err.count("\n") == 1, captured.err
    assert "Traceback" not in captured.err
    return captured.err


def _blink_file(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows, schema=BLINK_SCHEMA), path)
    return path


def _similar(idx: str, pictures, answer: str = "(A)") -> dict:
    return _blink(idx, "Visual_Similarity", SIMILAR, LATTER, answer, pictures)


def _shows_its_own_pictures(items, rows: dict[str, dict]) -> None:
    """Each item's pictures hold the bytes of its own row's cells (reference, then choices)."""
    for it in items:
        row = rows[it.extra["blink_idx"]]
        cells = [row[f"image_{k}"]["bytes"] for k in (1, 2, 3)]
        assert [p.read_bytes() for p in it.context_images] == cells[:1], it.id
        assert [p.read_bytes() for p in it.images] == cells[1:], it.id


# ---------------------------------------------------------------- 1. two things to one name


def test_pictures_never_share_a_name_and_ids_are_unique(tmp_path):
    """Ids that sanitise alike ("val/1", "val_1"), a repeated id, and a second conversion into
    the same pictures folder: every item still shows its own pictures."""
    rows = [
        _similar("val/1", range(0, 3)),
        _similar("val_1", range(3, 6)),  # the same file-name stem as "val/1"
        _similar("val_2", range(6, 9)),
        _similar("val_2", range(9, 12)),  # a repeated id
        _similar("val_3", range(12, 15)),
    ]
    pictures = tmp_path / "pictures"
    first = import_blink(
        _blink_file(tmp_path / "a" / "val.parquet", rows),
        tmp_path / "a.jsonl",
        pictures=pictures,
        calibration_items=0,
    )
    assert first.summary["tasks"]["Visual_Similarity"] == {
        "converted": 3,
        "skipped": {"duplicate id": 2},  # blink-val_1 twice ("val/1" first), blink-val_2 twice
    }
    first_rows = {r["idx"]: r for r in reversed(rows)}  # a repeated id: its first row converts
    _shows_its_own_pictures(read_items(tmp_path / "a.jsonl"), first_rows)
    # Another dataset with the same ids, into the same folder: the first output is untouched.
    other = [_similar(r["idx"], range(30 + 3 * k, 33 + 3 * k)) for k, r in enumerate(rows)]
    import_blink(
        _blink_file(tmp_path / "b" / "val.parquet", other),
        tmp_path / "b.jsonl",
        pictures=pictures,
        calibration_items=0,
    )
    _shows_its_own_pictures(read_items(tmp_path / "a.jsonl"), first_rows)
    other_rows = {r["idx"]: r for r in reversed(other)}
    _shows_its_own_pictures(read_items(tmp_path / "b.jsonl"), other_rows)


def test_a_picture_file_with_other_bytes_is_never_replaced(tmp_path):
    rows = [_similar(f"val_{k}", range(3 * k, 3 * k + 3)) for k in range(2)]
    source = _blink_file(tmp_path / "val.parquet", rows)
    import_blink(source, tmp_path / "a.jsonl", pictures=tmp_path / "p", calibration_items=0)
    victim = read_items(tmp_path / "a.jsonl")[0].images[0]
    victim.write_bytes(b"another item's picture")
    with pytest.raises(DataError, match="never replaces a file an item may point to"):
        import_blink(source, tmp_path / "b.jsonl", pictures=tmp_path / "p", calibration_items=0)
    assert victim.read_bytes() == b"another item's picture"


# ---------------------------------------------------------------- 2. reading outside the root


def test_picture_paths_stay_inside_the_dataset_folder(tmp_path):
    root = tmp_path / "MMIU"
    task = root / "Low" / FORGERY
    names = make_images(task, 4)
    secret = make_images(tmp_path / "elsewhere", 1)[0]
    outside = tmp_path / "elsewhere" / secret
    (task / "link.jpg").symlink_to(outside)
    inside = [f"./Low/{FORGERY}/{n}" for n in names]
    rows = [
        _row(FORGERY, 0, 4, FORGERY_OPTIONS, FAKE, "A"),
        _row(FORGERY, 1, 4, FORGERY_OPTIONS, FAKE, "B"),
        _row(FORGERY, 2, 4, FORGERY_OPTIONS, FAKE, "C"),
        _row(FORGERY, 3, 4, FORGERY_OPTIONS, FAKE, "D"),
    ]
    rows[0]["input_image_path"] = inside
    rows[1]["input_image_path"] = [*inside[:3], str(outside)]  # absolute, outside
    rows[2]["input_image_path"] = [*inside[:3], f"../elsewhere/{secret}"]  # climbs out
    rows[3]["input_image_path"] = [*inside[:3], f"./Low/{FORGERY}/link.jpg"]  # a symlink out
    questions = root / "all.json"
    questions.write_text(json.dumps(rows))
    _, converted = read_mmiu(questions, images_dir=root)
    assert [it.id for it in converted.items] == [f"{FORGERY}-00000"]
    assert dict(converted.skipped[FORGERY]) == {"picture outside the dataset folder": 3}
    assert all(p.is_relative_to(root.resolve()) for p in converted.items[0].images)


# ---------------------------------------------------------------- 3. one line, no traceback


def _muir_file(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows, schema=MUIR_SCHEMA), path)
    return path


def _bomb() -> dict:
    buffer = io.BytesIO()
    Image.new("1", (14_000, 14_000)).save(buffer, format="PNG")  # 196 M pixels, a few kB
    return {"bytes": buffer.getvalue(), "path": "bomb.png"}


def test_bad_inputs_are_one_error_line(tmp_path, capsys, monkeypatch):
    row = _muir("0", "Visual Retrieval", RETRIEVE, PICK, "A", range(5))
    row["image_list"][3] = _bomb()
    source = _muir_file(tmp_path / "bomb" / "test.parquet", [row])
    err = _one_error(capsys, ["data", "muirbench", source, "--out", tmp_path / "m.jsonl"])
    assert "row 0: a picture: 14000 × 14000" in err and "LAD_MAX_IMAGE_PIXELS=" in err
    # lad's pixel limit holds for extracted pictures as for every picture it opens.
    small = _muir_file(tmp_path / "ok" / "test.parquet", [_muir("0", "T", RETRIEVE, PICK, "A",
                                                                range(5))])  # fmt: skip
    monkeypatch.setenv("LAD_MAX_IMAGE_PIXELS", "100")
    err = _one_error(capsys, ["data", "muirbench", small, "--out", tmp_path / "s.jsonl"])
    assert "is more than the limit of 100" in err
    monkeypatch.delenv("LAD_MAX_IMAGE_PIXELS")
    # An image_list of the wrong type (a JSON export), an empty picture path (MMIU).
    wrong = dict(_muir("0", "T", RETRIEVE, PICK, "A", []), image_list=5)
    (tmp_path / "wrong.json").write_text(json.dumps([wrong]))
    err = _one_error(capsys, ["data", "muirbench", tmp_path / "wrong.json", "--out",
                              tmp_path / "w.jsonl"])  # fmt: skip
    assert "entry 0: 'image_list' must be a list of pictures, got int" in err
    empty = _row(FORGERY, 0, 4, FORGERY_OPTIONS, FAKE, "A")
    for p, name in zip(empty["input_image_path"], make_images(tmp_path / "pics", 4), strict=True):
        (tmp_path / p).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "pics" / name).rename(tmp_path / p)
    empty["input_image_path"][2] = ""
    (tmp_path / "empty.json").write_text(json.dumps([empty]))
    err = _one_error(capsys, ["data", "mmiu", tmp_path / "empty.json", "--out",
                              tmp_path / "e.jsonl"])  # fmt: skip
    assert "entry 0: image '' is not under" in err


def test_deeply_nested_json_is_refused_in_one_line(tmp_path, capsys):
    deep = "[" * 100_000 + "]" * 100_000
    (tmp_path / "q.json").write_text(deep)
    (tmp_path / "q.jsonl").write_text(deep + "\n")
    for name in ("q.json", "q.jsonl"):
        err = _one_error(capsys, ["data", "mmiu", tmp_path / name, "--out", tmp_path / "x.jsonl"])
        assert "JSON nested too deeply" in err
    (tmp_path / "items.jsonl").write_text(deep + "\n")
    with pytest.raises(DataError, match=r"items\.jsonl:1: JSON nested too deeply"):
        read_items(tmp_path / "items.jsonl")
    with pytest.raises(DataError, match=r"q\.json: JSON nested too deeply"):
        read_json(tmp_path / "q.json", DataError)


# ---------------------------------------------------------------- 4. wrong or silent


def test_what_a_converter_writes_its_own_reader_reads(tmp_path):
    """A 30-option question would be an item no label scheme names: skipped and counted."""
    rows = [
        _muir("0", "T", "Which one? <image>", ["<image>"] * 30, "A", range(31)),
        _muir("1", "T", "Which one? <image>", PICK, "B", range(40, 45)),
        _muir("2", "T", "Which one? <image>", PICK, "C", range(50, 55)),
    ]
    out = tmp_path / "m.jsonl"
    source = _muir_file(tmp_path / "t.parquet", rows)
    written = import_muirbench(source, out, calibration_items=0)
    # Not refused as a second N beside the others' 4 either: it is no item lad reads.
    assert written.summary["tasks"]["T"] == {
        "converted": 2,
        "skipped": {"more than 26 candidates": 1},
    }
    assert [it.id for it in read_items(out)] == ["muirbench-1", "muirbench-2"]


def test_one_parquet_under_two_names_is_read_once(tmp_path):
    rows = [_similar(f"val_{k}", range(3 * k, 3 * k + 3)) for k in range(3)]
    folder = tmp_path / "BLINK" / "Visual_Similarity"
    source = _blink_file(folder / "val-00000-of-00001.parquet", rows)
    os.link(source, folder / "copy.parquet")
    (folder / "link.parquet").symlink_to(source.name)
    written = import_blink(tmp_path / "BLINK", tmp_path / "b.jsonl", calibration_items=0)
    assert written.summary["tasks"]["Visual_Similarity"] == {"converted": 3, "skipped": {}}


def test_pictures_that_lad_does_not_read_are_refused(tmp_path, capsys):
    """PostScript (PIL would run Ghostscript), --pictures naming a file; a truncated PNG skips
    its question alone, counted."""
    eps = b"%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 10 10\nshowpage\n%%EOF\n"
    truncated = _noise_png(64)[:2000]
    row = _similar("val_1", range(3))
    row["image_2"] = {"bytes": truncated, "path": "x.png"}
    source = _blink_file(tmp_path / "cut" / "val.parquet", [row, _similar("val_2", range(3, 6))])
    written = import_blink(source, tmp_path / "cut.jsonl", calibration_items=0)
    assert written.summary["tasks"]["Visual_Similarity"] == {
        "converted": 1, "skipped": {"picture that does not decode": 1}
    }  # fmt: skip
    for name, data in (("eps", eps),):
        row = _similar("val_1", range(3))
        row["image_2"] = {"bytes": data, "path": f"x.{name}"}
        source = _blink_file(tmp_path / name / "val.parquet", [row, _similar("val_2", range(3, 6))])
        err = _one_error(capsys, ["data", "blink", source, "--calibration-items", "0", "--out",
                                  tmp_path / f"{name}.jsonl"])  # fmt: skip
        assert "row 0: a picture's bytes are not an image lad reads" in err, err
        assert not (tmp_path / f"{name}-pictures").exists()  # and nothing left behind
    (tmp_path / "a-file").write_text("")
    source = _blink_file(tmp_path / "ok" / "val.parquet", [_similar("val_1", range(3))])
    err = _one_error(capsys, ["data", "blink", source, "--pictures", tmp_path / "a-file",
                              "--out", tmp_path / "p.jsonl"])  # fmt: skip
    assert "--pictures" in err and "is a file, not a folder" in err


def _noise_png(side: int) -> bytes:
    noise = np.random.default_rng(side).integers(0, 256, (side, side, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(noise).save(buffer, format="PNG")
    return buffer.getvalue()


def test_the_check_before_model_work_decodes_every_picture(tmp_path):
    from lad.data.items import Item
    from lad.run.preflight import check_images

    good, bad = tmp_path / "good.png", tmp_path / "bad.png"
    good.write_bytes(_noise_png(64))
    bad.write_bytes(_noise_png(64)[:2000])  # a whole header, half the pixels
    check_images([Item("a", "q", [good, good], 0)])
    with pytest.raises(DataError, match=r"bad\.png: cannot read image"):
        check_images([Item("a", "q", [good, bad], 0)])


def test_an_out_near_the_name_limit_is_written_and_named(tmp_path):
    rows = [_similar(f"val_{k}", range(3 * k, 3 * k + 3)) for k in range(2)]
    source = _blink_file(tmp_path / "val.parquet", rows)
    out = tmp_path / ("b" * 240 + ".jsonl")  # its temporary sibling's name would be too long
    assert main(["data", "blink", str(source), "--calibration-items", "0", "--pictures",
                 str(tmp_path / "p"), "--out", str(out)]) == 0  # fmt: skip
    assert len(read_items(out)) == 2
    assert not [p for p in tmp_path.iterdir() if ".tmp" in p.name]


def test_a_killed_conversions_temporary_files_are_removed(tmp_path):
    from lad.io.files import _temporary_name

    rows = [_similar(f"val_{k}", range(3 * k, 3 * k + 3)) for k in range(2)]
    source = _blink_file(tmp_path / "val.parquet", rows)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    live = str(os.getppid())
    out, pictures = tmp_path / "b.jsonl", tmp_path / "b-pictures"
    pictures.mkdir()
    own = _temporary_name(out)  # .b.<host>.<pid>.tmp.jsonl
    left = [
        tmp_path / own.replace(f".{os.getpid()}.", f".{dead}."),
        pictures / own.replace(".b.", ".0a1b.").replace(f".{os.getpid()}.", f".{dead}."),
    ]
    running = tmp_path / own.replace(f".{os.getpid()}.", f".{live}.")
    for p in [*left, running]:
        p.write_text("half")
    import_blink(source, out, calibration_items=0)
    assert not any(p.exists() for p in left)  # a killed lad's: removed
    assert running.read_text() == "half"  # a running process's: kept


# ---------------------------------------------------------------- 5. bounded


def test_parquet_is_read_a_batch_at_a_time(tmp_path):
    """Arrow's peak memory while converting stays well below the file's pictures (the whole
    table was read at once before): measured in a fresh process, whose pool starts empty."""
    pictures = [{"bytes": _noise_png(96 + k), "path": None} for k in range(60)]
    rows = []
    for k in range(72):
        row = _muir(str(k), "T" if k % 2 else "U", RETRIEVE, PICK, "A", [])
        row["image_list"] = pictures[k % 12 * 5 : k % 12 * 5 + 5]
        rows.append(row)
    source = tmp_path / "t.parquet"
    pq.write_table(pa.Table.from_pylist(rows, schema=MUIR_SCHEMA), source, row_group_size=4)
    total = sum(len(c["bytes"]) for r in rows for c in r["image_list"])
    script = (
        "import sys, pyarrow as pa; from lad.data.muirbench import import_muirbench; "
        "import_muirbench(sys.argv[1], sys.argv[2], task='T', calibration_items=1); "
        "print(pa.default_memory_pool().max_memory())"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(source), str(tmp_path / "m.jsonl")],
        capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}, check=True,
    )  # fmt: skip
    assert len(read_items(tmp_path / "m.jsonl")) == 35
    # A row group at a time: about 6.6 MB here whatever the file's size (reading the whole
    # table peaked at 2.3 times the pictures' bytes, 27 MB of a 12 MB file).
    assert int(done.stdout.split()[-1]) < total / 2, (done.stdout, total)


# ---------------------------------------------------------------- 6. the commands


def test_released_commands_take_q_and_a_refusal_leaves_nothing(tmp_path, capsys):
    rows = [_similar(f"val_{k}", range(3 * k, 3 * k + 3)) for k in range(3)]
    source = _blink_file(tmp_path / "val.parquet", rows)
    out = tmp_path / "b.jsonl"
    assert main(["data", "blink", str(source), "-q", "--out", str(out)]) == 1  # too few for 5
    capsys.readouterr()
    assert not (tmp_path / "b-pictures").exists() and not out.exists()
    assert main(["data", "blink", str(source), "-q", "--calibration-items", "1",
                 "--out", str(out)]) == 0  # fmt: skip
    printed = capsys.readouterr().out
    assert "Wrote 2 items" in printed and "Visual_Similarity: converted" not in printed


def test_an_orders_file_nested_too_deeply_is_refused(tmp_path):
    from lad.data.orders import read_orders

    (tmp_path / "orders.jsonl").write_text("[" * 100_000 + "]" * 100_000 + "\n")
    with pytest.raises(DataError, match=r"orders\.jsonl:1: JSON nested too deeply"):
        read_orders(tmp_path / "orders.jsonl", 2)


def test_a_json_lines_question_file_keeps_u2028_inside_its_text(tmp_path):
    """JSON allows a raw U+2028 or U+0085 in a string: a line break to str.splitlines(), not to
    JSON Lines."""
    from lad.data.questions import Questions
    from lad.data.textjsonl import _ANY_ROWS

    path = tmp_path / "q.jsonl"
    rows = [{"task": "t", "question": "one\u2028two\x85three"}, {"task": "t", "question": "b"}]
    path.write_text("\n".join(json.dumps(r, ensure_ascii=False) for r in rows) + "\n")
    read = [row.fields["question"] for row in Questions(path).rows(_ANY_ROWS, None)]
    assert read == ["one\u2028two\x85three", "b"]
