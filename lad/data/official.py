"""The paper's official evaluation files, `annotations_{N}_1_{mode}.json` (a JSON list of
`{"id", "image_ids", "index", "caption", "target"}`), as lad items and back (docs/data.md,
"Importing the paper's files"). Importing keeps each entry's id, order and original paths, so
results compare item for item and `export_official` writes the same file again; entries without
ids get `<file stem>-<position>`, as the official code knows them by position.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lad.data.items import Item, write_items
from lad.errors import DataError
from lad.io.files import check_object, read_json, write_text

_NAME = re.compile(r"annotations_(\d+)_\d+_(random|adversarial)\.json$")


def _resolve(path: str, images_dir: Path, where: str) -> Path:
    for candidate in (images_dir / path, images_dir / Path(path).name, Path(path)):
        if candidate.is_file():
            return candidate.resolve()
    raise DataError(f"{where}image {path!r} is not in {images_dir}")


def _caption(entry: dict, where: str) -> str:
    caption = entry.get("caption")
    if isinstance(caption, list) and caption and all(isinstance(c, str) for c in caption):
        return caption[0]  # a list of captions: the first is the query
    if not isinstance(caption, str) or not caption.strip():
        raise DataError(f"{where}'caption' must be a non-empty string, got {caption!r}")
    return caption


def _entry_item(
    entry: Any, images_dir: Path, where: str, setting: str | None, derived_id: str | None
) -> Item:
    """One entry as an item; `derived_id` is its id when the file's entries have none."""
    check_object(entry, {}, where, DataError)
    for key in ("image_ids", "index", "caption"):  # "id": checked for all entries at once
        if key not in entry:
            raise DataError(f"{where}missing key {key!r}")
    paths, index = entry["image_ids"], entry["index"]
    if not isinstance(paths, list) or len(paths) < 2 or not all(isinstance(p, str) for p in paths):
        raise DataError(f"{where}'image_ids' must be a list of at least 2 paths")
    if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < len(paths):
        raise DataError(f"{where}'index' {index!r} is not a position in its {len(paths)} images")
    target = entry.get("target")
    if target is not None and Path(paths[index]).name != target:
        raise DataError(
            f"{where}'target' {target!r} is not the image at 'index' {index} "
            f"({Path(paths[index]).name!r})"
        )
    images = [_resolve(p, images_dir, where) for p in paths]
    extra: dict[str, Any] = {"source": "official", "image_ids": paths}
    if derived_id is None:
        extra["official_id"] = entry["id"]
    if setting is not None:
        extra["setting"] = setting
    if target is not None:
        extra["target"] = target
    item_id = derived_id if derived_id is not None else str(entry["id"])
    return Item(item_id, _caption(entry, where), images, index, extra)


def _derived_ids(path: Path, entries: list) -> list[str | None]:
    """Per entry: None where the file's entries carry ids, else `{file stem}-{position}`."""
    has_id = ["id" in e if isinstance(e, dict) else True for e in entries]
    if all(has_id):
        return [None] * len(entries)
    if any(has_id):
        first = has_id.index(False)
        raise DataError(
            f"{path}: entry {first} has no 'id' but entry {has_id.index(True)} has one; give "
            "every entry an id, or none (lad then derives them from the file name and position)"
        )
    return [f"{path.stem}-{i}" for i in range(len(entries))]


def read_official(path: str | Path, images_dir: str | Path) -> list[Item]:
    """The entries of an official file as items, in file order."""
    path, images_dir = Path(path), Path(images_dir)
    if not images_dir.is_dir():
        raise DataError(f"{images_dir}: no such image folder")
    entries = read_json(path, DataError, "JSON annotation file")
    if not isinstance(entries, list) or not entries:
        raise DataError(f"{path}: expected a non-empty JSON list of entries")
    match = _NAME.search(path.name)
    setting = match.group(2) if match else None
    items = [
        _entry_item(entry, images_dir, f"{path}: entry {i}: ", setting, derived)
        for i, (entry, derived) in enumerate(zip(entries, _derived_ids(path, entries), strict=True))
    ]
    if match and any(it.num_candidates != int(match.group(1)) for it in items):
        raise DataError(f"{path}: the file name says N = {match.group(1)}, but not every entry has")
    ids = [it.id for it in items]
    if len(set(ids)) != len(ids):
        raise DataError(f"{path}: entry ids are not unique")
    return items


@dataclass(frozen=True)
class Imported:
    """What `import_official` wrote: how many items, and whether their ids were derived."""

    items: int
    derived_ids: bool


def import_official(path: str | Path, images_dir: str | Path, out: str | Path) -> Imported:
    items = read_official(path, images_dir)
    write_items(out, items)
    return Imported(len(items), "official_id" not in items[0].extra)


def export_official(items: list[Item], path: str | Path) -> None:
    """Write items in the official format. Imported items get back their original ids (none, if
    they had none) and paths."""
    entries = []
    for it in items:
        paths = it.extra.get("image_ids") or [str(p) for p in it.images]
        official = it.extra.get("source") == "official"
        entry: dict[str, Any] = {}
        if not official or "official_id" in it.extra:  # an imported id-less entry stays so
            entry["id"] = it.extra.get("official_id", it.id)
        entry.update(image_ids=paths, index=it.answer)
        if "target" in it.extra or not official:
            entry["target"] = it.extra.get("target", Path(paths[it.answer]).name)
        entry["caption"] = it.query
        entries.append(entry)
    write_text(path, json.dumps(entries, indent=2))
