"""lad inside lmms-eval (docs/harness.md): `--model lad` and circular variants of the
picture-option tasks, with lad's metrics beside lmms-eval's results.

Nothing here imports lmms-eval at import time: `lad.harness.model` (the lmms-eval model class)
is imported by lmms-eval itself, through the entry point `lad` of the group `lmms_eval.models`
(pyproject.toml), after `pip install "lad[lmms-eval]"`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

MODEL_CLASS = "lad.harness.model.LadModel"


def manifests() -> list[Any]:
    """lmms-eval's ModelManifest of `--model lad` (its entry-point payload)."""
    from lmms_eval.models.registry_v2 import ModelManifest

    return [ModelManifest(model_id="lad", simple_class_path=MODEL_CLASS)]


def tasks_folder() -> Path:
    """The folder of lad's task YAMLs, for lmms-eval's `--include_path`."""
    return Path(__file__).parent / "tasks"
