"""The harness's pictures as files: lad's backend reads pictures from paths (lad.io.images). A
picture the dataset stores as bytes ({"bytes", "path"}) is written unchanged, as `lad data
muirbench|blink` write them, so lad decodes it exactly as `lad eval` on a converted file does; a
decoded PIL image is written as a lossless PNG of its pixels. Files are named by content
(SHA-256), so a picture is one file whichever document shows it."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from lad.io.files import content_path, replacing, write_once
from lad.io.images import format_suffix


class PictureFiles:
    """PNG files of PIL images under `folder`, by content."""

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)

    def path(self, image: Any) -> Path:
        if isinstance(image, dict) and image.get("bytes") is not None:
            data = image["bytes"]  # a format lad.io.images does not decode gets ".img": refused
            path = content_path(self.folder, data, format_suffix(data) or ".img")
            write_once(path, data)
            return path
        if isinstance(image, dict):  # stored as a path only
            return Path(image["path"])
        # named by a SHA-256 of the PIL image's mode, size and pixel bytes
        head = f"{image.mode}\n{image.size[0]}x{image.size[1]}\n".encode()
        path = self.folder / f"{hashlib.sha256(head + image.tobytes()).hexdigest()}.png"
        if not path.is_file():
            with replacing(path) as tmp:
                image.save(tmp, format="PNG")
        return path
