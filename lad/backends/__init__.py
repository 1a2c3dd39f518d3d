"""Model backends: HF transformers multi-image LLMs → records (see docs/backends.md)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from lad.backends.hf import Backend, load_backend

__all__ = ["Backend", "load_backend"]


def __getattr__(name: str) -> Any:
    # torch and transformers load on first use, not when the checks made before any model work
    # import lad.backends.threads (PEP 562).
    if name in __all__:
        from lad.backends import hf

        return getattr(hf, name)
    raise AttributeError(f"module 'lad.backends' has no attribute {name!r}")
