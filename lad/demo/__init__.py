"""The models shipped inside the package: `demo`, a tiny Qwen2-VL trained here on the shapes
benchmark, and `text-demo`, a tiny Llama trained on word options (benchmarks/text_demo.py).

`lad eval --model demo` (the default) loads the first from `demo_model_path()`, `--model
text-demo` the second (lad.backends.checkpoint.SHIPPED_MODELS maps the names to the folders);
docs/demo-model.md is their model card. `lad demo train --out lad/demo/model
--replace-shipped-model` retrains the first.
"""

from __future__ import annotations

from lad.backends.checkpoint import MODEL_DIR, SHIPPED_MODELS, demo_model_path, shipped_model_path

__all__ = ["MODEL_DIR", "SHIPPED_MODELS", "demo_model_path", "shipped_model_path"]
