"""lad: remove position bias from multimodal LLMs choosing among N images.

Implements Attention-Guided Debiasing from "Logit-Attention Divergence" (Xian et al., ICML 2026).
"""

from typing import Any

__version__ = "0.1.0"
__all__ = ["Choice", "Debiaser"]


def __getattr__(name: str) -> Any:
    # Imported on first use, so `lad` on the command line starts (and takes Ctrl-C) before
    # numpy and the rest load.
    if name in __all__:
        from lad.run import debiaser

        return getattr(debiaser, name)
    raise AttributeError(f"module 'lad' has no attribute {name!r}")
