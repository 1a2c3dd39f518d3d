"""Model backends: HF transformers multi-image LLMs → records (see docs/backends.md)."""

from typing import Any

__all__ = ["Backend", "load_backend"]


def __getattr__(name: str) -> Any:
    # Imported on first use, so what reads only a checkpoint's files (lad.backends.checkpoint)
    # or the CPU threads does not load torch.
    if name in __all__:
        from lad.backends import load

        return getattr(load, name)
    raise AttributeError(f"module 'lad.backends' has no attribute {name!r}")
