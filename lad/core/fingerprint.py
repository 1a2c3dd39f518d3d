"""A calibration's fingerprint (what defines the records it is fitted on) and the check that it
fits other records: model, label scheme, prompt, chat template, image preprocessing. lad.run.spec
computes a run's; lad.core.calibrate keeps it in calibration.json and checks it."""

from __future__ import annotations

import json
import operator
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lad.core.prompts import CAPTION_DESCRIPTION, QUESTION_DESCRIPTION, describe_prompt
from lad.errors import CalibrationError

# calibration.json's "preprocessing" (additive to lad-calibration/1): how the calibration records'
# chat and pictures were prepared, besides the prompt text (prompt_sha256), each with the flags
# that set it. A key absent on either side is unknown and not compared, except those of
# PREPROCESSING_ABSENT, whose absence from a known preprocessing means that value.
PREPROCESSING = {
    "chat_template_sha256": "--chat-template",
    "image_size": "--image-size",
    "image_options": "--max-pixels / --min-pixels / --image-option",
    "repetition_penalty": "--repetition-penalty",
}
PREPROCESSING_ABSENT = {"repetition_penalty": None}  # written only when a penalty is used


@dataclass(frozen=True)
class Fingerprint:
    """What defines the records a calibration is fitted on or applied to (calibration.json keeps
    it; lad.run.spec.RecordSpec.fingerprint makes one): the model, the labels c_1 … c_N, the
    prompt's SHA-256 (lad.core.prompts.prompt_sha256) and the preprocessing (PREPROCESSING).
    An empty field is unknown, and not compared."""

    model: str = ""
    labels: tuple[str, ...] = ()
    prompt_sha256: str = ""
    preprocessing: Mapping[str, Any] | None = None


UNKNOWN = Fingerprint()  # records of which nothing is known


# What a caller offers to skip a fingerprint check with, as its messages name it (the CLI names
# its --no-calibration-check flag instead: lad.cli.main).
SKIP = "check_calibration=False"


class CalibrationMismatch(CalibrationError):
    """A calibration made for other records (another model, label scheme, prompt or
    preprocessing) or one that does not say for which: refused unless skipped on purpose, the
    message ending in the switch that skips it (`skip`)."""

    def __init__(self, reason: str, skip: str = SKIP) -> None:
        self.reason, self.skip = reason, skip
        super().__init__(reason)

    def __str__(self) -> str:
        return self.reason.replace("{skip}", self.skip)


def located(e: CalibrationError, where: object) -> CalibrationError:
    """The refusal `e` of a calibration (of the same kind), its message prefixed with where the
    calibration is."""
    if isinstance(e, CalibrationMismatch):
        return CalibrationMismatch(f"{where}: {e.reason}", e.skip)
    return CalibrationError(f"{where}: {e}")


def check_fingerprint(made: Fingerprint, theirs: Fingerprint, whose: str, required: bool) -> None:
    """Refuse (CalibrationMismatch) a calibration made as `made` for records made as `theirs`:
    another model, label scheme, prompt, chat template or image preprocessing, where both
    sides know it; with `required`, also one whose model, labels or prompt are unknown."""
    mine = {"model": made.model, "labels": list(made.labels)}
    given = {"model": theirs.model, "labels": list(theirs.labels)}
    for name in mine:
        same = _same_model if name == "model" else operator.eq
        if mine[name] and given[name] and not same(mine[name], given[name]):
            raise CalibrationMismatch(
                f"the calibration's {name} is {mine[name]!r} but {whose} is "
                f"{given[name]!r}; recalibrate with the same model, label scheme and prompt "
                "template, or skip this check on purpose ({skip})"
            )
    if made.prompt_sha256 and theirs.prompt_sha256 not in ("", made.prompt_sha256):
        raise CalibrationMismatch(_prompt_mismatch(made, theirs.prompt_sha256, whose))
    before, now = dict(made.preprocessing or {}), dict(theirs.preprocessing or {})
    if made.preprocessing is not None and theirs.preprocessing is not None:
        before, now = {**PREPROCESSING_ABSENT, **before}, {**PREPROCESSING_ABSENT, **now}
    for key, flags in PREPROCESSING.items():
        if key in before and key in now and before[key] != now[key]:
            raise CalibrationMismatch(
                f"the calibration was fitted on records made with {_describe(key, before[key])}, "
                f"but these records are made with {_describe(key, now[key])}; recalibrate with "
                f"the same {flags}, or skip this check on purpose ({{skip}})"
            )
    unknown = [name for name in ("model", "labels", "prompt_sha256") if not getattr(made, name)]
    if required and unknown:
        raise CalibrationMismatch(
            f"its {' and '.join(unknown)} {'is' if len(unknown) == 1 else 'are'} missing, so "
            "nothing shows it was made for this model, label scheme and prompt; recalibrate "
            "(lad calibrate), or pass {skip} to use it anyway"
        )


def _prompt_mismatch(made_as: Fingerprint, prompt_sha256: str, whose: str) -> str:
    """The two prompts in words (lad.core.prompts.describe_prompt), not as fingerprints."""
    made = describe_prompt(made_as.prompt_sha256, list(made_as.labels))
    asked = describe_prompt(prompt_sha256, list(made_as.labels))
    hint = ""
    if {made, asked} == {CAPTION_DESCRIPTION, QUESTION_DESCRIPTION}:
        hint = (
            "questions need a calibration made on questions (items with a 'question', e.g. "
            "from lad data mmiu); "
            if asked == QUESTION_DESCRIPTION
            else "captions need a calibration made on captions (items without a 'question'); "
        )
    return (
        f"the calibration's prompt is {made}, but {whose} is {asked}; {hint}recalibrate "
        "with the same prompt, or skip this check on purpose ({skip})"
    )


def _describe(key: str, value: Any) -> str:
    """A preprocessing value as the flags that give it."""
    if key == "chat_template_sha256":
        if value is None:
            return "the checkpoint's own chat template"
        return f"--chat-template of SHA-256 {value[:12]}..."
    if key == "image_size":
        return (
            "no --image-size (pictures as they are)" if value is None else f"--image-size {value}"
        )
    if key == "repetition_penalty":
        return "no --repetition-penalty" if value is None else f"--repetition-penalty {value:g}"
    if not value:
        return "no image options (--max-pixels, --min-pixels, --image-option)"
    return "image options " + json.dumps(value, sort_keys=True)


def _same_model(a: str, b: str) -> bool:
    """The same hub id, or the same local folder however spelled (`./m`, `m/`, a full path)."""
    if a == b or os.path.normpath(a) == os.path.normpath(b):
        return True
    return Path(a).exists() and Path(b).exists() and Path(a).resolve() == Path(b).resolve()
