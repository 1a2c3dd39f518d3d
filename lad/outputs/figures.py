"""matplotlib, headless (Agg), for the figures of `lad report` and `lad ablate`, and their one
way of writing a figure."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from lad.io.files import replacing


def save_figure(fig: Any, path: Path) -> None:
    """Lay the figure out tightly (unless it was made with a layout of its own) and write it
    through a temporary file renamed into place: never through a symlink, never half a file."""
    if fig.get_layout_engine() is None:
        fig.tight_layout()
    try:
        with replacing(path) as tmp:
            fig.savefig(tmp, dpi=110)
    finally:
        plt.close(fig)


def gaps(values: list[float | None]) -> np.ndarray:
    """metrics.json holds null for a position no answer fell on; plot it as a gap."""
    return np.array([np.nan if v is None else v for v in values], dtype=float)


# Per answer position, what the logits say against what the attention finds, raw and purified,
# and what LAD makes of it: Table 7 (lad ablate) and, in spirit, Fig. 1/3 of the paper (lad
# report). Each method with its name in Table 7 and in the report's figure.
DIVERGENCE_METHODS = {
    "vanilla": ("Vanilla", "logits (vanilla)"),
    "attn": ("Raw Attn", "raw attention (attn)"),
    "attn-purified": ("Purified Attn", "purified attention"),
    "lad": ("Ours", "LAD"),
}
