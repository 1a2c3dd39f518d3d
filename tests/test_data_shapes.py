import hashlib
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from lad.cli import main
from lad.data.items import read_items
from lad.data.shapes import (
    COLOURS,
    SHAPES,
    Shape,
    all_scenes,
    build_shapes,
    describe,
    scene_distance,
    scene_split,
    shapes_vocabulary,
)
from lad.errors import DataError

SCENE_OF = {describe(s): s for s in all_scenes(4)}


def _png_hashes(items) -> set[str]:
    return {hashlib.sha256(p.read_bytes()).hexdigest() for it in items for p in it.images}


def _colours_in(path: Path) -> set[str]:
    """Colours covering a visible patch of the image (anti-aliased edges are ignored)."""
    pixels = np.asarray(Image.open(path).convert("RGB")).reshape(-1, 3).astype(int)
    found = set()
    for name, rgb in COLOURS.items():
        close = np.abs(pixels - np.array(rgb)).sum(axis=1) < 30
        if close.sum() >= 12:
            found.add(name)
    return found


@pytest.mark.parametrize("setting", ["random", "adversarial"])
def test_each_query_describes_exactly_the_answer_image(tmp_path, setting):
    path = build_shapes(tmp_path, num_candidates=5, setting=setting, items=12, seed=3)
    for it in read_items(path, num_candidates=5):
        descriptions = it.extra["descriptions"]
        assert [d == it.query for d in descriptions].count(True) == 1
        assert descriptions[it.answer] == it.query
        assert len(set(descriptions)) == 5
        for image, text in zip(it.images, descriptions, strict=True):
            assert _colours_in(image) == {s.colour for s in SCENE_OF[text]}
            assert Image.open(image).size == (64, 64)


def test_same_seed_same_files_and_other_seed_differs(tmp_path):
    a = build_shapes(tmp_path / "a", num_candidates=4, setting="adversarial", items=6, seed=1)
    b = build_shapes(tmp_path / "b", num_candidates=4, setting="adversarial", items=6, seed=1)
    c = build_shapes(tmp_path / "c", num_candidates=4, setting="adversarial", items=6, seed=2)
    assert a.read_text() == b.read_text()
    assert _png_hashes(read_items(a)) == _png_hashes(read_items(b))
    assert a.read_text() != c.read_text()


def test_splits_share_no_query_and_no_image(tmp_path):
    built = {
        split: read_items(
            build_shapes(tmp_path / split, num_candidates=6, items=40, split=split, seed=0)
        )
        for split in ("train", "eval", "calibration")
    }
    queries = {s: {it.query for it in items} for s, items in built.items()}
    hashes = {s: _png_hashes(items) for s, items in built.items()}
    for a, b in [("train", "eval"), ("train", "calibration"), ("eval", "calibration")]:
        assert not queries[a] & queries[b]
        assert not hashes[a] & hashes[b]
    for split, items in built.items():
        assert all(scene_split(SCENE_OF[it.query]) == split for it in items)


def test_query_split_does_not_depend_on_the_seed(tmp_path):
    a = read_items(build_shapes(tmp_path / "a", num_candidates=3, items=30, split="eval", seed=0))
    b = read_items(build_shapes(tmp_path / "b", num_candidates=3, items=30, split="train", seed=9))
    assert not {it.query for it in a} & {it.query for it in b}


def test_answer_position_is_balanced_and_follows_weights(tmp_path):
    path = build_shapes(tmp_path / "u", num_candidates=4, items=42, seed=5, image_size=16)
    counts = Counter(it.answer for it in read_items(path))
    assert sorted(counts) == [0, 1, 2, 3]
    assert max(counts.values()) - min(counts.values()) <= 1
    path = build_shapes(
        tmp_path / "w", num_candidates=4, items=40, seed=5, image_size=16,
        position_weights=[2, 1, 1, 0],
    )  # fmt: skip
    assert Counter(it.answer for it in read_items(path)) == {0: 20, 1: 10, 2: 10}


def test_adversarial_distractors_are_nearest_scenes(tmp_path):
    path = build_shapes(tmp_path, num_candidates=4, setting="adversarial", items=20, seed=0)
    for it in read_items(path):
        answer = SCENE_OF[it.query]
        for text in it.extra["descriptions"]:
            if text != it.query:
                # every scene has ≥ 9 neighbours one attribute edit away, so N−1 = 3 are found
                assert scene_distance(answer, SCENE_OF[text]) == 1


def test_scene_distance_counts_attribute_edits():
    a = (Shape("blue", "circle"), Shape("red", "square"))
    b = (Shape("red", "circle"), Shape("blue", "square"))
    assert scene_distance(a, b) == 2
    assert scene_distance(a, (Shape("red", "circle"), Shape("red", "square"))) == 1
    assert scene_distance(a, a) == 0


def test_vocabulary_covers_every_query():
    vocabulary = set(shapes_vocabulary())
    assert set(COLOURS) | set(SHAPES) <= vocabulary
    assert all(set(describe(s).split()) <= vocabulary for s in all_scenes(4))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"setting": "hard"}, "'setting' parameter must be one of"),
        ({"split": "test"}, "'split' parameter must be one of"),
        ({"num_candidates": 1}, "--num-candidates must be between 2 and 26"),
        ({"max_shapes": 5}, "--max-shapes must be between 1 and 4"),
        ({"position_weights": [1, 1]}, "--position-weights must be 4 non-negative numbers"),
        ({"position_weights": [1e308, 1e308, 1, 1]}, "sum times the item count is finite"),
        ({"image_size": 15}, "--picture-side must be between 16 and 1024 pixels"),
    ],
)
def test_bad_arguments_are_clear_errors(tmp_path, kwargs, message):
    args = {"num_candidates": 4, "items": 2, **kwargs}
    with pytest.raises(DataError, match=message):
        build_shapes(tmp_path / "out", **args)
    assert not (tmp_path / "out").exists()  # refused before anything is written


def test_cli_builds_and_reports_errors(tmp_path, capsys):
    out = tmp_path / "shapes"
    argv = ["data", "shapes", "-n", "3", "--items", "3", "--out", str(out)]
    assert main([*argv, "--setting", "adversarial", "--image-size", "32"]) == 0
    assert len(read_items(out / "items.jsonl", num_candidates=3)) == 3
    assert main([*argv, "--position-weights", "1,2"]) == 1
    assert capsys.readouterr().err.startswith("Error: --position-weights must be 3")
    for flag in ("--picture-side", "--image-size"):  # the flag's old name says its new one
        assert main([*argv, flag, "15"]) == 1
        assert capsys.readouterr().err.startswith("Error: --picture-side must be between 16")
