"""lad: remove position bias from multimodal LLMs choosing among N images.

Implements Attention-Guided Debiasing from "Logit-Attention Divergence" (Xian et al., ICML 2026).
"""

__version__ = "0.1.0"

from lad.api import Choice, Debiaser

__all__ = ["Choice", "Debiaser"]
