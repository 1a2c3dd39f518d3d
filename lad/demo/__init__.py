"""lad's embedded demo model: a tiny Qwen2-VL trained here on the shapes benchmark.

`lad eval --model demo` (the default) loads it from `demo_model_path()`; docs/demo-model.md is its
model card and `lad demo train --out lad/demo/model --replace-shipped-model` retrains it.
"""

from __future__ import annotations

from lad.backends.checkpoint import MODEL_DIR, demo_model_path

__all__ = ["MODEL_DIR", "demo_model_path"]
