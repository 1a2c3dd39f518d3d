"""The blank prompt of the `blank` method (lad.core.blank, CapCal): each request's item with every
candidate's content replaced by a neutral placeholder, all else as it was.

- A picture candidate becomes a uniform grey picture (GREY) of the size the model would see it
  at, so the prompt keeps its tokens, its image spans and their places; the pictures are PNG
  files named by their content in a folder (one per size, shared by every item).
- A text candidate becomes the empty text: its label stays, its line is "<label>. ".
- The question, its context pictures, the labels, the answer's place and the ordering stay: the
  blank request of (item, ordering) has the same key and order as the request.
"""

from __future__ import annotations

import dataclasses
import io
from collections.abc import Sequence
from pathlib import Path

from lad.core.items import Item, Request
from lad.io.files import content_path, write_once
from lad.io.images import open_image

GREY = (128, 128, 128)


def grey_picture(folder: Path, size: tuple[int, int]) -> Path:
    """A uniform GREY RGB PNG of `size` (width, height) in `folder`, written once."""
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", size, GREY).save(buffer, format="PNG")
    data = buffer.getvalue()
    path = content_path(folder, data, ".png")
    folder.mkdir(parents=True, exist_ok=True)
    write_once(path, data)
    return path


def blank_item(item: Item, folder: Path) -> Item:
    """`item` with each candidate blanked: a grey picture of its size, or the empty text."""
    if item.is_text:
        return dataclasses.replace(item, candidates=[""] * item.num_candidates)
    sizes = [open_image(path).size for path in item.images]
    return dataclasses.replace(item, images=[grey_picture(folder, s) for s in sizes])


def blank_requests(requests: Sequence[Request], folder: str | Path) -> list[Request]:
    """Each request with its item blanked (same item id, ordering and order); grey pictures are
    written to `folder`."""
    folder = Path(folder)
    blanked: dict[str, Item] = {}
    out = []
    for item, ordering, order in requests:
        if item.id not in blanked:
            blanked[item.id] = blank_item(item, folder)
        out.append(Request(blanked[item.id], ordering, list(order)))
    return out
