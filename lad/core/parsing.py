"""Strict parsing of generated replies into positions (generation-based baselines, §5.1).

Rules, in order (the same for every label scheme, `labels` being c_1 … c_N):

1. cot: only the text after the last `</think>` counts; a reply without `</think>` is unparseable.
   self-consistency: only what follows the last "The answer is" counts; a path without it is
   unparseable.
2. The answer is cleaned of markdown emphasis, quotes, brackets, a leading "Answer:", "Image",
   "Index" or "The answer is", and trailing punctuation. If what is left is exactly one label, that
   label is the answer (letters and roman numerals case-sensitive, words case-insensitive).
3. Otherwise every label that appears as a whole word (digits: a whole number, so "10" is never
   read as "1") is collected; exactly one distinct label is the answer, none or several is
   unparseable ("3 or 4" is unparseable, never silently the first).

An unparseable reply is position -1: it counts as wrong and is reported as a parse failure.
Self-consistency takes the majority over its parsed paths; a tie goes to the tied label whose first
vote came earliest in sampling order (never the lowest position, which would add a position bias
of its own); no parsed path is unparseable.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence

UNPARSEABLE = -1

_PREFIX = re.compile(
    r"^(?:answer\s*[:：]|the answer is|final answer\s*[:：]?|image|index|#)\s*", re.I
)
_WRAP = "*_`'\"“”‘’()[]{}<>"
_ANSWER_IS = re.compile(r"the answer is", re.I)


def _clean(text: str) -> str:
    text = text.strip().strip(_WRAP).strip()
    while (stripped := _PREFIX.sub("", text).strip().strip(_WRAP).strip()) != text:
        text = stripped
    return text.rstrip(".,;:!").strip(_WRAP).strip()


def _word_pattern(label: str) -> str:
    touching = r"\d" if label.isdigit() else "[A-Za-z]"  # what may not touch the label
    return rf"(?<!{touching}){re.escape(label)}(?!{touching})"


def parse_answer(reply: str, labels: Sequence[str]) -> int:
    """Position (0-based) named by a short answer, or -1 (rules 2-3 of the module docstring)."""
    # Number words ("first", …) match in any case; letters and roman numerals only as written.
    fold = all(label.islower() and len(label) > 1 for label in labels)
    key = (lambda s: s.lower()) if fold else (lambda s: s)
    cleaned = key(_clean(reply))
    keys = [key(label) for label in labels]
    if cleaned in keys:
        return keys.index(cleaned)
    flags = re.I if fold else 0
    found = {p for p, label in enumerate(labels) if re.search(_word_pattern(label), reply, flags)}
    return found.pop() if len(found) == 1 else UNPARSEABLE


def parse_cot(reply: str, labels: Sequence[str]) -> int:
    """The answer after the last `</think>` (the CoT prompt of Table 9)."""
    if "</think>" not in reply:
        return UNPARSEABLE
    return parse_answer(reply.rsplit("</think>", 1)[1], labels)


def parse_answer_is(reply: str, labels: Sequence[str]) -> int:
    """The answer after the last "The answer is" (the self-consistency prompt of Table 9)."""
    parts = _ANSWER_IS.split(reply)
    if len(parts) < 2:
        return UNPARSEABLE
    tail = parts[-1].strip()
    # Only the first word-group after the phrase: "The answer is 3 because ..." → "3".
    head = re.split(r"[.,;\n]| because | since ", tail, maxsplit=1)[0]
    return parse_answer(head, labels)


def majority_vote(positions: Sequence[int]) -> int:
    """Most frequent parsed position; ties go to the earliest first vote; -1 if none parsed."""
    parsed = [p for p in positions if p != UNPARSEABLE]
    # most_common orders equal counts as first encountered: the earliest first vote wins a tie.
    return Counter(parsed).most_common(1)[0][0] if parsed else UNPARSEABLE
