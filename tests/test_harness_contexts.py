"""lm-eval's multiple-choice requests as lad questions (lad.harness.contexts), and the options of
`--model lad` for lm-eval (lad.harness.text_scorer), without lm-eval or a model."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lad.errors import LadError
from lad.harness.contexts import parse_question, questions
from lad.harness.text_scorer import MMLU_PROMPT, PLAIN_CHAT_TEMPLATE, ChoiceOptions

LETTERS = [" A", " B", " C", " D"]


def _mmlu(question: str, choices: list[str], head: str = "") -> str:
    """lm-eval's MMLU doc_to_text, written out here."""
    lines = "".join(f"\n{'ABCD'[k]}. {c}" for k, c in enumerate(choices))
    return f"{head}{question.strip()}{lines}\nAnswer:"


@dataclass
class FakeInstance:
    """What lm-eval's Instance gives a model: args, idx, task_name, doc_id, doc."""

    args: tuple
    idx: int
    task_name: str
    doc_id: int
    doc: Any = None


def test_an_mmlu_prompt_splits_into_question_options_and_tail():
    choices = ["a dog", "a red kite", "a cat", "a fish"]
    context = _mmlu("Which animal can fly?", choices, "The following are about animals.\n\n")
    q = parse_question("mmlu_x", 3, context, LETTERS)
    assert q.question == "The following are about animals.\n\nWhich animal can fly?"
    assert q.options == tuple(choices)
    assert q.tail == "\nAnswer:"
    assert q.scheme == "upper"
    prompt = q.prompt()
    assert prompt.text == context
    assert [context[s:e] for s, e in prompt.spans] == choices  # each span is the option's text


def test_the_documents_own_choices_find_options_that_span_lines():
    choices = ["def f():\n    return 1", "x = 2", "print(3)", "pass"]
    context = _mmlu("Which snippet returns 1?", choices)
    q = parse_question("code", 0, context, LETTERS, {"choices": choices})
    assert q.options == tuple(choices)
    assert q.prompt().text == context


def test_few_shot_examples_stay_in_the_question_and_the_last_options_are_scored():
    shot = _mmlu("Which is red?", ["grass", "blood", "sky", "snow"]) + " B\n\n"
    context = shot + _mmlu("Which is cold?", ["fire", "sun", "ice", "tea"])
    q = parse_question("t", 0, context, LETTERS)
    assert q.options == ("fire", "sun", "ice", "tea")
    assert q.question.startswith(shot)


def test_digit_labels_are_read_as_the_digits_scheme():
    context = "Pick one.\n1. red\n2. blue\n3. green\nAnswer:"
    assert parse_question("t", 0, context, [" 1", " 2", " 3"]).scheme == "digits"


@given(
    st.lists(
        st.text(alphabet="abcdefgh xyz{}()", min_size=1, max_size=12).filter(str.strip),
        min_size=2,
        max_size=6,
        unique_by=lambda text: " ".join(text.split()),  # repeated options are refused
    ),
    st.text(alphabet="abc {}:\n", max_size=10),
)
def test_any_listed_options_render_back_to_the_context(options, tail):
    labels = [chr(ord("A") + k) for k in range(len(options))]
    block = "\n".join(f"{label}. {text}" for label, text in zip(labels, options, strict=True))
    tail = "\nAnswer:" + tail.replace("\n", " ")
    context = f"Which one?\n{block}{tail}"
    q = parse_question("t", 0, context, [f" {x}" for x in labels], {"choices": options})
    assert q.prompt().text == context
    assert q.options == tuple(options)


@pytest.mark.parametrize(
    ("context", "continuations", "says"),
    [
        ("Question: Which can fly?\nAnswer:", [" a kite", " a dog"], "cloze task"),
        ("Which?\n(A) red\n(B) blue\nAnswer:", [" A", " B"], "does not list option 'B'"),
        ("\nA. red\nB. blue\nAnswer:", [" A", " B"], "no question before the options"),
        ("Which?\nA. red\nB. \nAnswer:", [" A", " B"], "option 'B' is empty"),
        ("Which?\nA. red\nB. red \nAnswer:", [" A", " B"], "are the same text"),
        ("Which?\nA. red\nAnswer:", [" A"], "at least 2"),
        ("Which?\nA. red\nB. blue\nAnswer:", ["A", "B"], "not option labels after a space"),
    ],
)
def test_other_task_shapes_are_refused_naming_the_document(context, continuations, says):
    with pytest.raises(LadError, match=says) as e:
        parse_question("my_task", 7, context, continuations)
    assert "lm-eval task 'my_task', document 7" in str(e.value)


def test_requests_are_regrouped_per_document_in_choice_order():
    a = _mmlu("Which is cold?", ["fire", "sun", "ice", "tea"])
    b = _mmlu("Which is wet?", ["sand", "water", "dust", "ash"])
    reqs = [FakeInstance((b, c), k, "t", 1) for k, c in enumerate(LETTERS)]
    reqs += [FakeInstance((a, c), k, "t", 0) for k, c in reversed(list(enumerate(LETTERS)))]
    grouped = questions(reqs)
    assert [g.question.doc_id for g in grouped] == [1, 0]
    assert grouped[0].requests == (0, 1, 2, 3)
    assert grouped[1].requests == (7, 6, 5, 4)  # doc 0's requests came D, C, B, A


def test_extra_requests_of_a_document_are_refused():
    a = _mmlu("Which is cold?", ["fire", "sun", "ice", "tea"])
    reqs = [FakeInstance((a, c), k, "t", 0) for k, c in enumerate(LETTERS)]
    reqs.append(FakeInstance(("", " A"), 4, "t", 0))  # acc_mutual_info's unconditional request
    with pytest.raises(LadError, match="acc_mutual_info"):
        questions(reqs)
    with pytest.raises(LadError, match="requested twice"):
        questions([*reqs[:4], FakeInstance((a, " A"), 0, "t", 0)])


def test_the_shipped_files_are_what_the_harness_uses():
    text = MMLU_PROMPT.read_text(encoding="utf-8")
    assert text == "{question}\n{options}\nAnswer:\n"
    q = parse_question("t", 0, _mmlu("Q?", ["a", "b"]), [" A", " B"])
    assert q.template.text == text.rstrip("\n")  # a calibration made with mmlu.txt fits
    assert PLAIN_CHAT_TEMPLATE.is_file()


@pytest.mark.parametrize(
    ("kwargs", "says"),
    [
        ({"method": "sofa"}, "must be one of"),
        ({"method": "lad"}, "needs a calibration"),
        ({"calibration": "a.json", "calibration_items": "b.jsonl"}, "not both"),
        ({"method": "vanilla", "calibration_items": "/nonexistent.jsonl"}, "no such file"),
        ({"method": "vanilla", "batch_size": 0}, ">= 1"),
    ],
)
def test_model_args_are_checked_before_the_model_loads(kwargs, says):
    with pytest.raises(LadError, match=says):
        ChoiceOptions(**kwargs)
