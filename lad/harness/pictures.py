"""The harness's pictures as files: lad's backend reads candidates from paths (lad.images), the
harness hands over decoded PIL images. Each picture is written once as a lossless PNG named by
the SHA-256 of its pixels, so the same picture is one file whichever document shows it, and
`lad eval` on those files sees exactly the pixels the harness run saw."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from lad.files import replacing


class PictureFiles:
    """PNG files of PIL images under `folder`, by content."""

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)

    def path(self, image: Any) -> Path:
        digest = picture_sha256(image)
        path = self.folder / f"{digest}.png"
        if not path.is_file():
            self.folder.mkdir(parents=True, exist_ok=True)
            with replacing(path) as tmp:
                image.save(tmp, format="PNG")
        return path


def picture_sha256(image: Any) -> str:
    """SHA-256 of a PIL image's mode, size and pixel bytes."""
    h = hashlib.sha256()
    h.update(f"{image.mode}\n{image.size[0]}x{image.size[1]}\n".encode())
    h.update(image.tobytes())
    return h.hexdigest()
