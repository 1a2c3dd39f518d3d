"""The screen for order-dependent questions: those whose right answer moves when lad shows their
candidates in another order (docs/data.md, "Order-dependent questions").

lad permutes the candidates only: the question's text, its context pictures (shown first, where
the benchmark shows them) and, for text options, each option's text stay as they are. So a
question's gold depends on the order exactly when a text that stays names a candidate by its
place, which a shuffle then points at another candidate:

- picture candidates (MMIU, MuirBench, BLINK): the question names some but not all of the
  candidates' places: "the third image" / "image 3" where the third picture shown is a candidate
  (pictures count as the benchmark shows them, context pictures first: BLINK's "the first image"
  of its reference stays right), "the last image", "option B", "the second option", "the left
  image", "the image on the right", "the next image", "the former one". References that together
  name every candidate ("the second image or the third image", Jigsaw's two choices) ask about
  the same set under any order and pass.
- text options (MMLU, ARC, `lad data text`, judgments): an option that points at other options by
  place ("All of the above", "None of the above", "both of the following"), an option made of
  option letters only ("A and B", "(A), (C)", "Both B and C": also an answer that is an ordering
  of the options), or a question naming an option by its letter or place ("option (B)", "the
  second choice").

A question the screen catches is skipped as ORDER_DEPENDENT and counted per task in the
conversion's summary, like every other reason; the harness adapters call the same rules, so
lad's circular tasks leave it out too.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

ORDER_DEPENDENT = "order-dependent question"

_ORDINALS = (
    "first", "second", "third", "fourth", "fifth", "sixth", "seventh", "eighth", "ninth",
    "tenth", "eleventh", "twelfth",
)  # fmt: skip
_PICTURE = r"(?:image|picture|photo|photograph|frame|figure|img)"
_OPTION = r"(?:option|choice|candidate|alternative|answer)"
_ORDINAL = rf"({'|'.join(_ORDINALS)}|last|final|\d+(?:st|nd|rd|th))"
# "the third image", "the last picture", "the 2nd one", and lists of them ("the second or the
# third image", "the first and second images"); not "the first three images".
_ORDINAL_PICTURE = re.compile(
    rf"\b((?:{_ORDINAL}\s*(?:,\s*|\s+(?:or|and|nor)\s+)(?:the\s+)?)*{_ORDINAL})\s+"
    rf"(?:{_PICTURE}|one)s?\b",
    re.I,
)
_ONE_ORDINAL = re.compile(_ORDINAL, re.I)
# "image 3", "Image #2", "picture (4)".
_NUMBERED_PICTURE = re.compile(rf"\b{_PICTURE}\s*#?\s*\(?(\d+)\)?(?![\d.]*\s*(?:%|px))", re.I)
# "the second option", "the last choice": a candidate by its place among the options.
_ORDINAL_OPTION = re.compile(rf"\b{_ORDINAL}\s+(?:{_OPTION}\b)(?!s)", re.I)
_ORDINAL_ONE = re.compile(rf"\b{_ORDINAL}\s+one\b(?!s)", re.I)
# "option B", "choice (c)", "Answer 2", "Option #3" (a bare letter in capitals: not "answer a").
_LETTERED_OPTION = re.compile(
    rf"\b(?i:{_OPTION})\s*#?\s*(?:\(([A-Za-z]|\d+)\)|([A-Z]|\d+))(?![\w'])"
)
# "the left image", "the rightmost one", "the image on the left", "the former one", "the next
# option": a candidate placed by its neighbours. ("The next image" of a sequence is what is asked
# for, among candidates shown after the context: it names no candidate's place, and passes.)
_SIDE = r"(?:left|right|leftmost|rightmost|top|bottom|upper|lower|middle|centre|center)"
_RELATIVE_PICTURE = re.compile(
    rf"\b{_SIDE}\s+(?:{_PICTURE}|one|{_OPTION})\b(?!s)"
    rf"|\b(?:former|latter)\s+(?:{_PICTURE}|one|{_OPTION})\b(?!s)"
    rf"|\bthe\s+(?:former|latter)\b(?!\s+(?:two|three|four|five|six|\d+|{_PICTURE}s|ones|{_OPTION}s)\b)"
    rf"|\b(?:next|previous|preceding|following|adjacent)\s+{_OPTION}\b(?!s)"
    rf"|\b{_PICTURE}\s+(?:on|at|to)\s+the\s+(?:left|right|top|bottom)\b",
    re.I,
)
# An option pointing at the others by place.
_ABOVE = re.compile(
    r"\b(?:all|none|both|neither|either|each|any|one)\s+of\s+(?:the\s+)?(?:options\s+|choices\s+|"
    r"answers\s+)?(?:above|below|preceding|following|foregoing|aforementioned)\b"
    r"|\b(?:all|none|both|neither)\s+(?:the\s+)?(?:above|below)\b"
    r"|^\s*(?:the\s+)?(?:above|below|preceding|following)\s*\.?\s*$",
    re.I,
)
# An option made of option letters only: "A and B", "(A), (C)", "Both B and C", "B, A, C".
_LETTER = r"\(?[A-J]\)?"
_LETTERS_ONLY = re.compile(
    rf"^\s*(?:(?i:both|only|neither|either|all)\s+)?{_LETTER}"
    rf"(?:\s*(?:,|;|&|\+|->|→|>|\band\b|\bor\b|\bnor\b|\bthen\b)\s*(?:and\s+)?{_LETTER})+"
    r"\s*(?i:only)?\s*\.?\s*$"
)


def picture_question_reason(question: str, num_context: int, num_candidates: int) -> str | None:
    """ORDER_DEPENDENT when `question` names some but not all of the candidates' places (the
    pictures numbered as shown: `num_context` context pictures, then the candidates); else None."""
    first = num_context + 1  # the first candidate's number among the pictures
    slots: set[int] = set()
    for match in _ORDINAL_PICTURE.finditer(question):
        for word in _ONE_ORDINAL.findall(match.group(1)):
            k = _place(word, num_context + num_candidates)
            if k is not None and k >= first:
                slots.add(k - first)
    for match in _NUMBERED_PICTURE.finditer(question):
        k = int(match.group(1))
        if first <= k <= num_context + num_candidates:
            slots.add(k - first)
    for match in _ORDINAL_OPTION.finditer(question):
        k = _place(match.group(1), num_candidates)
        if k is not None and 1 <= k <= num_candidates:
            slots.add(k - 1)
    for match in _LETTERED_OPTION.finditer(question):
        k = _option_number(match.group(1) or match.group(2))
        if k is not None and 1 <= k <= num_candidates:
            slots.add(k - 1)
    if _RELATIVE_PICTURE.search(question):
        return ORDER_DEPENDENT  # a place relative to another picture: never all of them
    return ORDER_DEPENDENT if slots and len(slots) < num_candidates else None


def text_question_reason(question: str, options: Sequence[str]) -> str | None:
    """ORDER_DEPENDENT when an option points at other options by place or letter, or the
    question names an option by its letter or place; else None."""
    for option in options:
        if _ABOVE.search(option) or _LETTERS_ONLY.match(option):
            return ORDER_DEPENDENT
    n = len(options)
    for match in [*_ORDINAL_OPTION.finditer(question), *_ORDINAL_ONE.finditer(question)]:
        k = _place(match.group(1), n)
        if k is not None and 1 <= k <= n:
            return ORDER_DEPENDENT
    for match in _LETTERED_OPTION.finditer(question):
        k = _option_number(match.group(1) or match.group(2))
        if k is not None and 1 <= k <= n:
            return ORDER_DEPENDENT
    return None


def _place(word: str, last: int) -> int | None:
    """The 1-based place an ordinal names ("third": 3, "last": `last`, "2nd": 2)."""
    word = word.lower()
    if word in ("last", "final"):
        return last
    if word in _ORDINALS:
        return _ORDINALS.index(word) + 1
    digits = re.match(r"\d+", word)
    return int(digits.group()) if digits else None


def _option_number(text: str) -> int | None:
    """The 1-based option a label names: a letter (A: 1) or a number."""
    if text.isdigit():
        return int(text)
    return ord(text.upper()) - ord("A") + 1 if len(text) == 1 and text.isalpha() else None
