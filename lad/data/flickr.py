"""Flickr8k from its own caption file, `Flickr8k.token.txt`.

Each line is `<file name>#<k><TAB><caption>` (k = 0..4). Flickr8k has no categories, so its
adversarial setting applies only the text-similarity filter. The official token file lists one
image that is not in the image folder (2258277193_586949ec62.jpg.1); use `skip_missing`.
"""

from __future__ import annotations

import io
from collections import defaultdict
from pathlib import Path

from lad.data.builders import Pool
from lad.data.coco import existing_images
from lad.errors import DataError, at
from lad.io.files import read_text


def load_flickr8k(
    images_dir: str | Path, captions_file: str | Path, *, skip_missing: bool = False
) -> Pool:
    """The images of the token file, each with its captions in file order."""
    captions_file = Path(captions_file)
    captions: dict[str, list[str]] = defaultdict(list)
    text = read_text(captions_file, DataError, "caption file").removeprefix("\ufeff")
    # a text file's lines (\n, \r\n, \r), not splitlines(): U+2028 or \x0c may be in a caption
    for lineno, line in enumerate(io.StringIO(text, newline=None), 1):
        if not line.strip():
            continue
        key, tab, caption = line.rstrip("\n").partition("\t")
        name, hash_mark, number = key.partition("#")
        if not tab or not hash_mark or not number.isdigit() or not caption.strip():
            raise DataError(
                f"{at(captions_file, lineno)}expected '<image>#<k><TAB><caption>', "
                f"got {line.strip()[:80]!r}"
            )
        captions[name].append(caption.strip())
    if not captions:
        raise DataError(f"{captions_file}: the caption file is empty")
    listed = {n: n for n in sorted(captions)}
    names = existing_images(images_dir, listed, captions_file, skip_missing)
    return Pool(
        name="flickr8k",
        source=captions_file,
        images=[Path(images_dir).resolve() / n for n in names],
        captions=[captions[n] for n in names],
    )
