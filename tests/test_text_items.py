"""Items of text candidates (`candidates`) and their prompt (lad.core.prompts.render_text)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lad.core.labels import get_scheme
from lad.core.prompts import (
    CAPTION,
    TEXT,
    PromptTemplate,
    describe_prompt,
    prompt_sha256,
    render_prompt,
    render_text,
    render_text_item,
    vanilla_template,
)
from lad.data.items import Item, read_items, write_items
from lad.errors import DataError, LadError


def _write(tmp_path, *objs):
    path = tmp_path / "items.jsonl"
    path.write_text("".join(json.dumps(o) + "\n" for o in objs))
    return path


def test_read_and_write_text_items(tmp_path):
    obj = {"id": "q1", "query": "2 + 2?", "candidates": ["3", "4", "five"], "answer": 1, "s": 7}
    items = read_items(_write(tmp_path, obj))
    assert items[0].candidates == ["3", "4", "five"] and items[0].images == []
    assert items[0].is_text and items[0].num_candidates == 3 and items[0].extra == {"s": 7}
    out = tmp_path / "out.jsonl"
    write_items(out, items)
    assert json.loads(out.read_text()) == obj


@pytest.mark.parametrize(
    ("obj", "message"),
    [
        ({"images": ["a.png", "b.png"]}, "either 'images' \\(pictures\\) or 'candidates'"),
        ({"candidates": ["a"]}, "'candidates' must be a list of at least 2 texts"),
        ({"candidates": ["a", 3]}, "'candidates' must be a list of at least 2 texts"),
        ({"candidates": ["a", "  "]}, "'candidates' 1 is blank"),
        ({"candidates": ["a", "<image> b"]}, "'candidates' 1 holds <image>"),
        ({"context_images": ["r.png"]}, "text 'candidates' cannot have 'context_images'"),
        ({"answer": 2}, "'answer' 2 is not an index into its 2 texts"),
    ],
)
def test_bad_text_items_are_one_line(tmp_path, obj, message):
    base = {"id": "q", "query": "which?", "candidates": ["a", "b"], "answer": 0}
    with pytest.raises(DataError, match=r"items.jsonl:1: .*" + message):
        read_items(_write(tmp_path, {**base, **obj}))


def test_prompt_lists_options_under_labels():
    item = Item("q", "Which is a fruit?", [], 0, candidates=["apple", "a stone", "iron"])
    prompt = render_text_item(TEXT, item, [2, 0, 1], get_scheme("upper"))
    assert prompt.text == (
        "Given 3 options labelled from A to C, answer the question by choosing one option. "
        "Respond with the option's letter only and nothing else.\n"
        "Question: Which is a fruit?\nOptions:\nA. iron\nB. apple\nC. a stone\nAnswer:"
    )
    assert [prompt.text[s:e] for s, e in prompt.spans] == ["iron", "apple", "a stone"]


@given(
    st.lists(st.text(min_size=1, max_size=12).filter(str.strip), min_size=2, max_size=12),
    st.randoms(),
)
def test_spans_are_the_options_texts(options, rnd):
    order = list(range(len(options)))
    rnd.shuffle(order)
    shown = [options[i] for i in order]
    prompt = render_text(TEXT, "q {x}", shown, get_scheme("digits"))
    assert [prompt.text[s:e] for s, e in prompt.spans] == shown
    for p, (s, _) in enumerate(prompt.spans):  # the label sits right before, outside the span
        assert prompt.text[:s].endswith(f"{p + 1}. ")


def test_templates_of_ones_own_and_kinds():
    custom = PromptTemplate("Q: {query}\n{options}\nA ({first}-{last}):")
    prompt = render_text(custom, "why?", ["x", "y"], get_scheme("digits"))
    assert prompt.text == "Q: why?\n1. x\n2. y\nA (1-2):" and prompt.spans == [(11, 12), (16, 17)]
    with pytest.raises(LadError, match="writes \\{options\\} twice"):
        PromptTemplate("{query} {options} {options}")
    with pytest.raises(LadError, match="does not write \\{options\\}"):
        render_text(CAPTION, "q", ["x", "y"], get_scheme("digits"))
    with pytest.raises(LadError, match="lists text candidates, but the candidates are pictures"):
        render_prompt(custom, "q", get_scheme("digits"), 2)
    text = Item("t", "q", [], 0, candidates=["x", "y"])
    picture = Item("p", "q", ["a.png", "b.png"], 0)
    assert vanilla_template([text]) is TEXT
    with pytest.raises(DataError, match="items mix text candidates"):
        vanilla_template([text, picture])
    with pytest.raises(LadError, match="does not write \\{options\\}"):
        vanilla_template([text], CAPTION)
    with pytest.raises(LadError, match="lists text candidates"):
        vanilla_template([picture], custom)
    sha = prompt_sha256(TEXT, get_scheme("digits"), 4)
    assert sha != prompt_sha256(CAPTION, get_scheme("digits"), 4)
    assert describe_prompt(sha, ["1", "2", "3", "4"]).startswith("the text-candidate prompt")
