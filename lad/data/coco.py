"""MS-COCO from its own annotation files: `captions_*.json` and `instances_*.json`.

captions: {"images": [{"id", "file_name"}, …], "annotations": [{"image_id", "caption"}, …]}
instances: {"annotations": [{"image_id", "category_id"}, …]}; an image with no instance has the
empty category set.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

from lad.data.builders import Pool
from lad.errors import DataError
from lad.io.files import check_object, read_json


def field(obj: Any, key: str, kind: type, where: str) -> Any:
    """obj[key], which must be of `kind`; otherwise an error after `where` (file: entry)."""
    check_object(obj, {key: kind}, f"{where}: ", DataError)
    return obj[key]


def existing_images(
    images_dir: str | Path, files: dict[Any, str], source: Path, skip_missing: bool
) -> list[Any]:
    """The keys, in order, of the listed images (key: file name) that are on disk; a missing one
    is an error unless `skip_missing`."""
    images_dir = Path(images_dir)
    if not images_dir.is_dir():
        raise DataError(f"{images_dir}: no such image folder")
    missing = [n for n in files.values() if not (images_dir / n).is_file()]
    if missing and not skip_missing:
        shown = ", ".join(missing[:3]) + (", …" if len(missing) > 3 else "")
        raise DataError(
            f"{source}: {len(missing)} listed images are not in {images_dir} ({shown}); "
            "pass --skip-missing to leave them out"
        )
    absent = set(missing)
    return [key for key, n in files.items() if n not in absent]


def load_coco(
    images_dir: str | Path,
    captions_file: str | Path,
    instances_file: str | Path | None = None,
    *,
    skip_missing: bool = False,
) -> Pool:
    """The images listed in the captions file that have at least one caption, with their captions
    and (when `instances_file` is given) their category sets."""
    captions_file = Path(captions_file)
    data = read_json(captions_file, DataError, "JSON annotation file")
    names: dict[int, str] = {}
    for i, entry in enumerate(field(data, "images", list, f"{captions_file}: top level")):
        where = f"{captions_file}: images[{i}]"
        names[field(entry, "id", int, where)] = field(entry, "file_name", str, where)
    captions: dict[int, list[str]] = defaultdict(list)
    for i, entry in enumerate(field(data, "annotations", list, f"{captions_file}: top level")):
        where = f"{captions_file}: annotations[{i}]"
        image_id = field(entry, "image_id", int, where)
        if image_id not in names:
            raise DataError(f"{where}: image_id {image_id} is not in 'images'")
        captions[image_id].append(field(entry, "caption", str, where).strip())
    listed = {i: names[i] for i in sorted(names) if captions[i]}
    ids = existing_images(images_dir, listed, captions_file, skip_missing)
    categories = None if instances_file is None else _categories(Path(instances_file), names)
    return Pool(
        name="coco",
        source=captions_file,
        images=[Path(images_dir).resolve() / names[i] for i in ids],
        captions=[captions[i] for i in ids],
        categories=None if categories is None else [frozenset(categories[i]) for i in ids],
    )


def _categories(path: Path, names: dict[int, str]) -> dict[int, set[int]]:
    data = read_json(path, DataError, "JSON annotation file")
    categories: dict[int, set[int]] = defaultdict(set)
    for i, entry in enumerate(field(data, "annotations", list, f"{path}: top level")):
        where = f"{path}: annotations[{i}]"
        image_id = field(entry, "image_id", int, where)
        categories[image_id].add(field(entry, "category_id", int, where))
    if categories and not set(categories) & set(names):
        raise DataError(f"{path}: no image_id matches the captions file; is it the same split?")
    return categories
