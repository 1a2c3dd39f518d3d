"""Comparing two run directories' files."""

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
