"""The text demo's held-out items, shipped beside its model (`--model text-demo`,
docs/demo-model.md, "The text demo"): `lad data text-demo` writes them out, so its README table
needs no training."""

from __future__ import annotations

from pathlib import Path

from lad.backends.checkpoint import shipped_model_path
from lad.data.builders import calibration_path_for
from lad.data.items import read_items, write_items

NAME = "text-demo"
ITEMS = "items.jsonl"  # 100 questions at N = 4; items.calibration.jsonl: 5 more


def write_text_demo_items(out: str | Path) -> dict[str, int]:
    """Write the shipped evaluation items to `out` and its 5 calibration items beside it
    (OUT.calibration.jsonl), as the training script drew them; {file: items written}."""
    folder = shipped_model_path(NAME)
    out = Path(out)
    written = {}
    for source, target in (
        (folder / ITEMS, out),
        (calibration_path_for(folder / ITEMS), calibration_path_for(out)),
    ):
        items = read_items(source)
        write_items(target, items)
        written[str(target)] = len(items)
    return written
