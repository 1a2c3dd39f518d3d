"""Text candidates (an item's `candidates`) on tiny random-init causal LMs built on the REAL
tokenizers and chat templates of two text-model families (Qwen3, Llama 3; the files are in
LAD_REAL_CHECKPOINTS, ../shared/real-checkpoints/SOURCES.md), and on a tiny multimodal model.

Each record is checked against a brute-force reference that does not use lad's prompt building,
label trie, capture or cache: the prompt written out here from the template's published wording
and the model's own chat template, each option's token span found by tokenising the prompt up to
the option's label and up to the end of its text, the label log-probabilities from plain no-cache
forwards of the prompt and each branching prefix of the replies (restricted softmax, DESIGN.md),
and the span attention from eager `output_attentions` summed over those spans.
"""

from __future__ import annotations

import os
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from lad.backends import load_backend
from lad.core.labels import get_scheme
from lad.core.prompts import TEXT
from lad.data.items import Item, cyclic_shift
from lad.data.orders import Request
from lad.errors import BackendError
from lad.testing.text import build_tiny_text_model

ENV = "LAD_REAL_CHECKPOINTS"
QUESTION = "Which city is the capital of France?"
OPTIONS = [
    "Paris",
    "the old city of Rome",
    "Berlin in 1990",
    "Madrid",
    "Lisbon by the sea",
    "Vienna",
    "Prague",
    "Warsaw",
    "Oslo",
    "Bern",
    "Athens",
    "Dublin",
]
FAMILIES = {"qwen3": "qwen3-text-tokenizer", "llama3": "llama3-text-tokenizer"}


def _tokenizer_folder(family: str) -> Path:
    if not os.environ.get(ENV):
        pytest.skip(
            f"{ENV} is not set: point it at ../shared/real-checkpoints (which holds "
            f"{FAMILIES[family]}) to run the text-model tests"
        )
    for folder in os.environ[ENV].split(os.pathsep):
        if (Path(folder) / FAMILIES[family] / "tokenizer.json").is_file():
            return Path(folder) / FAMILIES[family]
    pytest.skip(f"{FAMILIES[family]}: no such tokenizer folder in {ENV}={os.environ[ENV]}")


@cache
def _text_model(family: str, root: str) -> Path:
    """A 2-layer random-init causal LM of the family's architecture on its real tokenizer (or,
    for "tiny", a Llama on lad's own word tokenizer, needing no files)."""
    arch = {"qwen3": "qwen2", "llama3": "llama", "tiny": "llama"}[family]
    folder = None if family == "tiny" else _tokenizer_folder(family)
    return build_tiny_text_model(arch, Path(root) / family, tokenizer=folder)


@pytest.fixture(scope="module")
def models_root(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("text-models"))


def _user_text(order: list[int], n: int, labels: list[str], noun: str) -> tuple[str, list[int]]:
    """The text-candidate prompt, written out here (lad.core.prompts.TEXT_TEMPLATES' wording),
    and where each option's label line starts."""
    head = (
        f"Given {n} options labelled from {labels[0]} to {labels[-1]}, answer the question by "
        f"choosing one option. Respond with the option's {noun} only and nothing else.\n"
        f"Question: {QUESTION}\nOptions:\n"
    )
    starts, text = [], head
    for p in range(n):
        starts.append(len(text))
        text += f"{labels[p]}. {OPTIONS[order[p]]}" + ("\n" if p < n - 1 else "")
    return text + "\nAnswer:", starts


class Reference:
    """Brute force on the transformers model itself: eager attention, no cache, batch 1."""

    def __init__(self, path: Path, multimodal: bool) -> None:
        from transformers import (
            AutoModelForCausalLM,
            AutoModelForImageTextToText,
            AutoProcessor,
            AutoTokenizer,
        )

        auto = AutoModelForImageTextToText if multimodal else AutoModelForCausalLM
        self.model = auto.from_pretrained(path, attn_implementation="eager").eval()
        self.multimodal = multimodal
        self.chat_owner = AutoProcessor.from_pretrained(path) if multimodal else None
        self.tok = self.chat_owner.tokenizer if multimodal else AutoTokenizer.from_pretrained(path)

    def chat(self, turns: list[tuple[str, str]], generation: bool) -> str:
        if self.multimodal:
            msgs = [{"role": r, "content": [{"type": "text", "text": t}]} for r, t in turns]
            owner = self.chat_owner
        else:
            msgs = [{"role": r, "content": t} for r, t in turns]
            owner = self.tok
        return owner.apply_chat_template(msgs, add_generation_prompt=generation, tokenize=False)

    def ids(self, text: str) -> list[int]:
        bos = self.tok.bos_token
        return self.tok(text, add_special_tokens=not (bos and text.startswith(bos)))["input_ids"]

    def replies(self, user: str, labels: list[str]) -> list[list[int]]:
        """Each label's tokens after the prompt as the chat template writes the reply, then the
        token that ends the turn."""
        prompt = self.chat([("user", user)], True)
        head = self.ids(prompt)
        seqs = []
        for label in labels:
            full = self.chat([("user", user), ("assistant", label)], False)
            assert full.startswith(prompt)
            reply = full[len(prompt) :]
            cut = reply.index(label) + len(label)
            ids = self.ids(prompt + reply[:cut])
            assert ids[: len(head)] == head
            end = self.tok(reply[cut:].lstrip(" \n"), add_special_tokens=False)["input_ids"]
            seqs.append([*ids[len(head) :], end[0] if end else self.tok.eos_token_id])
        return seqs

    @torch.no_grad()
    def logits(self, ids: list[int]) -> torch.Tensor:
        return self.model(input_ids=torch.tensor([ids])).logits[0, -1].double()

    def logprobs(self, prompt_ids: list[int], seqs: list[list[int]]) -> list[float]:
        """Joint restricted-softmax log P of each reply: at each step, over the tokens some
        reply with the same prefix takes next (one valid token: a forced step, adds 0)."""
        out = []
        for seq in seqs:
            total = 0.0
            for j, token in enumerate(seq):
                valid = sorted({s[j] for s in seqs if s[:j] == seq[:j] and len(s) > j})
                if len(valid) > 1:
                    logits = self.logits(prompt_ids + seq[:j])
                    total += torch.log_softmax(logits[valid], -1)[valid.index(token)].item()
            out.append(total)
        return out

    @torch.no_grad()
    def attention(self, ids: list[int], spans: list[tuple[int, int]]) -> np.ndarray:
        out = self.model(input_ids=torch.tensor([ids]), output_attentions=True)
        rows = [a[0, :, -1, :].double().mean(0) for a in out.attentions]  # (T,) per layer
        return np.array([[row[s:e].sum().item() for s, e in spans] for row in rows])

    def record(self, order: list[int], scheme_name: str) -> tuple[list[float], np.ndarray]:
        scheme = get_scheme(scheme_name)
        n = len(order)
        labels = scheme.labels(n)
        user, starts = _user_text(order, n, labels, scheme.noun)
        chat = self.chat([("user", user)], True)
        base = chat.index(user)
        ids = self.ids(chat)
        spans = []
        for p in range(n):
            label_end = base + starts[p] + len(labels[p]) + 1  # through "<label>."
            text_end = base + starts[p] + len(labels[p]) + 2 + len(OPTIONS[order[p]])
            lo, hi = len(self.ids(chat[:label_end])), len(self.ids(chat[:text_end]))
            assert ids[:hi] == self.ids(chat[:text_end])  # the pieces tokenise as the whole
            spans.append((lo, hi))
        return self.logprobs(ids, self.replies(user, labels)), self.attention(ids, spans)


def _item(n: int, item_id: str = "capital") -> Item:
    return Item(item_id, QUESTION, [], 0, candidates=OPTIONS[:n])


def _check(path: Path, multimodal: bool, n: int, scheme: str, capture: str = "fast") -> None:
    backend = load_backend(str(path), device="cpu", quiet=True)
    ref = Reference(path, multimodal)
    item = _item(n)
    orders = [cyclic_shift(n, s) for s in range(min(n, 3))] + [list(range(n))[::-1]]
    requests = [Request(item, k, order) for k, order in enumerate(orders)]
    records = list(
        backend.records(
            requests, template=TEXT, scheme=get_scheme(scheme), batch_size=2, capture=capture
        )
    )
    for record, order in zip(records, orders, strict=True):
        logprobs, attention = ref.record(order, scheme)
        assert record.order == order and record.answer == order.index(0)
        np.testing.assert_allclose(record.logprobs, logprobs, atol=2e-5)
        np.testing.assert_allclose(np.exp(record.logprobs).sum(), 1.0, atol=1e-9)
        np.testing.assert_allclose(record.attention, attention, atol=2e-6)


@pytest.mark.parametrize("family", [*sorted(FAMILIES), "tiny"])
@pytest.mark.parametrize(("n", "scheme"), [(4, "digits"), (3, "upper"), (12, "digits")])
def test_text_model_records_equal_brute_force(family, n, scheme, models_root):
    _check(_text_model(family, models_root), False, n, scheme)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_text_model_eager_capture_equals_brute_force(family, models_root):
    _check(_text_model(family, models_root), False, 4, "digits", capture="eager")


@pytest.mark.parametrize("arch", ["qwen2_vl", "llava"])
def test_multimodal_model_takes_text_candidates(arch, tmp_path):
    from lad.testing.tiny import build_tiny_model

    _check(build_tiny_model(arch, tmp_path / arch), True, 4, "digits")


def test_padding_does_not_change_records(models_root):
    """Two items of different prompt lengths in one left-padded batch = each alone."""
    backend = load_backend(str(_text_model("qwen3", models_root)), device="cpu", quiet=True)
    long = Item(
        "long", QUESTION + " Think of Europe in the year 2000.", [], 2, candidates=OPTIONS[:4]
    )
    requests = [Request(_item(4), 0, [0, 1, 2, 3]), Request(long, 0, [3, 2, 1, 0])]
    kw: dict[str, Any] = dict(template=TEXT, scheme=get_scheme("digits"))
    together = list(backend.records(requests, batch_size=2, **kw))
    alone = [next(iter(backend.records([r], batch_size=1, **kw))) for r in requests]
    for a, b in zip(together, alone, strict=True):
        np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-5)
        np.testing.assert_allclose(a.attention, b.attention, atol=1e-6)
        assert a.extra == b.extra
    assert together[1].answer == 1 and together[1].extra["candidate_tokens"][0] >= 1


def test_text_model_refuses_pictures_and_picture_options(models_root, tmp_path):
    path = _text_model("tiny", models_root)
    with pytest.raises(BackendError, match="text-only causal LM: it takes no image options"):
        load_backend(str(path), device="cpu", quiet=True, image_size=224)
    backend = load_backend(str(path), device="cpu", quiet=True)
    picture = tmp_path / "a.png"
    from PIL import Image

    Image.new("RGB", (8, 8)).save(picture)
    item = Item("pic", "a red square", [picture, picture], 0)
    with pytest.raises(
        BackendError, match=r"'pic': .* is a text-only causal LM and cannot be shown"
    ):
        list(backend.records([Request(item, 0, [0, 1])], scheme=get_scheme("digits")))
