"""The paper's prompt templates (Appendix E, Table 9), for any label scheme.

Images come first (one slot per candidate, in presentation order), then this text; the backend
wraps both in the model's own chat template. PriDe and LAD use the vanilla prompt.
"""

from __future__ import annotations

import hashlib

from lad.errors import LadError
from lad.labels import LabelScheme

_TASK = (
    "Given {n} images indexed from {first} to {last}, identify the image that best matches "
    "the provided caption."
)
_ONLY = " Respond with the index {noun} only and nothing else."
_FAIR = (
    " Please note that the provided images have been randomly shuffled, so it is essential to "
    "consider them fairly and without bias. Analyze the visual content objectively and do not be "
    "influenced by the order of the images."
)
_COT = (
    " Please think step by step. First, write your reasoning inside <think> and </think> tags. "
    "Then, after the closing </think> tag, output only the final answer index (a single {single} "
    "from {first} to {last})."
)
_SC = (
    " Think step by step to analyze the content of the images. After your reasoning, provide the "
    "final answer in the exact format: \u201cThe answer is <index>\u201d."
)
_TAIL = "\nCaption: {caption}\nAnswer:"

TEMPLATES: dict[str, str] = {
    "vanilla": _TASK + _ONLY + _TAIL,
    "instruction": _TASK + _FAIR + _ONLY + _TAIL,
    "cot": _TASK + _COT + _TAIL + " <think>",
    "self-consistency": _TASK + _SC + _TAIL,
}


def render_prompt(template: str, caption: str, scheme: LabelScheme, num_candidates: int) -> str:
    """The text part of the prompt for one query."""
    if template not in TEMPLATES:
        raise LadError(
            f"The 'template' parameter must be one of {sorted(TEMPLATES)}. "
            f"Got {template!r} instead."
        )
    labels = scheme.labels(num_candidates)
    single = "integer" if scheme.name == "digits" else scheme.noun
    return TEMPLATES[template].format(
        n=num_candidates,
        first=labels[0],
        last=labels[-1],
        noun=scheme.noun,
        single=single,
        caption=caption,
    )


def prompt_sha256(template: str, scheme: LabelScheme, num_candidates: int) -> str:
    """Fingerprint of a prompt format, stored in calibration.json so a mismatch is caught."""
    text = render_prompt(template, "{caption}", scheme, num_candidates)
    key = f"{template}\n{scheme.name}\n{'|'.join(scheme.labels(num_candidates))}\n{text}"
    return hashlib.sha256(key.encode()).hexdigest()
