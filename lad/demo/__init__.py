"""lad's embedded demo model: a tiny Qwen2-VL trained here on the shapes benchmark.

`lad eval --model demo` (the default) loads it from `demo_model_path()`; docs/demo-model.md is its
model card and `python -m lad.demo.train --out lad/demo/model --replace-shipped-model` retrains it.
"""

from __future__ import annotations

from pathlib import Path

from lad.errors import BackendError

MODEL_DIR = Path(__file__).resolve().parent / "model"
_NEEDED = ("config.json", "model.safetensors", "tokenizer.json")


def demo_model_path() -> Path:
    """The folder of the shipped demo model (save_pretrained output), checked to be complete."""
    missing = [name for name in _NEEDED if not (MODEL_DIR / name).is_file()]
    if missing:
        raise BackendError(
            f"the demo model's weights are missing from {MODEL_DIR} (no {', '.join(missing)}). "
            "Reinstall lad, or retrain them with: python -m lad.demo.train --out "
            + str(MODEL_DIR)
            + " --replace-shipped-model"
        )
    return MODEL_DIR
