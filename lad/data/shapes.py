"""The shapes benchmark (docs/data.md, "The shapes benchmark"): small drawings of coloured shapes,
each query naming a scene's objects in a fixed order, so an image matches a query iff its scene is
the query's; the candidates of one item always show distinct scenes.

Splits: a scene (= a query) belongs to one split by a fixed hash of its text, whatever the seed;
answers come only from the split's own scenes. Every drawing's exact layout also hashes to one
split, and drawings are redrawn until it is their own, so no two splits share a query or an image.
"""

from __future__ import annotations

import bisect
import hashlib
import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

from lad.data.builders import SETTINGS, balanced_positions, place_answer, seeded_rng
from lad.data.items import Item, write_items
from lad.errors import DataError, check_choice
from lad.io import limits
from lad.io.files import replacing

COLOURS: dict[str, tuple[int, int, int]] = {
    "red": (220, 30, 30),
    "green": (30, 160, 50),
    "blue": (30, 70, 220),
    "yellow": (240, 200, 20),
    "purple": (140, 50, 190),
    "cyan": (20, 190, 200),
}
SHAPES = ("circle", "square", "triangle", "diamond", "cross")
SPLITS = ("train", "eval", "calibration")
SPLIT_SHARES = {"train": 80, "eval": 15, "calibration": 5}  # percent of scenes (queries)
BACKGROUND = (235, 235, 235)
MAX_SHAPES = 4  # one object per cell of a 2×2 grid
MAX_IMAGE_SIZE = 1024  # pixels a side; drawn supersampled, so memory grows with its square
_SUPERSAMPLE = 4


@dataclass(frozen=True, order=True)
class Shape:
    colour: str
    shape: str


Scene = tuple[Shape, ...]  # objects in canonical (sorted) order, all distinct


def shapes_vocabulary() -> list[str]:
    """Every word a shapes query can contain, for building a tokenizer."""
    return ["a", "and", *COLOURS, *SHAPES]


def describe(scene: Scene) -> str:
    """The query of a scene: its objects in canonical order joined by 'and'."""
    return " and ".join(f"a {s.colour} {s.shape}" for s in scene)


def _bucket(text: str) -> int:
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little") % 100


def scene_split(scene: Scene) -> str:
    """The split a scene's query belongs to; fixed, whatever the seed."""
    bounds = list(itertools.accumulate(SPLIT_SHARES[s] for s in SPLITS))  # 80, 95, 100
    return SPLITS[bisect.bisect_right(bounds, _bucket("lad-shapes-query\0" + describe(scene)))]


@cache
def all_scenes(max_shapes: int) -> tuple[Scene, ...]:
    """Every scene of 1..max_shapes distinct objects."""
    objects = [Shape(c, s) for c in COLOURS for s in SHAPES]
    return tuple(
        scene for k in range(1, max_shapes + 1) for scene in itertools.combinations(objects, k)
    )


def scene_distance(a: Scene, b: Scene) -> int:
    """Attribute edits (recolour or reshape one object) that turn scene a into b, of a's size."""
    return min(
        sum((x.colour != y.colour) + (x.shape != y.shape) for x, y in zip(a, perm, strict=True))
        for perm in itertools.permutations(b)
    )


def _distractor_scenes(
    answer: Scene, k: int, setting: str, max_shapes: int, rng: np.random.Generator
) -> list[Scene]:
    others = [s for s in all_scenes(max_shapes) if s != answer]
    if setting == "random":
        return [others[i] for i in rng.choice(len(others), size=k, replace=False)]
    by_distance = _neighbours(answer, max_shapes)  # 29 or more scenes: k is 25 at most
    chosen: list[Scene] = []
    for group in by_distance:  # nearest first; a random pick within the boundary group
        take = min(k - len(chosen), len(group))
        chosen += [group[i] for i in sorted(rng.choice(len(group), size=take, replace=False))]
        if len(chosen) == k:
            break
    return chosen


@cache
def _neighbours(answer: Scene, max_shapes: int) -> tuple[tuple[Scene, ...], ...]:
    """Other scenes with as many objects as `answer`, grouped by edit distance, nearest first."""
    groups: dict[int, list[Scene]] = {}
    for s in all_scenes(max_shapes):
        if len(s) == len(answer) and s != answer:
            groups.setdefault(scene_distance(answer, s), []).append(s)
    return tuple(tuple(groups[d]) for d in sorted(groups))


def _layout(scene: Scene, image_size: int, rng: np.random.Generator) -> list[tuple[int, ...]]:
    """Per object (cell, size, x0, y0) in output pixels: one object per 2×2 cell, jittered."""
    cell = image_size // 2
    cells = rng.choice(4, size=len(scene), replace=False)
    boxes = []
    for c in cells:
        size = int(rng.integers(int(cell * 0.55), int(cell * 0.9) + 1))
        x0 = (c % 2) * cell + int(rng.integers(0, cell - size + 1))
        y0 = (c // 2) * cell + int(rng.integers(0, cell - size + 1))
        boxes.append((int(c), size, x0, y0))
    return boxes


def _draw_shape(
    draw: ImageDraw.ImageDraw, shape: str, box: tuple[int, int, int, int], fill: tuple[int, ...]
) -> None:
    x0, y0, x1, y1 = box
    cx, cy = (x0 + x1) / 2, (y0 + y1) / 2
    if shape == "circle":
        draw.ellipse(box, fill=fill)
    elif shape == "square":
        draw.rectangle(box, fill=fill)
    elif shape == "triangle":
        draw.polygon([(cx, y0), (x1, y1), (x0, y1)], fill=fill)
    elif shape == "diamond":
        draw.polygon([(cx, y0), (x1, cy), (cx, y1), (x0, cy)], fill=fill)
    else:  # a cross (SHAPES: a scene holds no other shape)
        t = (x1 - x0) / 3
        draw.rectangle((x0, cy - t / 2, x1, cy + t / 2), fill=fill)
        draw.rectangle((cx - t / 2, y0, cx + t / 2, y1), fill=fill)


def render_scene(scene: Scene, image_size: int, layout: Sequence[tuple[int, ...]]) -> Image.Image:
    """Draw a scene with the given layout, anti-aliased by drawing large and shrinking."""
    s = _SUPERSAMPLE
    big = Image.new("RGB", (image_size * s, image_size * s), BACKGROUND)
    draw = ImageDraw.Draw(big)
    for obj, (_, size, x0, y0) in zip(scene, layout, strict=True):
        box = (x0 * s, y0 * s, (x0 + size) * s - 1, (y0 + size) * s - 1)
        _draw_shape(draw, obj.shape, box, COLOURS[obj.colour])
    return big.resize((image_size, image_size), Image.Resampling.LANCZOS)


def _own_layout(
    scene: Scene, split: str, image_size: int, rng: np.random.Generator
) -> list[tuple[int, ...]]:
    """A layout whose drawing belongs to `split` (see the module docstring)."""
    for _ in range(1000):
        layout = _layout(scene, image_size, rng)
        key = f"lad-shapes-image\0{image_size}\0{describe(scene)}\0{sorted(layout)}"
        if SPLITS[_bucket(key) % len(SPLITS)] == split:
            return layout
    raise DataError(f"could not draw {describe(scene)!r} for split {split!r}; use larger images")


def build_shapes(
    out_dir: str | Path,
    *,
    num_candidates: int,
    setting: str = "random",
    items: int = 100,
    split: str = "eval",
    seed: int = 0,
    image_size: int = 64,
    max_shapes: int = 2,
    position_weights: Sequence[float] | None = None,
) -> Path:
    """Draw a shapes benchmark into out_dir (PNG images under images/) and return items.jsonl;
    the answer's position is balanced (or follows `position_weights`), the same arguments always
    give the same files."""
    check_choice("setting", setting, SETTINGS, DataError)
    check_choice("split", split, SPLITS, DataError)
    if not 2 <= num_candidates <= 26:
        raise DataError(f"--num-candidates must be between 2 and 26. Got {num_candidates}.")
    if items < 1:
        raise DataError(f"--items must be at least 1. Got {items}.")
    limits.GENERATED_ITEMS.check(items, f"--items {items}")
    if not 16 <= image_size <= MAX_IMAGE_SIZE:
        raise DataError(
            f"--picture-side must be between 16 and {MAX_IMAGE_SIZE} pixels. Got {image_size}."
        )
    if not 1 <= max_shapes <= MAX_SHAPES:
        raise DataError(f"--max-shapes must be between 1 and {MAX_SHAPES}. Got {max_shapes}.")
    answers = [s for s in all_scenes(max_shapes) if scene_split(s) == split]
    if not answers:
        raise DataError(f"no scene of at most {max_shapes} objects falls in split {split!r}")
    rng = seeded_rng(seed, "shapes", split, setting, num_candidates, max_shapes, image_size)
    positions = balanced_positions(items, num_candidates, rng, position_weights)
    out_dir = Path(out_dir)  # written only once every argument is known good
    built = []
    for i, position in enumerate(positions):
        answer = answers[int(rng.integers(len(answers)))]
        pool = [answer, *_distractor_scenes(answer, num_candidates - 1, setting, max_shapes, rng)]
        slots = place_answer(0, range(1, num_candidates), position, rng)  # indices into pool
        item_id = f"shapes-{split}-{setting}-n{num_candidates}-{i:05d}"
        paths = []
        for p, j in enumerate(slots):
            layout = _own_layout(pool[j], split, image_size, rng)
            path = out_dir / "images" / f"{item_id}-{p}.png"
            with replacing(path) as tmp:
                render_scene(pool[j], image_size, layout).save(tmp, optimize=False)
            paths.append(path)
        extra = {
            "setting": setting,
            "split": split,
            "source": "shapes",
            "descriptions": [describe(pool[j]) for j in slots],
        }
        built.append(Item(item_id, describe(answer), paths, position, extra))
    items_path = out_dir / "items.jsonl"
    write_items(items_path, built)
    return items_path
