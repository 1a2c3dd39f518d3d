"""`--model lad/<model>` for Inspect: a local Hugging Face model's answer to a multiple-choice
question, debiased with LAD, from one forward pass (docs/harness.md, "lad inside Inspect").

    inspect eval task.py --model lad/Qwen/Qwen3-0.6B -M calibration_items=dev.items.jsonl

Inspect's `multiple_choice()` sends one user turn, its template around the question and the
options listed "A) <text>", one per line. lad reads the question and the options back from it
(the options block is the last "A) … B) … " run of the turn; the template's instruction, when it
is Inspect's, is left out), and asks them as lm-eval's `--model lad` does
(lad.harness.text_scorer): the prompt "<question>\\nA. <option>\\n…\\nAnswer:" through lad's plain
chat template, one forward pass giving the labels' log-probabilities and the attention over each
option's tokens, and the chosen method (LAD by default) picks the option. The reply is
"ANSWER: <letter>", the form `multiple_choice()` parses; the method's scores of the options are
in the output's metadata. Anything else (several turns, tools, a multiple-answer template, a turn
without an options block) is refused with the reason, never guessed at.
"""

from __future__ import annotations

import asyncio
import re
import threading
from dataclasses import dataclass
from typing import Any

from inspect_ai.model import ChatMessage, ChatMessageUser, GenerateConfig, ModelAPI, ModelOutput
from inspect_ai.tool import ToolChoice, ToolInfo

from lad.errors import LadError
from lad.harness.args import read_model_args
from lad.harness.contexts import ContextQuestion
from lad.harness.text_scorer import ChoiceOptions, ContextScorer

TASK = "inspect"  # the calibration key's task: one calibration per N for the whole run
TAIL = "\nAnswer:"
# Inspect's single-answer instruction (its SINGLE_ANSWER_TEMPLATE's first paragraph, with
# `{letters}` filled in); the multiple-answer one says "one or more of".
_INSTRUCTION = re.compile(
    r"^Answer the following multiple choice question\.[^\n]*LETTER is one of (?P<letters>[A-Z,]+)"
    r"\.[^\n]*\n\n"
)
_MULTIPLE = "multiple answers may be correct"


@dataclass(frozen=True)
class Asked:
    """A multiple-choice turn read back: the question and its options in the order shown."""

    question: str
    options: tuple[str, ...]


def read_turn(text: str) -> Asked:
    """The question and options of a turn written by Inspect's multiple_choice() (any template
    that lists the options "A) …" at its end, one starting each line)."""
    if _MULTIPLE in text:
        raise LadError(
            "--model lad/...: a multiple-answer question (multiple_choice(multiple_correct=True)); "
            "lad chooses one option"
        )
    starts = [m.start() for m in re.finditer(r"(?:^|\n)A\) ", text)]
    if not starts:
        raise LadError(
            "--model lad/...: the turn lists no options 'A) …' (lad answers the questions of "
            f"Inspect's multiple_choice() solver); it begins {text[:120]!r}"
        )
    begin = starts[-1] + (text[starts[-1]] == "\n")
    bounds = [begin]
    while True:
        label = chr(ord("A") + len(bounds))
        found = text.find(f"\n{label}) ", bounds[-1])
        if found < 0:
            break
        bounds.append(found + 1)
    if len(bounds) < 2:
        raise LadError(f"--model lad/...: the turn lists one option only: {text[begin:][:120]!r}")
    ends = [b - 1 for b in bounds[1:]] + [len(text)]
    options = tuple(text[b + 3 : e] for b, e in zip(bounds, ends, strict=True))
    question = text[: max(begin - 1, 0)]
    header = _INSTRUCTION.match(question)
    if header:
        letters = header.group("letters").split(",")
        if letters != [chr(ord("A") + p) for p in range(len(options))]:
            raise LadError(
                f"--model lad/...: the instruction names the letters {letters} but the turn "
                f"lists {len(options)} options"
            )
        question = question[header.end() :]
    question = question.strip("\n")
    if not question.strip():
        raise LadError("--model lad/...: the turn has no question before its options")
    return Asked(question, options)


def context_question(asked: Asked, number: int) -> ContextQuestion:
    """The question as lad's text scorer asks it (lad.harness.contexts)."""
    lines = "\n".join(f"{chr(ord('A') + p)}. {o}" for p, o in enumerate(asked.options))
    return ContextQuestion(
        task=TASK,
        doc_id=number,
        context=f"{asked.question}\n{lines}{TAIL}",
        scheme="upper",
        question=asked.question,
        options=asked.options,
        tail=TAIL,
    )


def refusal(error: Exception) -> Exception:
    """A setup error as Inspect shows its own: one line, without a traceback (inspect_ai's
    PrerequisiteError, which its command line prints alone); the error itself where that class
    has moved."""
    try:
        from inspect_ai._util.error import PrerequisiteError
    except ImportError:
        return error
    return PrerequisiteError(f"Error: {error}")


def _user_text(input: list[ChatMessage]) -> str:
    if len(input) != 1 or not isinstance(input[0], ChatMessageUser):
        roles = [m.role for m in input]
        raise LadError(
            f"--model lad/... scores one user turn (a multiple_choice() question); got {roles}"
        )
    return input[0].text


class LadModelAPI(ModelAPI):
    """lad's one-pass debiased choice as an Inspect model (registered as `lad`)."""

    def __init__(
        self,
        model_name: str,
        base_url: str | None = None,
        api_key: str | None = None,
        config: GenerateConfig = GenerateConfig(),  # noqa: B008  (Inspect's signature)
        **model_args: Any,
    ) -> None:
        super().__init__(model_name, base_url, api_key, [], config)
        try:
            self.options = read_model_args(ChoiceOptions, model_args, "-M", "", model=model_name)
            self.scorer = ContextScorer(self.options)
        except (LadError, ValueError) as e:
            raise refusal(e) from None
        self._lock = threading.Lock()  # one forward pass at a time on the model
        self._asked = 0

    def max_connections(self) -> int:
        return 1

    def _answer(self, asked: Asked) -> tuple[list[float], int]:
        with self._lock:
            self._asked += 1
            ((scores, chosen),) = self.scorer.score([context_question(asked, self._asked)])
        return [float(x) for x in scores], int(chosen)

    async def generate(
        self,
        input: list[ChatMessage],
        tools: list[ToolInfo],
        tool_choice: ToolChoice,
        config: GenerateConfig,
    ) -> ModelOutput:
        if tools:
            raise LadError("--model lad/... answers multiple-choice questions, without tools")
        asked = read_turn(_user_text(input))
        scores, chosen = await asyncio.to_thread(self._answer, asked)
        output = ModelOutput.from_content(
            model=self.model_name, content=f"ANSWER: {chr(ord('A') + chosen)}"
        )
        output.metadata = {"lad": {"method": self.options.method, "scores": scores}}
        return output
