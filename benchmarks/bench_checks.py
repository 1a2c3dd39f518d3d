"""python benchmarks/bench_checks.py [--images 500]

What the checks of docs/errors.md cost per image, beside decoding it: `lad eval` checks every
image before model work (`check_image`: its header, then every pixel decoded, so a truncated file
is refused before the model loads; the header alone for comparison) and stats it for run.json's
fingerprint on every run and rerun; the model then decodes it (`open_image`) for every prompt.
Measured in one process on 640 × 480 JPEGs, with plain PIL decoding
(`Image.open(p).convert("RGB")`, what lad did before) for comparison. Prints milliseconds per
image, the median of --repeats passes.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
from PIL import Image

from lad.io.images import check_image, open_image
from lad.run.runjson import file_digest as fingerprint


def _plain(path: Path) -> Image.Image:
    with Image.open(path) as im:
        return im.convert("RGB")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=500)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        pixels = np.random.default_rng(0).integers(0, 256, (480, 640, 3), dtype=np.uint8)
        paths = []
        for i in range(args.images):
            paths.append(folder / f"{i}.jpg")
            Image.fromarray(pixels).save(paths[-1], quality=90)
        items = folder / "items.jsonl"
        items.write_text("{}\n")
        steps = {
            "check_image (header)": lambda: [check_image(p, verify=False) for p in paths],
            "check_image (decode)": lambda: [check_image(p) for p in paths],
            "fingerprint (stat)": lambda: fingerprint(items, paths),
            "open_image (decode)": lambda: [open_image(p) for p in paths],
            "PIL convert (decode)": lambda: [_plain(p) for p in paths],
        }
        times: dict[str, list[float]] = {name: [] for name in steps}
        for _ in range(args.repeats):
            for name, step in steps.items():
                start = time.perf_counter()
                step()
                times[name].append(1000 * (time.perf_counter() - start) / len(paths))
    for name, values in times.items():
        print(f"{name:<22} {statistics.median(values):8.3f} ms/image")


if __name__ == "__main__":
    main()
