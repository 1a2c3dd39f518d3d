"""Per-task adapters: which of a harness document's pictures are the options of its question.

An adapter reads one document of an lmms-eval task (a dict, as `lm.task_dict[task][split][i]`
holds it; `--model lad` hands its pictures over undecoded, {"bytes", "path"}, and the circular
variants move them the same way) and returns a `PictureChoice` when every option of the question
is one of the document's pictures, else None (the question is then answered by generation).
Adapters are pure functions of the document; none imports lmms-eval. They apply the rules of
lad's converters (`lad data muirbench|blink`, lad.data.muirbench and lad.data.blink) and name
items as they do, so `lad eval` on a converted file asks the same items in the same way.

MuirBench (MUIRBENCH/MUIRBENCH): `question` (with an `<image>` placeholder per question
picture), `options` (an option that is a picture is exactly "<image>"), `answer` (a letter),
`image_list` (the question's pictures, then the options' pictures, in text order), `idx`.
BLINK (BLINK-Benchmark/BLINK): `question`, `choices` ("the second image", …), `answer` ("(B)"),
`image_1` … `image_4` (None where absent), `idx`.

Documents of lad's circular variants (lad.harness.circular) carry `lad_item` (the original
document's id) and `lad_shift` (the cyclic shift s applied to the option pictures).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from lad.core.prompts import CONTEXT_PLACEHOLDER
from lad.data.blink import PICTURE_FIELDS as BLINK_PICTURES
from lad.data.items import cyclic_shift
from lad.data.mmiu import ordinal_image
from lad.data.released import safe_name

IMAGE_PLACEHOLDER = CONTEXT_PLACEHOLDER  # "<image>": where a text shows a picture


@dataclass
class PictureChoice:
    """One question whose options are pictures, in the order the document shows them.

    item:       the item's id, as `lad data muirbench|blink` names it (shared by a circular
                variant's shifts).
    ordering:   the cyclic shift s of a circular variant's document (0 for the task's own).
    question:   the question's text (a `<image>` where it shows a context picture).
    candidates: the option pictures in presentation order (PIL images, or the dataset's
                undecoded {"bytes", "path"}).
    context:    pictures of the question that are not options (lad.data.items.Item).
    answer:     position (0-based) of the right option, None where the document gives none.
    replies:    replies[p] is what the task's own parser reads as "the option at position p".
    order:      order[p] = index, in the original document's candidate order, of the picture
                shown at p: `cyclic_shift(N, s)`, the identity for the task's own documents.
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


def answer_letter(answer: Any, n: int) -> int | None:
    """The option an answer ("B", "(B)") names, as lad's converters read it; None if none."""
    letter = "" if answer is None else str(answer).strip().strip("() .").upper()
    if len(letter) == 1 and 0 <= ord(letter) - ord("A") < n:
        return ord(letter) - ord("A")
    return None


def _shift_of(doc: dict[str, Any], n: int) -> tuple[str | None, int, list[int]]:
    item = doc.get("lad_item")
    shift = int(doc.get("lad_shift") or 0)
    return item, shift, cyclic_shift(n, shift)


def muirbench(doc: dict[str, Any]) -> PictureChoice | None:
    """A MuirBench question whose options are all pictures (lad.data.muirbench's rules)."""
    options, images = doc.get("options"), doc.get("image_list")
    question = doc.get("question")
    if not (isinstance(options, list) and isinstance(images, list) and isinstance(question, str)):
        return None
    if len(options) < 2 or any(str(o).strip() != IMAGE_PLACEHOLDER for o in options):
        return None
    places = question.count(IMAGE_PLACEHOLDER)
    if places + len(options) != len(images) or any(im is None for im in images):
        return None
    if not question.replace(IMAGE_PLACEHOLDER, "").strip():
        return None
    n = len(options)
    item, shift, order = _shift_of(doc, n)
    return PictureChoice(
        item=f"muirbench-{doc['idx']}" if item is None else str(item),
        ordering=shift,
        question=question.strip(),
        candidates=list(images[places:]),
        context=list(images[:places]),
        answer=answer_letter(doc.get("answer"), n),
        replies=_letters(n),
        order=order,
    )


def blink_option_keys(doc: dict[str, Any]) -> list[str] | None:
    """The `image_k` keys BLINK's choices name, in choice order; None unless every choice is
    "the <ordinal> image", each names a different present picture, and the pictures no choice
    names come first (lad.data.blink's rules)."""
    choices = doc.get("choices")
    if not isinstance(choices, list) or len(choices) < 2:
        return None
    named = [ordinal_image(str(c)) for c in choices]
    if any(k is None for k in named):
        return None
    present = [k for k in range(len(BLINK_PICTURES)) if doc.get(BLINK_PICTURES[k]) is not None]
    if present != list(range(len(present))):
        return None
    shown = [k for k in named if k is not None]
    if len(set(shown)) != len(shown) or max(shown) >= len(present):
        return None
    context = [k for k in present if k not in shown]
    if context != list(range(len(context))):
        return None
    return [BLINK_PICTURES[k] for k in shown]


def blink(doc: dict[str, Any]) -> PictureChoice | None:
    """A BLINK question whose choices are its pictures ("the second image", …): candidates in
    BLINK's picture order, the reference pictures as context, as `lad data blink` makes it."""
    named = blink_option_keys(doc)
    question = doc.get("question")
    if named is None or not isinstance(question, str) or not question.strip():
        return None
    keys = sorted(named, key=BLINK_PICTURES.index)  # the candidates in picture order
    context = [k for k in BLINK_PICTURES if doc.get(k) is not None and k not in named]
    letters = _letters(len(named))
    answer = answer_letter(doc.get("answer"), len(named))
    n = len(keys)
    item, shift, order = _shift_of(doc, n)
    return PictureChoice(
        item=f"blink-{safe_name(str(doc['idx']))}" if item is None else str(item),
        ordering=shift,
        question=question,
        candidates=[doc[k] for k in keys],
        context=[doc[k] for k in context],
        answer=None if answer is None else keys.index(named[answer]),
        replies=[letters[named.index(k)] for k in keys],
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
