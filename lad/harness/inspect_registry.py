"""lad's Inspect extension, loaded by Inspect through the entry point `lad` of the group
`inspect_ai` (pyproject.toml; inspect_ai's `_util/entrypoints.py`), after
`pip install -e ".[inspect]"`: the solver `lad/circular`, the scorer `lad/position` (with lad's
metrics) and the model provider `lad` (`--model lad/<hub id or folder>`). The provider's module,
which loads torch and transformers, is imported only when a `lad/...` model is made."""

from __future__ import annotations

from inspect_ai.model import modelapi

from lad.harness.inspect_audit import circular, position

__all__ = ["circular", "lad", "position"]


@modelapi(name="lad")
def lad() -> type:
    from lad.harness.inspect_model import LadModelAPI

    return LadModelAPI
