"""A generic file of text multiple-choice questions as lad items of text candidates (`lad data
text`; docs/data.md, "Text candidates"), and what the text converters share (lad.data.mmlu,
lad.data.judgments): the answer read as an index, a letter or an option's text (`answer_index`),
a row's item checked by the items reader's rules (`text_item`), and the conversion with its
held-out split and summary, as for the picture benchmarks (lad.data.released).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from lad.core.prompts import CONTEXT_PLACEHOLDER
from lad.data.items import ITEM_KEYS, Item, ItemRuleError, check_item, item_object
from lad.data.questions import Benchmark, Questions, Row
from lad.data.released import Converted, Options, Written, check_split, write_split
from lad.data.rules import ANSWER_NOT_AN_OPTION, EMPTY_QUESTION, NO_ANSWER, OTHER_N
from lad.data.screen import text_question_reason
from lad.errors import DataError
from lad.io import limits

AMBIGUOUS_ANSWER = "answer text matches several options"
TOO_FEW_OPTIONS = "fewer than 2 options"
BAD_OPTION = "option blank, too long or holding <image>"
# Besides these, lad.data.rules' (no answer, ...) and lad.data.screen's ORDER_DEPENDENT, a row
# whose item would break a rule of the items reader (lad.data.items.check_item: more than 26
# options, a repeated option, a lone surrogate, <image> in the question, a question too long) is
# skipped under that rule's reason.


def answer_index(
    value: Any, options: Sequence[str], labels: Sequence[str] | None = None
) -> int | str:
    """The 0-based option an answer names, or the reason it names none: an integer index; a
    string among `labels` (the file's own option labels, e.g. ARC's "A".."D" or "1".."4"); a
    single letter A.. (or a..); or the text of exactly one option. An answer that could name two
    options (a letter that is another option's text) is refused, never guessed."""
    if value is None or isinstance(value, bool) or (isinstance(value, str) and not value.strip()):
        return NO_ANSWER
    if isinstance(value, int):
        return value if 0 <= value < len(options) else ANSWER_NOT_AN_OPTION
    text = str(value).strip()
    if labels is not None:
        return list(labels).index(text) if text in labels else ANSWER_NOT_AN_OPTION
    letter = ord(text.upper()) - ord("A") if len(text) == 1 and text.isascii() else -1
    by_letter = letter if text.isalpha() and 0 <= letter < len(options) else None
    matches = [k for k, option in enumerate(options) if option.strip() == text]
    if len(matches) > 1 or (by_letter is not None and matches and matches != [by_letter]):
        return AMBIGUOUS_ANSWER  # e.g. "B" names option 2 while option 3's text is "B"
    if by_letter is not None:
        return by_letter
    return matches[0] if matches else ANSWER_NOT_AN_OPTION


def text_item(
    item_id: str, question: Any, options: Any, answer: int | str, extra: dict[str, Any], where: str
) -> Item | str:
    """An item of text candidates, or why the row cannot be one."""
    if not isinstance(options, list) or not all(isinstance(o, str) for o in options):
        raise DataError(f"{where}the options must be a list of texts, got {str(options)[:80]!r}")
    if isinstance(answer, str):
        return answer
    if not isinstance(question, str) or not question.strip():
        return EMPTY_QUESTION
    if len(options) < 2:
        return TOO_FEW_OPTIONS
    if any(
        not o.strip() or CONTEXT_PLACEHOLDER in o or len(o) > limits.QUERY.value for o in options
    ):
        return BAD_OPTION
    options = [o.strip() for o in options]
    moved = text_question_reason(question, options)
    if moved is not None:
        return moved  # docs/data.md, "Order-dependent questions"
    kept = {k: v for k, v in extra.items() if k not in ITEM_KEYS}  # never a key of the format
    item = Item(item_id, question.strip(), [], answer, kept, candidates=options)
    try:  # what a converter writes, lad's reader reads: its rules, applied before writing
        check_item(item_object(item, Path.cwd()), where)
    except ItemRuleError as e:
        return e.reason
    return item


def field_task(name: str) -> Callable[[Row], str]:
    """A row's task: its field `name`, "all" where that is missing or empty."""
    return lambda row: str(row.fields.get(name) or "all")


# The rows of a file of text questions, as lad.data.questions reads any released file.
_ANY_ROWS = Benchmark("text", "text questions", lambda row: "", embedded=False)


def convert_rows(
    path: str | Path,
    out: str | Path,
    *,
    benchmark: str,
    rule: Callable[[Row, int], Item | str],
    task_of: Callable[[Row], str] = lambda row: "all",
    task: str | None = None,
    num_candidates: int | None = None,
    items: int | None = None,
    calibration_items: int = 5,
    seed: int = 0,
) -> Written:
    """Every row of `task` (None: of every task) of the file (JSON Lines, a JSON list, parquet,
    or a folder of parquet files) through `rule` (the row and its 0-based number in the file to
    an item, or why it is skipped), keeping the items of `num_candidates` candidates (None: every
    N, a cell each), into an items file `out`, its held-out calibration items and a summary."""
    check_split(items, calibration_items)
    rows = list(Questions(path).rows(_ANY_ROWS, None))
    tasks = sorted({task_of(row) for row in rows})
    if task is not None and task not in tasks:
        raise DataError(f"{path}: no question of task {task!r}; its tasks: {tasks}")
    converted = Converted()
    for k, row in enumerate(rows):
        name = task_of(row)
        if task is not None and name != task:
            continue
        made = rule(row, k)
        if isinstance(made, str):
            converted.skip(name, made)
        elif num_candidates is not None and made.num_candidates != num_candidates:
            converted.skip(name, OTHER_N, made.num_candidates)
        else:
            converted.add(name, made)
    seen: set[str] = set()
    for it in converted.items:
        if it.id in seen:
            raise DataError(f"{path}: two questions have the id {it.id!r}; ids must be unique")
        seen.add(it.id)
    split = Options(items=items, calibration_items=calibration_items, seed=seed)
    return write_split(converted, out, benchmark, path, split)


def import_text(
    path: str | Path,
    out: str | Path,
    *,
    question_field: str = "question",
    options_field: str | None = None,
    answer_field: str = "answer",
    task_field: str | None = None,
    **options: Any,
) -> Written:
    """`lad data text`: one question per row, its options a list of texts (`options`, else
    `choices`), its answer an index, a letter or one option's text (answer_index); an `id` field
    names the item (else `text-<row>`), other fields are kept as extra keys. options: task,
    num_candidates, items, calibration_items, seed (convert_rows)."""
    keys = {question_field, answer_field, "id"}

    def rule(row: Row, k: int) -> Item | str:
        field = options_field or ("options" if "options" in row.fields else "choices")
        flags = ((question_field, "question"), (field, "options"), (answer_field, "answer"))
        for key, flag in flags:
            if key not in row.fields:
                raise DataError(f"{row.where}missing field {key!r} (set it with --{flag}-field)")
        choices = row.fields[field]
        answer = answer_index(
            row.fields[answer_field], choices if isinstance(choices, list) else []
        )
        item_id = str(row.fields["id"]) if row.fields.get("id") is not None else f"text-{k}"
        extra = {key: v for key, v in row.fields.items() if key not in keys | {field}}
        return text_item(item_id, row.fields[question_field], choices, answer, extra, row.where)

    def task_of(row: Row) -> str:
        return "all" if task_field is None else str(row.fields.get(task_field))

    return convert_rows(path, out, benchmark="text", rule=rule, task_of=task_of, **options)
