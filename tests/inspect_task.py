"""The local multiple-choice tasks tests/test_inspect.py runs with Inspect's own `inspect eval`
(`inspect eval tests/inspect_task.py@lad_mock -T data=test.jsonl`): MMLU-style questions from a
JSON Lines file (question, subject, choices, answer), each sample named as `lad data mmlu` names
its item. `lad_mock` is answered by Inspect's mockllm with `mock_choice`, a position-biased rule
of the prompt it is shown."""

from __future__ import annotations

import json
import re

from inspect_ai import Task, task
from inspect_ai.dataset import Sample
from inspect_ai.model import ChatMessage, GenerateConfig, ModelOutput, ModelUsage, get_model
from inspect_ai.scorer import choice
from inspect_ai.solver import multiple_choice

from lad.harness.inspect_audit import circular, position

QUESTIONS = [
    ("Which animal can fly?", "animals", ["a dog", "a red kite", "a cat", "a fish"], 1),
    ("Which is a fruit?", "food", ["a hammer", "a chair", "an apple", "a river"], 2),
    ("Which is a colour?", "misc", ["blue", "seven", "Paris", "iron"], 0),
    ("Which is a metal?", "misc", ["wool", "wood", "glass", "copper"], 3),
    ("Which city is in France?", "geo", ["Rome", "Lyon", "Oslo", "Bern"], 1),
    ("Which number is even?", "math", ["three", "five", "eight", "nine"], 2),
    ("Which one is a tree?", "plants", ["an oak", "a rose", "moss", "a fern"], 0),
    ("Which is a planet?", "space", ["the Moon", "the Sun", "Sirius", "Mars"], 3),
]
# pairwise judgments (N = 2): both orders; the mock judge prefers whichever reply comes first
PAIRS = [
    ("Which reply to a thank-you is polite?", "judge", ["you are welcome", "go away"], 0),
    ("Which reply to a greeting is polite?", "judge", ["what", "hello, nice to meet you"], 1),
    ("Which reply to an apology is kind?", "judge", ["no problem at all", "never again"], 0),
    ("Which is the longer word?", "judge", ["cat", "elephant"], 1),
]
DEV = [
    ("Which is a bird?", "animals", ["a crow", "a cow", "a carp", "a cat"], 0),
    ("Which is a drink?", "food", ["bread", "tea", "salt", "rice"], 1),
    ("Which is a shape?", "misc", ["loud", "square", "sweet", "slow"], 1),
    ("Which is a tool?", "misc", ["a saw", "a song", "a sock", "a sea"], 0),
    ("Which is a season?", "misc", ["north", "winter", "noon", "nine"], 1),
]


def mock_choice(shown: list[str], question: str) -> int:
    """The mock's answer to `question` with options `shown`: the longest option (ties: the
    alphabetically last) where it is shown first or second, else the first option; no readable
    answer for the colour question; always the first reply to a judgment of replies."""
    if "colour" in question:
        return -1
    if "reply" in question:
        return 0
    best = max(range(len(shown)), key=lambda p: (len(shown[p]), shown[p]))
    return best if best < 2 else 0


def _mock(input: list[ChatMessage], tools, tool_choice, config: GenerateConfig) -> ModelOutput:
    text = input[-1].text
    shown = re.findall(r"^[A-Z]\) (.*)$", text, flags=re.MULTILINE)
    question = next(q for q, *_ in QUESTIONS + PAIRS if q in text)
    p = mock_choice(shown, question)
    reply = "I cannot tell." if p < 0 else f"ANSWER: {chr(ord('A') + p)}"
    output = ModelOutput.from_content(model="mockllm", content=reply)
    output.usage = ModelUsage(input_tokens=1, output_tokens=1, total_tokens=2)  # no tokenizer
    return output


def _samples(data: str) -> list[Sample]:
    with open(data, encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return [
        Sample(
            input=r["question"],
            choices=r["choices"],
            target=chr(ord("A") + r["answer"]),
            id=f"mmlu-{r['subject']}-{i}",
        )
        for i, r in enumerate(rows)
    ]


def _mockllm():
    return get_model("mockllm/model", custom_outputs=_mock, memoize=False)


@task
def lad_mock(data: str) -> Task:
    return Task(dataset=_samples(data), solver=circular(), scorer=position(), model=_mockllm())


@task
def lad_plain(data: str, mock: bool = False) -> Task:
    model = _mockllm() if mock else None
    return Task(dataset=_samples(data), solver=multiple_choice(), scorer=choice(), model=model)


@task
def lad_circular(data: str) -> Task:
    return Task(dataset=_samples(data), solver=circular(), scorer=position())
