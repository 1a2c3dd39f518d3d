"""Small lad eval runs for tests, and comparing two run directories' files."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def comparable(path: Path) -> Any:
    """A run file's content: its bytes, except that run.json and metrics.json are compared
    without their "timing" (wall seconds, which differ from one run to the next)."""
    if path.name in ("run.json", "metrics.json"):
        content = json.loads(path.read_text())
        assert isinstance(content.pop("timing", {}), dict)
        return content
    return path.read_bytes()


def small_config(model: str, bench: tuple[Path, Path], **kw: Any) -> Any:
    """An EvalConfig of a small run on CPU: the `bench` (items, calibration items) files, two
    calibration items, two shuffles, batches of two; `kw` (num_candidates among them) override
    any field."""
    from lad.run.config import eval_config

    base = {
        "model": model,
        "data": str(bench[0]),
        "calibration_data": str(bench[1]),
        "calibration_items": 2,
        "num_shuffles": 2,
        "batch_size": 2,
        "quiet": True,
        "device": "cpu",
    }
    return eval_config(**{**base, **kw})
