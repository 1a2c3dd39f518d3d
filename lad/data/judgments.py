"""Pairwise judgments (MT-Bench style: which of two answers to a question is better) as lad items
of N = 2 text candidates (`lad data judgments`; docs/data.md, "Text candidates", has both row
shapes): the two answers are the candidates, the winner is the answer, and the question asks
which answer is better (JUDGE_QUESTION). A tie is skipped (TIE): with two candidates neither is
right, and lad never picks one for it. A second-turn judgment is skipped (SECOND_TURN): its
answers follow a first exchange the prompt would have to show.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lad.data.items import Item
from lad.data.released import Row, Written
from lad.data.textjsonl import EMPTY_QUESTION, convert_rows, field_task, text_item
from lad.errors import DataError

JUDGE_QUESTION = (
    "Which of the two responses answers the user's question better?\nUser's question: {}"
)
TIE = "tie"
SECOND_TURN = "second turn"
NO_WINNER = "no winner"
_FIRST, _SECOND = {"model_a", "a", "0"}, {"model_b", "b", "1"}


def winner_index(value: Any) -> int | str:
    """0 for the first answer, 1 for the second, or the reason there is none (a tie)."""
    if value is None or isinstance(value, bool):
        return NO_WINNER
    text = str(value).strip().lower()
    if text in _FIRST:
        return 0
    if text in _SECOND:
        return 1
    return TIE if text.startswith("tie") else NO_WINNER


def _first(conversation: Any, role: str, where: str) -> str | None:
    if not isinstance(conversation, list):
        raise DataError(f"{where}a conversation must be a list of {{role, content}} messages")
    for message in conversation:
        if isinstance(message, dict) and message.get("role") == role:
            return message.get("content")
    return None


def convert_row(row: Row, k: int) -> Item | str:
    """The item for one judgment (its number in the file `k`), or why not."""
    fields = row.fields
    winner = winner_index(fields.get("winner"))
    if "conversation_a" in fields:
        turn = fields.get("turn") or 1
        if isinstance(turn, str) and turn.strip().isdigit():
            turn = int(turn)
        if not isinstance(turn, int) or isinstance(turn, bool):
            raise DataError(f"{row.where}'turn' must be a whole number (1, 2), got {turn!r:.40}")
        if turn != 1:
            return SECOND_TURN
        a, b = fields["conversation_a"], fields.get("conversation_b")
        question = _first(a, "user", row.where)
        answers = [_first(a, "assistant", row.where), _first(b, "assistant", row.where)]
        name = f"{fields.get('question_id')}-{fields.get('model_a')}-{fields.get('model_b')}"
    elif {"question", "answer_a", "answer_b"} <= set(fields):
        question, answers = fields["question"], [fields["answer_a"], fields["answer_b"]]
        name = str(fields.get("id", fields.get("question_id", "q")))
    else:
        raise DataError(
            f"{row.where}expected a judgment's fields (question, answer_a, answer_b, winner) or "
            "MT-Bench's (conversation_a, conversation_b, winner)"
        )
    if not isinstance(question, str) or not question.strip():
        return EMPTY_QUESTION
    kept = ("question_id", "model_a", "model_b", "judge")
    extra = {"source": "judgments", **{key: fields[key] for key in kept if key in fields}}
    query = JUDGE_QUESTION.format(question.strip())
    answers = [a if isinstance(a, str) else "" for a in answers]
    return text_item(f"judgment-{name}-{k}", query, answers, winner, extra, row.where)


def import_judgments(path: str | Path, out: str | Path, **options: Any) -> Written:
    """`lad data judgments` (lad.data.textjsonl.convert_rows; options: task, a judge, ...)."""
    return convert_rows(
        path, out, benchmark="judgments", rule=convert_row, task_of=field_task("judge"), **options
    )
