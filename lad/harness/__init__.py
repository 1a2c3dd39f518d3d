"""lad inside lmms-eval, lm-evaluation-harness and Inspect (docs/harness.md): `--model lad` and
circular task variants, with lad's metrics beside the harness's results.

Nothing here imports a harness at import time: `lad.harness.model` (the lmms-eval model class)
is imported by lmms-eval itself, through the entry point `lad` of the group `lmms_eval.models`
(pyproject.toml), after `pip install "lad[lmms-eval]"`; `lad.harness.lm_eval` (lm-eval's) by
`lad harness lm-eval` or a user's `import`, after `pip install "lad[lm-eval]"`; lad's Inspect
extension (`lad.harness.inspect_registry`) by Inspect, through the entry point `lad` of the group
`inspect_ai`, after `pip install "lad[inspect]"`.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

from lad.errors import LadError


def manifests() -> list[Any]:
    """lmms-eval's ModelManifest of `--model lad` (its entry-point payload)."""
    from lmms_eval.models.registry_v2 import ModelManifest

    return [ModelManifest(model_id="lad", simple_class_path="lad.harness.model.LadModel")]


def tasks_folder() -> Path:
    """The folder of lad's task YAMLs, for lmms-eval's `--include_path`."""
    return Path(__file__).parent / "tasks"


def harness_module(name: str, extra: str) -> Any:
    """Module `name` of an optional harness, or a LadError saying which extra installs it."""
    try:
        return importlib.import_module(name)
    except ImportError as e:
        raise LadError(
            f"{e.name or name} is not installed, which this needs: pip install -e '.[{extra}]' "
            "(docs/harness.md)"
        ) from None
