"""MMLU- and ARC-style multiple choice, as lm-evaluation-harness's datasets store them, as lad
items of text candidates (`lad data mmlu`; docs/data.md, "Text candidates"): MMLU rows
(`question`, `subject`, `choices`, `answer` an index; items `mmlu-<subject>-<row>`, the task is
the subject) and ARC / OpenBookQA rows (`choices` {"text", "label"}, `answerKey` a label; items
named by their `id`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lad.data.items import Item
from lad.data.released import Row, Written
from lad.data.textjsonl import answer_index, convert_rows, field_task, text_item
from lad.errors import DataError


def convert_row(row: Row, k: int) -> Item | str:
    """The item for one MMLU or ARC row (its number in the file `k`), or why not."""
    fields = row.fields
    choices = fields.get("choices")
    question = fields.get("question", fields.get("question_stem"))
    if isinstance(choices, dict):  # ARC / OpenBookQA
        texts, labels = choices.get("text"), choices.get("label")
        if not isinstance(texts, list) or not isinstance(labels, list) or len(texts) != len(labels):
            raise DataError(
                f"{row.where}'choices' must hold lists 'text' and 'label' of one length"
            )
        answer = answer_index(fields.get("answerKey"), texts, [str(x) for x in labels])
        item_id = str(fields["id"]) if fields.get("id") is not None else f"arc-{k}"
        extra = {"source": "arc", "labels": [str(x) for x in labels]}
        return text_item(item_id, question, texts, answer, extra, row.where)
    if not isinstance(choices, list) or "answer" not in fields:
        raise DataError(
            f"{row.where}expected MMLU's fields (question, choices, answer) or ARC's (question, "
            "choices {text, label}, answerKey)"
        )
    subject = str(fields.get("subject") or "all")
    answer = answer_index(fields["answer"], choices)
    extra = {"source": "mmlu", "subject": subject}
    return text_item(f"mmlu-{subject}-{k}", question, choices, answer, extra, row.where)


def import_mmlu(path: str | Path, out: str | Path, **options: Any) -> Written:
    """`lad data mmlu` (lad.data.textjsonl.convert_rows; options: task, an MMLU subject, ...)."""
    return convert_rows(
        path, out, benchmark="mmlu", rule=convert_row, task_of=field_task("subject"), **options
    )
