"""`lad serve` reads only pictures inside its image root (lad.io.files.inside): a client names no
other file of the server's, by `..`, an absolute path or a symlink. No engine is needed."""

from __future__ import annotations

from pathlib import Path

import pytest
from PIL import Image

from lad.errors import LadError
from lad.run.serve import _item


@pytest.fixture
def root(tmp_path: Path) -> Path:
    inside = tmp_path / "root"
    inside.mkdir()
    for name in ("a.png", "b.png"):
        Image.new("RGB", (8, 8)).save(inside / name)
    Image.new("RGB", (8, 8)).save(tmp_path / "secret.png")
    (inside / "link.png").symlink_to(tmp_path / "secret.png")
    return inside


def test_paths_inside_the_root_relative_or_absolute_are_read(root: Path) -> None:
    item = _item({"query": "x", "images": ["a.png", str(root / "b.png")]}, 0, root)
    assert item.images == [root / "a.png", root / "b.png"]


@pytest.mark.parametrize(
    "escape", ["../secret.png", "{outside}", "link.png", "{root}/../secret.png"]
)
def test_a_path_that_lands_outside_the_root_is_refused_in_one_line(root: Path, escape: str) -> None:
    path = escape.format(outside=root.parent / "secret.png", root=root)
    with pytest.raises(LadError, match=r"'images'\[1\]: .* is outside") as e:
        _item({"query": "x", "images": ["a.png", path]}, 0, root)
    assert "\n" not in str(e.value)


def test_a_missing_picture_is_named(root: Path) -> None:
    with pytest.raises(LadError, match=r"'images'\[1\]: 'gone.png' is no file in"):
        _item({"query": "x", "images": ["a.png", "gone.png"]}, 0, root)
