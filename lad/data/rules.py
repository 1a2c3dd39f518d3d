"""What the released benchmarks' rules share: the reasons a question is skipped, option letters,
answers read as letters, options that read "the <ordinal> image", and the `Choice` each
benchmark's rule makes of a row.

Each released-benchmark module (lad.data.mmiu, muirbench, blink) exports one function,
`choose(row) -> Choice | str`, from a row's fields to the question it asks among pictures, or the
reason it is skipped (a constant below). `lad data <benchmark>` (lad.data.released) and the
lmms-eval adapters (lad.harness.adapters) both call it, so a question is an item in the one
exactly when it is a picture question in the other, asked the same way. A row that breaks the
benchmark's schema (a field of the wrong type) is a DataError naming the row, not a skip.
"""

from __future__ import annotations

import re
import string
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from lad.data.screen import picture_question_reason

# Why a question is skipped, counted per task in a conversion's summary (docs/data.md).
NO_ANSWER = "no answer"  # null or blank
ANSWER_NOT_AN_OPTION = "answer not an option"
EMPTY_QUESTION = "empty question"  # nothing is asked
OPTIONS_NOT_PICTURES = "options not pictures"  # an option is text
NOT_ONE_PER_PICTURE = "not one option per picture"  # two options name one picture, or none
REFERENCE_NOT_FIRST = "reference pictures not first"  # a picture no option names after one
PICTURES_NOT_PLACES = "pictures do not match <image> places"  # MuirBench: image_list vs <image>
OTHER_N = "other N"  # another number of candidates than --num-candidates
DUPLICATE_ID = "duplicate id"  # an earlier question of the output has the same item id
# MMIU's converter words two of them its own way (its summaries have always said so).
OPTIONS_NOT_IMAGES = "options not images"
NOT_ONE_PER_IMAGE = "not one option per image"
MISSING_IMAGE = "missing image"  # a picture not on disk (with --skip-missing)
OUTSIDE_ROOT = "picture outside the dataset folder"  # an absolute path, `..`, a symlink out
UNDECODED = "picture that does not decode"  # an embedded picture truncated or damaged

_ORDINALS = (
    "first", "second", "third", "fourth", "fifth", "sixth", "seventh", "eighth", "ninth",
    "tenth", "eleventh", "twelfth", "thirteenth", "fourteenth", "fifteenth", "sixteenth",
    "seventeenth", "eighteenth", "nineteenth", "twentieth",
)  # fmt: skip
_IMAGE_OPTION = re.compile(rf"the ({'|'.join(_ORDINALS)}) image", re.I)


@dataclass
class Choice:
    """One question whose options are pictures, as a benchmark's row asks it.

    item:       the item's id (`lad data` writes it; None where the converter numbers the rows).
    task:       the benchmark's task of the row.
    question:   the text asked (a `<image>` where it shows a context picture).
    candidates: the option pictures in the benchmark's order (its cells, or the paths it names).
    context:    its other pictures, in the order shown (lad.data.items.Item.context_images).
    answer:     position of the right candidate; None when `unanswered` says why there is none.
    unanswered: NO_ANSWER or ANSWER_NOT_AN_OPTION (a converter skips the question for it; the
                harness still asks it).
    replies:    replies[p] is the letter the benchmark's options name candidate p by.
    extra:      fields kept in the item (`source`, the benchmark's own id, ...).
    """

    item: str | None
    task: str
    question: str
    candidates: list[Any]
    context: list[Any]
    answer: int | None
    unanswered: str | None
    replies: list[str]
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def num_candidates(self) -> int:
        return len(self.candidates)


def option_letters(count: int) -> list[str]:
    """The option letters A, B, … of `count` options (at most 26)."""
    return list(string.ascii_uppercase[:count])


def answer_position(answer: Any, letters: Sequence[str], *, wrapped: bool = True) -> int | str:
    """The position in `letters` of the option an answer names, or why none: NO_ANSWER (null or
    blank), ANSWER_NOT_AN_OPTION. Case and surrounding spaces aside; with `wrapped`, also
    BLINK's "(B)" and "B." (MMIU's scorer compares the bare letter only)."""
    text = "" if answer is None else str(answer).strip()
    if wrapped:
        text = text.strip("() .")
    if not text:
        return NO_ANSWER
    letter = text.upper()
    return letters.index(letter) if letter in letters else ANSWER_NOT_AN_OPTION


def ordinal_image(text: str) -> int | None:
    """k for an option that reads "the <k+1-th ordinal> image" (any case, a final period aside)."""
    image = _IMAGE_OPTION.fullmatch(text.strip().rstrip(".").strip())
    return None if image is None else _ORDINALS.index(image.group(1).lower())


def kept(value: Any) -> Any:
    """A benchmark's field as an item keeps it (an extra key): text, a number, a bool or null
    as it is, anything else as its text, so the items file is always JSON."""
    return value if value is None or isinstance(value, str | int | float | bool) else str(value)


def safe_name(text: str) -> str:
    """`text` usable in a file name: letters, digits, '-' and '_' kept, the rest '_'."""
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in text)


def pictures_named(
    named: list[int], count: int, not_one: str = NOT_ONE_PER_PICTURE
) -> tuple[list[int], list[int]] | str:
    """(candidates, context) of a question whose options name pictures `named` (0-based) of its
    `count`: the named ones in picture order, and the others, which must come first; else why
    not (`not_one`: two options name one picture, or one it lacks; REFERENCE_NOT_FIRST)."""
    if len(set(named)) != len(named) or len(named) < 2 or max(named) >= count:
        return not_one
    context = [k for k in range(count) if k not in named]
    if context != list(range(len(context))):
        return REFERENCE_NOT_FIRST
    return sorted(named), context


def named_choice(
    pictures: Sequence[Any],
    placed: tuple[list[int], list[int]],
    shown: list[int],
    letters: Sequence[str],
    answer: int | str,
    **asked: Any,
) -> Choice | str:
    """The Choice of a question whose option k names picture `shown[k]` of its `pictures`:
    `placed` is pictures_named's (candidates, context), `answer` the right option or why there
    is none, `asked` the Choice's item, task, question and extra; or why it is skipped (the
    answer's fault first, then an order-dependent question: lad.data.screen)."""
    candidates, context = placed
    moved = picture_question_reason(asked["question"], len(context), len(candidates))
    if moved is not None:
        return first_reason(answer, moved)
    return Choice(
        candidates=[pictures[k] for k in candidates],
        context=[pictures[k] for k in context],
        answer=candidates.index(shown[answer]) if isinstance(answer, int) else None,
        unanswered=answer if isinstance(answer, str) else None,
        replies=[letters[shown.index(k)] for k in candidates],
        **asked,
    )


def first_reason(answer: int | str, reason: str) -> str:
    """The reason a row is skipped: a fault of its answer first, as the converters always have."""
    return answer if isinstance(answer, str) else reason
