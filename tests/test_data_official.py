import json

import pytest

from lad.cli import main
from lad.data.items import read_items
from lad.data.official import export_official, read_official
from lad.errors import DataError
from tests.data_fixtures import make_images


@pytest.fixture
def official(tmp_path):
    names = make_images(tmp_path / "val2014", 6)
    entries = [
        {
            "id": i,
            "image_ids": [f"/home/author/data/val2014/{n}" for n in names[i : i + 4]],
            "index": i % 4,
            "target": names[i + i % 4],
            "caption": f"caption number {i}",
        }
        for i in range(3)
    ]
    path = tmp_path / "annotations_4_1_adversarial.json"
    path.write_text(json.dumps(entries, indent=2))
    return path, tmp_path / "val2014", entries


def test_import_keeps_ids_order_answers_and_resolves_images(official, tmp_path):
    path, images, entries = official
    out = tmp_path / "items.jsonl"
    assert main(["data", "import", str(path), "--images", str(images), "--out", str(out)]) == 0
    items = read_items(out, num_candidates=4)
    assert [it.id for it in items] == ["0", "1", "2"]
    for it, entry in zip(items, entries, strict=True):
        assert it.query == entry["caption"] and it.answer == entry["index"]
        assert [p.name for p in it.images] == [p.rsplit("/", 1)[1] for p in entry["image_ids"]]
        assert it.images[it.answer].name == entry["target"]
        assert it.extra["setting"] == "adversarial"


def test_import_export_round_trips(official, tmp_path):
    path, images, entries = official
    again = tmp_path / "again.json"
    export_official(read_official(path, images), again)
    assert json.loads(again.read_text()) == entries
    assert read_official(again, images)[1].images == read_official(path, images)[1].images


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda e: e[1].pop("caption"), r"entry 1: missing key 'caption'"),
        (lambda e: e[0].update(index=4), r"entry 0: 'index' 4 is not a position in its 4"),
        (lambda e: e[2].update(target="other.jpg"), r"entry 2: 'target' 'other.jpg' is not"),
        (lambda e: e[0]["image_ids"].append("x/gone.jpg"), r"entry 0: image 'x/gone.jpg' is not"),
        (lambda e: e[2].update(id=0), r"entry ids are not unique"),
    ],
)
def test_bad_entries_name_the_file_and_entry(official, edit, message):
    path, images, entries = official
    edit(entries)
    path.write_text(json.dumps(entries))
    with pytest.raises(DataError, match=message):
        read_official(path, images)


def test_cli_import_error_is_one_line(official, tmp_path, capsys):
    path, _, _ = official
    argv = ["data", "import", str(path), "--images", str(tmp_path / "nowhere")]
    assert main([*argv, "--out", str(tmp_path / "o.jsonl")]) == 1
    assert capsys.readouterr().err == f"Error: {tmp_path / 'nowhere'}: no such image folder\n"


def _without_ids(official):
    path, images, entries = official
    for e in entries:
        del e["id"]
    entries[1].pop("target")  # targets are optional, with or without ids
    bare = path.with_name("annotations_4_1_random.json")
    bare.write_text(json.dumps(entries, indent=2))
    return bare, images, entries


def test_id_less_entries_get_ids_from_file_and_position_and_the_cli_says_so(
    official, tmp_path, capsys
):
    path, images, entries = _without_ids(official)
    out = tmp_path / "items.jsonl"
    assert main(["data", "import", str(path), "--images", str(images), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "no 'id'" in printed and "annotations_4_1_random-0" in printed
    items = read_items(out, num_candidates=4)
    assert [it.id for it in items] == [f"annotations_4_1_random-{i}" for i in range(3)]
    assert [it.answer for it in items] == [e["index"] for e in entries]
    assert [it.query for it in items] == [e["caption"] for e in entries]
    # Stable: the same file gives the same ids again.
    assert [it.id for it in read_official(path, images)] == [it.id for it in items]


def test_id_less_import_export_round_trips(official, tmp_path):
    path, images, entries = _without_ids(official)
    again = tmp_path / "again.json"
    export_official(read_items_of(path, images, tmp_path), again)
    assert json.loads(again.read_text()) == entries


def read_items_of(path, images, tmp_path):
    """Through the items file, as a user would: import, then read the jsonl back."""
    out = tmp_path / "via.jsonl"
    assert main(["data", "import", str(path), "--images", str(images), "--out", str(out)]) == 0
    return read_items(out)


def test_some_entries_with_ids_and_some_without_is_refused(official):
    path, images, entries = official
    del entries[2]["id"]
    path.write_text(json.dumps(entries))
    with pytest.raises(DataError, match=r"entry 2 has no 'id' but entry 0 has one"):
        read_official(path, images)
