"""Named option sets. `official` makes lad compute what the paper's released code
(github.com/brightXian/LAD) computes, item for item; docs/methods.md lists each difference.

A preset only gives defaults: an option the user states explicitly wins over it. The values are
the names of `lad.run.config.EvalConfig` fields (the scoring ones are also `MethodOptions` fields).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from lad.core.prompts import OFFICIAL as OFFICIAL_PROMPT
from lad.errors import check_choice

# The official code's defaults (its evaluate.py and agd.py): Eq. 1 over logits, Eq. 13 in log
# space, Eq. 11 on the selected layers' mean raw attention, top-K searched in decoder layers
# 21..35; every picture resized to 336×336 (bicubic) before the processor; calibration on the
# first 5 evaluation items, which are scored too; the prompt ends with "Answer: " (a space); the
# label logits are `generate`'s scores, so they carry the repetition penalty of the model's
# generation_config ("model": 1.05 for Qwen instruct checkpoints, none where it sets none).
OFFICIAL: dict[str, Any] = {
    "obs_mean": "logit",
    "mixture": "log",
    "attn_mean": "raw",
    "layer_range": (21, 35),
    "image_size": 336,
    "calibrate_on": "evaluation",
    "prompt_template": OFFICIAL_PROMPT.text,
    "repetition_penalty": "model",
}

PRESETS: dict[str, dict[str, Any]] = {"paper": {}, "official": OFFICIAL}
# How the official code asks about pictures (its caption prompt, its resize); it has no items of
# text candidates, which lad's own text template asks.
PICTURE_SETTINGS = ("image_size", "prompt_template")


def with_preset(
    name: str, stated: dict[str, Any], names: Sequence[str], pictures: bool = True
) -> dict[str, Any]:
    """The settings `stated` (None: not stated) over those among `names` that preset `name`
    sets: a stated setting wins; a stated calibration source wins over the preset's
    --calibrate-on; `pictures` False (text candidates only): the preset's PICTURE_SETTINGS do not
    apply. The one place a preset is applied (lad eval, Debiaser, the CLI's commands)."""
    check_choice("preset", name, PRESETS)
    skip = () if pictures else PICTURE_SETTINGS
    values = {k: v for k, v in PRESETS[name].items() if k in names and k not in skip}
    given = {k: v for k, v in stated.items() if v is not None}
    if given.get("calibration_data") or given.get("calibration"):
        values.pop("calibrate_on", None)
    return {**values, **given}
