"""Model backends: HF transformers multi-image LLMs → records (see docs/backends.md)."""

from lad.backends.hf import Backend, load_backend

__all__ = ["Backend", "load_backend"]
