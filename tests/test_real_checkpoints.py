"""lad on the real files of published checkpoints (../shared/real-checkpoints/SOURCES.md).

Each checkpoint's own config.json is shrunk (2 narrow decoder layers, a narrow 2-layer vision
tower; vocabulary, token ids, head size, patch and merge sizes kept), random-initialised, saved
with the checkpoint's own tokenizer, chat template and processor files, and loaded back through
from_pretrained. On it: the prompt lad builds, each image's token span, the label log-probabilities
against a brute-force reference (the replies as the chat template renders them, one full forward
per branching prefix, no cache), fast capture = eager, and batch 1 = batch 4 (left padded).

The files are other people's and are not in this repository. LAD_REAL_CHECKPOINTS names one or
more folders (separated by os.pathsep), each holding one sub-folder per checkpoint; every
sub-folder with a config.json is tested. CI sets it to ../shared/real-checkpoints. The checkpoints
in PINNED also have their prompt and reply written out here by hand, from their published chat
templates.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from lad.backends import load_backend
from lad.backends.hf import Backend
from lad.data.items import Item
from lad.errors import BackendError
from lad.labels import get_scheme
from lad.prompts import render_prompt

ENV = "LAD_REAL_CHECKPOINTS"
DIGITS = get_scheme("digits")
CAPTIONS = ("a red ball", "two dogs asleep on a sofa by the window", "a kite", "snow on a hill")


@dataclass(frozen=True)
class Pinned:
    """What a checkpoint's chat template writes, read off the published template by hand.

    prompt: the rendered prompt, with {images} (`image` once per image) and {text}.
    span: the text of one image whose tokens form its span (placeholder and markers).
    lead: what the template writes between the generation prompt and the label.
    end: the token that ends the reply.
    max_n: the most candidates whose prompt fits the context.
    """

    prompt: str
    image: str
    span: str
    lead: str
    end: str
    max_n: int = 12


PINNED = {
    # The template writes "ASSISTANT: 1 " and no end token; the tokenizer's EOS ends the answer.
    "llava-1.5-7b-hf": Pinned(
        "USER: {images}{text} ASSISTANT:", "<image>\n", "<image>", " ", "</s>", max_n=4
    ),
    "qwen2.5-vl-3b-instruct": Pinned(
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n"
        "{images}{text}<|im_end|>\n<|im_start|>assistant\n",
        "<|vision_start|><|image_pad|><|vision_end|>",
        "<|vision_start|><|image_pad|><|vision_end|>",
        "",
        "<|im_end|>",
    ),
    "smolvlm-256m-instruct": Pinned(
        "<|im_start|>User:{images}{text}<end_of_utterance>\nAssistant:",
        "<image>",
        "<image>",
        " ",
        "<end_of_utterance>",
    ),
}


def _folders() -> list[Path]:
    return [Path(p) for p in os.environ.get(ENV, "").split(os.pathsep) if p.strip()]


def _checkpoint_names() -> list[str]:
    names = dict.fromkeys(PINNED)
    for folder in _folders():
        if folder.is_dir():
            names.update(dict.fromkeys(sorted(p.name for p in folder.iterdir() if _has_config(p))))
    return list(names)


def _has_config(path: Path) -> bool:
    return (path / "config.json").is_file()


def _source(name: str) -> Path:
    if not os.environ.get(ENV):
        pytest.skip(
            f"{ENV} is not set: point it at folders of real checkpoint files "
            "(e.g. ../shared/real-checkpoints) to run these tests"
        )
    for folder in _folders():
        if _has_config(folder / name):
            return folder / name
    pytest.skip(f"{name}: no such checkpoint sub-folder in {ENV}={os.environ[ENV]}")


def _shrink(config: Any) -> Any:
    """Fewer and narrower layers only: vocabulary, token ids, head size, patch/merge sizes kept."""
    text = config.get_text_config()
    head = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    text.num_hidden_layers = 2
    text.num_attention_heads, text.num_key_value_heads = 2, 1  # grouped-query attention
    text.hidden_size, text.head_dim, text.intermediate_size = 2 * head, head, 128
    if getattr(text, "layer_types", None):  # keep one layer of each kind (sliding / full)
        kinds = list(dict.fromkeys(text.layer_types))
        text.layer_types = (kinds * 2)[:2]
    vision = config.vision_config
    for name, value in (
        ("num_hidden_layers", 2),
        ("depth", 2),
        ("num_attention_heads", 2),
        ("num_heads", 2),
        ("hidden_size", 64),
        ("intermediate_size", 128),
    ):
        if hasattr(vision, name):
            setattr(vision, name, value)
    if hasattr(vision, "out_hidden_size"):  # Qwen2.5-VL's merger writes the text width
        vision.out_hidden_size = text.hidden_size
    if getattr(vision, "fullatt_block_indexes", None):
        vision.fullatt_block_indexes = [1]
    return config


@dataclass
class Real:
    name: str
    backend: Backend
    pinned: Pinned | None
    max_n: int


@pytest.fixture(scope="session", params=_checkpoint_names())
def real(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Real:
    from transformers import AutoConfig, AutoModelForImageTextToText

    name = request.param
    source = _source(name)
    out = tmp_path_factory.mktemp("real") / name
    torch.manual_seed(0)
    model = AutoModelForImageTextToText.from_config(_shrink(AutoConfig.from_pretrained(source)))
    model.save_pretrained(out)
    for path in source.iterdir():  # the checkpoint's own tokenizer, template, processor files
        if path.is_file() and path.name != "config.json" and path.suffix != ".safetensors":
            shutil.copy(path, out / path.name)
    backend = load_backend(str(out), device="cpu", dtype="float32")
    pinned = PINNED.get(name)
    return Real(name, backend, pinned, pinned.max_n if pinned else 12)


@pytest.fixture(scope="session")
def images(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    from PIL import Image

    folder = tmp_path_factory.mktemp("real-images")
    rng = np.random.default_rng(0)
    paths = []
    for i in range(12):
        h, w = 56 + 28 * (i % 3), 56 + 28 * (i % 2)  # varied sizes: Qwen's spans differ
        paths.append(folder / f"{i}.png")
        Image.fromarray((rng.random((h, w, 3)) * 255).astype("uint8")).save(paths[-1])
    return paths


def _request(images: list[Path], n: int, k: int = 0) -> tuple[Item, int, list[int]]:
    order = np.random.default_rng(k).permutation(n).tolist()
    shown = images[k : k + n] if k + n <= len(images) else images[:n]
    return Item(f"q{k}", CAPTIONS[k % len(CAPTIONS)], shown, 0), 0, order


# ----------------------------------------------------------------------------- prompt and spans


def _special(tok: Any) -> set[int]:
    added = getattr(tok, "added_tokens_decoder", {})
    return set(tok.all_special_ids) | {i for i, t in added.items() if t.special}


@pytest.mark.parametrize("n", [4, 12])
def test_prompt_and_image_spans(real: Real, images: list[Path], n: int) -> None:
    if n > real.max_n:
        pytest.skip(f"{real.name}: {n} images exceed its context")
    backend, tok = real.backend, real.backend.processor.tokenizer
    req = _request(images, n)
    texts, imgs = backend.build_prompts([req], "vanilla", DIGITS)
    text = render_prompt("vanilla", req[0].query, DIGITS, n)
    prompt = texts[0]
    placeholder = backend.processor.image_token
    at = [i for i in range(len(prompt)) if prompt.startswith(placeholder, i)]
    assert len(at) == n and max(at) < prompt.index(text)  # one per image, all before the text
    if real.pinned:
        assert prompt == real.pinned.prompt.format(images=real.pinned.image * n, text=text)

    inputs, spans = backend.encode([req], texts, imgs)
    ids = inputs["input_ids"][0].tolist()
    special = _special(tok)
    image_id = backend.model.config.image_token_id
    assert len(spans) == 1 and len(spans[0]) == n
    covered = set()
    for k, (s, e) in enumerate(spans[0]):
        assert all(t in special for t in ids[s:e])  # image tokens and markers, nothing else
        before_ok = s == 0 or ids[s - 1] not in special or (k and spans[0][k - 1][1] == s)
        after_ok = e == len(ids) or ids[e] not in special or (k < n - 1 and spans[0][k + 1][0] == e)
        assert before_ok and after_ok  # and all of them: the span is maximal
        # As many image tokens as the processor gives this image alone.
        alone = backend.processor(
            text=[placeholder], images=[[imgs[0][k]]], **backend.image_options
        )["input_ids"][0]
        assert ids[s:e].count(image_id) == list(alone).count(image_id) > 0
        covered.update(range(s, e))
    assert {i for i, t in enumerate(ids) if t == image_id} <= covered
    if real.pinned:  # the tokens outside the spans are the prompt's own tokens, exactly
        bos = tok.bos_token
        plain = tok(prompt, add_special_tokens=not (bos and prompt.startswith(bos)))["input_ids"]
        one = tok(real.pinned.span, add_special_tokens=False)["input_ids"]
        text_only = []
        while plain:
            if plain[: len(one)] == one:
                plain = plain[len(one) :]
            else:
                text_only.append(plain.pop(0))
        assert [t for i, t in enumerate(ids) if i not in covered] == text_only


# ----------------------------------------------------------------------------- exact labels


def _user(text: str, n: int) -> list[dict[str, Any]]:
    return [
        {
            "role": "user",
            "content": [*({"type": "image"} for _ in range(n)), {"type": "text", "text": text}],
        }
    ]


def _replies(
    processor: Any, text: str, n: int, labels: list[str]
) -> tuple[str, str, list[list[int]]]:
    """(prompt, lead, each label's reply tokens + end token), read off the chat template.

    The assistant turn is rendered once around a sentinel: the text before it and after it are
    what the template writes around any label (checked for every label).
    """
    user = _user(text, n)
    prompt = processor.apply_chat_template(user, add_generation_prompt=True, tokenize=False)

    def turn(content: str) -> str:
        reply = [{"role": "assistant", "content": [{"type": "text", "text": content}]}]
        return processor.apply_chat_template(user + reply, tokenize=False)

    before, after = turn("SENTINEL").split("SENTINEL")
    # Where the turn's header is not the generation prompt, the reply starts on its last line.
    cut = len(prompt) if before.startswith(prompt) else before.rindex("\n") + 1
    lead = before[cut:]
    tok = processor.tokenizer
    special = _special(tok)
    tail = tok(after, add_special_tokens=False)["input_ids"]
    end = next((t for t in tail if t in special), tok.eos_token_id)
    head = tok(prompt, add_special_tokens=False)["input_ids"]
    seqs = []
    for label in labels:
        assert turn(label) == before + label + after  # the label is written verbatim
        ids = tok(prompt + lead + label, add_special_tokens=False)["input_ids"]
        full = tok(prompt + lead + label + after, add_special_tokens=False)["input_ids"]
        assert ids[: len(head)] == head and full[: len(ids)] == ids
        seqs.append([*ids[len(head) :], end])
    return prompt, lead, seqs


def _extend(inputs: dict[str, Any], tokens: list[int]) -> dict[str, Any]:
    out = dict(inputs)
    for key, value in inputs.items():
        if torch.is_tensor(value) and value.dim() == 2 and value.shape == inputs["input_ids"].shape:
            fill = torch.tensor([tokens]) if key == "input_ids" else None
            if fill is None:
                fill = torch.full((1, len(tokens)), int(key == "attention_mask"))
            out[key] = torch.cat([value, fill.to(value.dtype)], dim=1)
    return out


@torch.no_grad()
def _brute_force(backend: Backend, req: tuple[Item, int, list[int]], scheme_name: str, n: int):
    """log P(c_k|x): a softmax over the valid next tokens at every branching prefix of the
    template-rendered replies, each prefix run in one full forward without a cache."""
    from PIL import Image

    item, _, order = req
    scheme = get_scheme(scheme_name)
    labels = scheme.labels(n)
    text = render_prompt("vanilla", item.query, scheme, n)
    processor = backend.processor
    prompt, lead, seqs = _replies(processor, text, n, labels)
    imgs = [Image.open(item.images[i]).convert("RGB") for i in order]
    bos = processor.tokenizer.bos_token
    inputs = processor(
        text=[prompt],
        images=[imgs],
        return_tensors="pt",
        add_special_tokens=not (bos and prompt.startswith(bos)),
        **backend.image_options,
    )
    inputs = {k: v for k, v in inputs.items() if k != "offset_mapping"}
    logits: dict[tuple[int, ...], torch.Tensor] = {}
    total = np.zeros(len(seqs))
    for k, seq in enumerate(seqs):
        for i, token in enumerate(seq):
            prefix = tuple(seq[:i])
            valid = sorted({s[i] for s in seqs if len(s) > i and tuple(s[:i]) == prefix})
            if len(valid) == 1:
                continue
            if prefix not in logits:
                out = backend.model(
                    **_extend(inputs, list(prefix)), use_cache=False, logits_to_keep=1
                )
                logits[prefix] = out.logits[0, -1].double()
            total[k] += float(logits[prefix][valid].log_softmax(-1)[valid.index(token)])
    return total, lead, seqs


def _schemes(real: Real) -> Iterator[tuple[str, int]]:
    yield "digits", 4
    if real.max_n >= 12:
        yield "digits", 12
    for name in ("upper", "roman", "words", "image-ordinals"):
        yield name, real.max_n


def test_label_logprobs_equal_brute_force(real: Real, images: list[Path]) -> None:
    backend, tok = real.backend, real.backend.processor.tokenizer
    for scheme_name, n in _schemes(real):
        req = _request(images, n, k=1)
        (record,) = backend.records([req], scheme=get_scheme(scheme_name))
        reference, lead, seqs = _brute_force(backend, req, scheme_name, n)
        gap = float(np.abs(np.array(record.logprobs) - reference).max())
        spread = float(np.abs(reference - np.log(1 / n)).max())
        print(
            f"{real.name} {scheme_name} N={n}: max |lad - reference| = {gap:.1e} (P far from "
            f"uniform by up to {spread:.3f}; reply {tok.convert_ids_to_tokens(seqs[-1])})"
        )
        np.testing.assert_allclose(record.logprobs, reference, atol=1e-5, rtol=0)
        assert np.exp(reference).sum() == pytest.approx(1.0, abs=1e-9)
        assert spread > 1e-3  # the reference discriminates: a wrong token would show
        if real.pinned:
            assert lead == real.pinned.lead
            assert tok.convert_ids_to_tokens(seqs[0][-1]) == real.pinned.end
        # lad scores exactly these sequences.
        trie = backend.label_trie(get_scheme(scheme_name), n)
        assert [[*t, trie.eos] for t in trie.labels] == seqs


def test_shared_first_token_rides_along_in_the_prompt_forward(real: Real, images: list[Path]):
    """A token every label starts with (a leading space) costs no forward of its own."""
    backend = real.backend
    calls = []
    handle = backend.model.register_forward_pre_hook(lambda *a: calls.append(1))
    try:
        for n in sorted({4, real.max_n}):
            calls.clear()
            list(backend.records([_request(images, n)], scheme=DIGITS))
            assert len(calls) == 1, (n, len(calls))
    finally:
        handle.remove()


def test_fast_capture_equals_eager(real: Real, images: list[Path]) -> None:
    reqs = [_request(images, 4, k) for k in range(2)]
    fast = list(real.backend.records(reqs, scheme=DIGITS, batch_size=2))
    eager = list(real.backend.records(reqs, scheme=DIGITS, batch_size=2, capture="eager"))
    for f, e in zip(fast, eager, strict=True):
        np.testing.assert_allclose(f.attention, e.attention, atol=1e-5, rtol=0)
        np.testing.assert_allclose(f.logprobs, e.logprobs, atol=1e-5, rtol=0)


def test_batch_of_four_equals_one_at_a_time(real: Real, images: list[Path]) -> None:
    reqs = [_request(images, 4, k) for k in range(4)]
    one = list(real.backend.records(reqs, scheme=DIGITS, batch_size=1))
    four = list(real.backend.records(reqs, scheme=DIGITS, batch_size=4))
    assert len({r.extra["prompt_tokens"] for r in one}) > 1  # so the batch was left padded
    for a, b in zip(one, four, strict=True):
        assert (a.item, a.order, a.extra) == (b.item, b.order, b.extra)
        np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-5, rtol=0)
        np.testing.assert_allclose(a.attention, b.attention, atol=1e-5, rtol=0)


# Checkpoints whose published chat template writes every image before any text.
IMAGES_FIRST = ("llava-1.5-7b-hf", "llava-onevision-qwen2-7b-ov-hf")


@pytest.mark.parametrize("inline", [False, True])
def test_context_picture_tokens_are_in_no_span(real: Real, images: list[Path], inline: bool):
    """An item's context picture (before the candidates, or at its question's <image>) is in the
    prompt with all its tokens, and none of them is in a candidate's span."""
    backend = real.backend
    question = "Which one is like <image>?" if inline else "Which one is like the first image?"
    item = Item("ctx", question, images[:3], 0, question=question)
    item.context_images = [images[4]]  # another size than the candidates: its own token count
    req = (item, 0, [2, 0, 1])
    if inline and real.name in IMAGES_FIRST:
        with pytest.raises(BackendError, match="does not keep the pictures where the question"):
            backend.build_prompts([req], "vanilla", DIGITS)
        return
    texts, imgs = backend.build_prompts([req], "vanilla", DIGITS)
    inputs, spans = backend.encode([req], texts, imgs)
    ids = inputs["input_ids"][0].tolist()
    image_id = backend.model.config.image_token_id

    def alone(path: Path) -> int:
        picture = backend.picture(path)
        out = backend.processor(
            text=[backend.processor.image_token], images=[[picture]], **backend.image_options
        )
        return list(out["input_ids"][0]).count(image_id)

    where = [i for i, t in enumerate(ids) if t == image_id]
    covered = {i for s, e in spans[0] for i in range(s, e)}
    outside = [i for i in where if i not in covered]
    own = alone(item.context_images[0])
    assert len(outside) == own > 0
    assert outside == (where[-own:] if inline else where[:own])
    for k, (s, e) in enumerate(spans[0]):
        assert ids[s:e].count(image_id) == alone(item.images[req[2][k]])
