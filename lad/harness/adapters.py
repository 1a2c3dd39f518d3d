"""Per-task adapters: which of a harness document's pictures are the options of its question.

An adapter reads one document of an lmms-eval task (a dict, as `lm.task_dict[task][split][i]`
holds it: images decoded to PIL) and returns a `PictureChoice` when every option of the question
is one of the document's pictures, else None (the question is then answered by generation).
Adapters are pure functions of the document; none imports lmms-eval.

MuirBench (MUIRBENCH/MUIRBENCH): `question` (with an `<image>` placeholder per question
picture), `options` (an option that is a picture is exactly "<image>"), `answer` (a letter),
`image_list` (the question's pictures, then the options' pictures, in text order), `idx`.
BLINK (BLINK-Benchmark/BLINK): `question`, `choices` ("the second image", …), `answer` ("(B)"),
`image_1` … `image_4` (None where absent), `idx`.

Documents of lad's circular variants (lad.harness.circular) carry `lad_item` (the original
document's id) and `lad_shift` (the cyclic shift s applied to the option pictures).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from lad.data.items import cyclic_shift

IMAGE_PLACEHOLDER = "<image>"
_ORDINALS = ("first", "second", "third", "fourth", "fifth", "sixth", "seventh", "eighth", "ninth")
_BLINK_CHOICE = re.compile(rf"^the ({'|'.join(_ORDINALS)}) image\.?$", re.IGNORECASE)


@dataclass
class PictureChoice:
    """One question whose options are pictures, in the order the document shows them.

    item:       the original document's id (shared by a circular variant's shifts).
    ordering:   the cyclic shift s of a circular variant's document (0 for the task's own).
    question:   the question's text, placeholders removed.
    candidates: the option pictures in presentation order (PIL images).
    context:    pictures of the question that are not options (shown before the candidates).
    answer:     position (0-based) of the right option, None where the document gives none.
    replies:    replies[p] is what the task's own parser reads as "option at position p".
    order:      order[p] = index, in the original document's option order, of the picture shown
                at p: `cyclic_shift(N, s)`, the identity for the task's own documents.
    """

    item: str
    ordering: int
    question: str
    candidates: list[Any]
    context: list[Any]
    answer: int | None
    replies: list[str]
    order: list[int] = field(default_factory=list)

    @property
    def num_candidates(self) -> int:
        return len(self.candidates)

    def original_candidates(self) -> list[Any]:
        """The option pictures in the original document's order (undoing the shift)."""
        out: list[Any] = [None] * self.num_candidates
        for p, i in enumerate(self.order):
            out[i] = self.candidates[p]
        return out


def _letters(n: int) -> list[str]:
    return [chr(ord("A") + p) for p in range(n)]


def _letter_position(letter: Any, n: int) -> int | None:
    text = str(letter).strip().strip("()").strip().upper()
    if len(text) == 1 and 0 <= ord(text) - ord("A") < n:
        return ord(text) - ord("A")
    return None


def _clean(question: str) -> str:
    return re.sub(r"\s+", " ", question.replace(IMAGE_PLACEHOLDER, " ")).strip()


def _shift_of(doc: dict[str, Any], n: int) -> tuple[str | None, int, list[int]]:
    item = doc.get("lad_item")
    shift = int(doc.get("lad_shift") or 0)
    return item, shift, cyclic_shift(n, shift)


def muirbench(doc: dict[str, Any]) -> PictureChoice | None:
    """A MuirBench question whose options are all pictures."""
    options, images = doc.get("options"), doc.get("image_list")
    question = doc.get("question")
    if not (isinstance(options, list) and isinstance(images, list) and isinstance(question, str)):
        return None
    if len(options) < 2 or any(str(o).strip() != IMAGE_PLACEHOLDER for o in options):
        return None
    in_question = question.count(IMAGE_PLACEHOLDER)
    if in_question + len(options) != len(images) or any(im is None for im in images):
        return None
    n = len(options)
    item, shift, order = _shift_of(doc, n)
    return PictureChoice(
        item=str(doc["idx"]) if item is None else str(item),
        ordering=shift,
        question=_clean(question),
        candidates=list(images[in_question:]),
        context=list(images[:in_question]),
        answer=_letter_position(doc.get("answer"), n),
        replies=_letters(n),
        order=order,
    )


def blink_option_keys(doc: dict[str, Any]) -> list[str] | None:
    """The `image_k` keys BLINK's choices name, in choice order; None unless every choice is a
    distinct, present picture ("the second image")."""
    choices = doc.get("choices")
    if not isinstance(choices, list) or len(choices) < 2:
        return None
    keys = []
    for choice in choices:
        match = _BLINK_CHOICE.match(str(choice).strip())
        if match is None:
            return None
        keys.append(f"image_{_ORDINALS.index(match.group(1).lower()) + 1}")
    if len(set(keys)) != len(keys) or any(doc.get(k) is None for k in keys):
        return None
    return keys


def blink(doc: dict[str, Any]) -> PictureChoice | None:
    """A BLINK question whose choices are its pictures ("the first image", …)."""
    keys = blink_option_keys(doc)
    question = doc.get("question")
    if keys is None or not isinstance(question, str):
        return None
    pictures = sorted(
        (k for k in doc if re.fullmatch(r"image_\d+", k) and doc[k] is not None),
        key=lambda k: int(k.split("_")[1]),
    )
    n = len(keys)
    item, shift, order = _shift_of(doc, n)
    return PictureChoice(
        item=str(doc["idx"]) if item is None else str(item),
        ordering=shift,
        question=_clean(question),
        candidates=[doc[k] for k in keys],
        context=[doc[k] for k in pictures if k not in keys],
        answer=_letter_position(doc.get("answer"), n),
        replies=_letters(n),
        order=order,
    )


# How a document is recognised: the keys its schema must have, and the adapter reading it.
ADAPTERS: dict[str, tuple[tuple[str, ...], Callable[[dict[str, Any]], PictureChoice | None]]] = {
    "muirbench": (("idx", "question", "options", "answer", "image_list"), muirbench),
    "blink": (("idx", "question", "choices", "answer", "image_1"), blink),
}


def adapter_for(doc: dict[str, Any]) -> str | None:
    """The name of the adapter whose schema `doc` has (None: no adapter knows it)."""
    for name, (keys, _) in ADAPTERS.items():
        if all(k in doc for k in keys):
            return name
    return None


def picture_choice(doc: dict[str, Any], adapter: str | None = None) -> PictureChoice | None:
    """`doc` as a picture choice by `adapter` (None: the one whose schema it has)."""
    name = adapter or adapter_for(doc)
    if name is None:
        return None
    return ADAPTERS[name][1](doc)
