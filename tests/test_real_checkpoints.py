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

import json
import os
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from lad.backends import load_backend
from lad.backends.hf import Backend
from lad.core.labels import get_scheme
from lad.core.prompts import render_prompt
from lad.data.items import Item
from lad.errors import BackendError
from tests.full_forward import extend_inputs

ENV = "LAD_REAL_CHECKPOINTS"
DIGITS = get_scheme("digits")
CAPTIONS = ("a red ball", "two dogs asleep on a sofa by the window", "a kite", "snow on a hill")


@dataclass(frozen=True)
class Pinned:
    """What a checkpoint's chat template and processor write, read off its published files by hand.

    prompt: the rendered prompt, with {images} (`image` once per image) and {text}.
    image: what the chat template writes for one image.
    expanded: what the processor turns that into, {run} standing for the image token repeated.
    span: the part of `expanded` that is the image's span (Eq. 6's R_k): image tokens and markers.
    image_token: the image token (the config's image_token_id).
    tokens: image tokens per picture at lad's defaults (None: as many as the processor gives
        the picture alone, which depends on its size).
    bos: whether the tokenizer puts a BOS before the prompt (False where the template writes it).
    lead: what the template writes between the generation prompt and the label.
    end: the token that ends the reply.
    max_n: the most candidates whose prompt fits the context.
    """

    prompt: str
    image: str
    expanded: str
    span: str
    image_token: str
    tokens: int | None
    bos: bool
    lead: str
    end: str
    max_n: int = 12


_IM = "<|im_start|>user\n{images}{text}<|im_end|>\n<|im_start|>assistant\n"  # ChatML
_QWEN_IMAGE = "<|vision_start|><|image_pad|><|vision_end|>"
_QWEN_SPAN = "<|vision_start|>{run}<|vision_end|>"
PINNED = {
    # The template writes "ASSISTANT: 1 " and no end token; the tokenizer's EOS ends the answer.
    # CLIP 336 px: 24 x 24 patches, one token each.
    "llava-1.5-7b-hf": Pinned(
        "USER: {images}{text} ASSISTANT:",
        "<image>\n",
        "{run}\n",
        "{run}",
        "<image>",
        576,
        True,
        " ",
        "</s>",
        max_n=4,
    ),
    # Merged 28 px patches: the count depends on the picture's size.
    "qwen2.5-vl-3b-instruct": Pinned(
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n" + _IM,
        _QWEN_IMAGE,
        _QWEN_SPAN,
        _QWEN_SPAN,
        "<|image_pad|>",
        None,
        False,
        "",
        "<|im_end|>",
    ),
    # One global 512 px tile (lad turns image splitting off): 64 tokens.
    "smolvlm-256m-instruct": Pinned(
        "<|im_start|>User:{images}{text}<end_of_utterance>\nAssistant:",
        "<image>",
        "<fake_token_around_image><global-img>{run}<fake_token_around_image>",
        "<fake_token_around_image><global-img>{run}<fake_token_around_image>",
        "<image>",
        64,
        False,
        " ",
        "<end_of_utterance>",
    ),
    # Several pictures in one prompt: each is its 384 px base view only (27 x 27 = 729 SigLIP
    # tokens) and one image-newline token, no anyres crops (transformers' batch_num_images).
    "llava-onevision-qwen2-7b-ov-hf": Pinned(
        _IM,
        "<image>\n",
        "{run}\n",
        "{run}",
        "<image>",
        729 + 1,
        False,
        "",
        "<|im_end|>",
    ),
    # Qwen3-VL: no default system prompt; 32 px per token, at least 65,536 pixels (64 tokens).
    "Qwen3-VL-4B-Instruct": Pinned(
        _IM, _QWEN_IMAGE, _QWEN_SPAN, _QWEN_SPAN, "<|image_pad|>", None, False, "", "<|im_end|>"
    ),
    # The generation prompt ends "<think>\n"; the template writes a reply as
    # "<think>\n\n</think>\n\n1": the model reads the empty think block, then the label.
    "Qwen3.5-0.8B": Pinned(
        _IM + "<think>\n\n</think>\n\n",
        _QWEN_IMAGE,
        _QWEN_SPAN,
        _QWEN_SPAN,
        "<|image_pad|>",
        None,
        False,
        "",
        "<|im_end|>",
    ),
    # One 448 px tile (lad turns crop_to_patches off): 256 tokens inside <img>...</img>.
    "InternVL3-1B-hf": Pinned(
        _IM,
        "<IMG_CONTEXT>\n",
        "<img>{run}</img>\n",
        "<img>{run}</img>",
        "<IMG_CONTEXT>",
        256,
        False,
        "",
        "<|im_end|>",
    ),
    # The template writes the BOS; the processor wraps each picture in blank lines.
    "gemma-3-4b-it": Pinned(
        "<bos><start_of_turn>user\n{images}{text}<end_of_turn>\n<start_of_turn>model\n",
        "<start_of_image>",
        "\n\n<start_of_image>{run}<end_of_image>\n\n",
        "<start_of_image>{run}<end_of_image>",
        "<image_soft_token>",
        256,
        False,
        "",
        "<end_of_turn>",
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
        if "linear_attention" in kinds:  # a hybrid: two softmax layers, neither at index 0 or 1
            text.num_hidden_layers = 4
            text.layer_types = ["linear_attention", "full_attention"] * 2
            text.linear_num_key_heads = text.linear_num_value_heads = 2
            text.linear_key_head_dim = text.linear_value_head_dim = 32
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
    if getattr(vision, "deepstack_visual_indexes", None):  # Qwen3-VL: both blocks feed DeepStack
        vision.deepstack_visual_indexes = [0, 1]
    return config


@dataclass
class Real:
    """A shrunk checkpoint loaded by lad, and the same weights loaded as transformers alone
    would (eager decoder attention, no lad capture function or mask registration): the
    reference."""

    name: str
    backend: Backend
    reference: Any
    pinned: Pinned | None
    max_n: int


@pytest.fixture(scope="session", params=_checkpoint_names())
def real(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Real:
    from transformers import AutoConfig

    name = request.param
    source = _source(name)
    if "auto_map" in json.loads((source / "config.json").read_text()):
        pytest.skip(
            f"{name}: remote code (config.json auto_map), run under the transformers its code "
            "needs by tests/test_remote_code.py (docs/backends.md, 'Remote code')"
        )
    out = tmp_path_factory.mktemp("real") / name
    return _load_both(name, _save_shrunk(source, _shrink(AutoConfig.from_pretrained(source)), out))


def _save_shrunk(source: Path, config: Any, out: Path) -> Path:
    """`config`'s model, random-initialised (seed 0), saved in `out` with the checkpoint's own
    tokenizer, chat template and processor files."""
    from transformers import AutoModelForImageTextToText

    torch.manual_seed(0)
    AutoModelForImageTextToText.from_config(config).save_pretrained(out)
    for path in source.iterdir():  # the checkpoint's own tokenizer, template, processor files
        if path.is_file() and path.name != "config.json" and path.suffix != ".safetensors":
            shutil.copy(path, out / path.name)
    return out


def _load_both(name: str, out: Path) -> Real:
    """The saved model loaded by lad, and by transformers alone (the reference)."""
    from transformers import AutoModelForImageTextToText

    backend = load_backend(str(out), device="cpu", dtype="float32")
    # The language decoder on transformers' eager attention and masks (lad's capture function and
    # mask registration play no part); the vision tower on stock SDPA, which is not what is checked.
    eager = {"text_config": "eager", "vision_config": "sdpa", "": "sdpa"}
    reference = AutoModelForImageTextToText.from_pretrained(
        out, dtype=torch.float32, attn_implementation=eager
    ).eval()
    pinned = PINNED.get(name)
    return Real(name, backend, reference, pinned, pinned.max_n if pinned else 12)


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


def _image_tokens(real: Real, picture: Any) -> int:
    """The picture's image-token count: pinned by hand, or the processor's for it alone."""
    if real.pinned.tokens is not None:
        return real.pinned.tokens
    backend = real.backend
    alone = backend.processor(
        text=[backend.processor.image_token], images=[[picture]], **backend.image_options
    )["input_ids"][0]
    return list(alone).count(backend.image_token)


def _expected_tokens(real: Real, text: str, counts: list[int]) -> tuple[list[int], list[tuple]]:
    """The prompt's token ids and image spans, from the pinned text through the real tokenizer.

    The prompt is written out in full by hand (every image token, marker and blank line); a span
    starts where the tokens of the text before it end (spans begin and end with added tokens,
    which the tokenizer never merges with their neighbours).
    """
    pinned, tok = real.pinned, real.backend.processor.tokenizer
    run = [pinned.image_token * c for c in counts]
    full = pinned.prompt.format(
        images="".join(pinned.expanded.format(run=r) for r in run), text=text
    )
    bos = [tok.bos_token_id] if pinned.bos else []
    ids = bos + tok(full, add_special_tokens=False)["input_ids"]
    spans, at = [], 0
    for r in run:
        span = pinned.span.format(run=r)
        at = full.index(span, at)
        start = len(bos) + len(tok(full[:at], add_special_tokens=False)["input_ids"])
        spans.append((start, start + len(tok(span, add_special_tokens=False)["input_ids"])))
        at += len(span)
    return ids, spans


@pytest.mark.parametrize("n", [4, 12])
def test_prompt_and_image_spans(real: Real, images: list[Path], n: int) -> None:
    if n > real.max_n:
        pytest.skip(f"{real.name}: {n} images exceed its context")
    backend = real.backend
    req = _request(images, n)
    texts, imgs = backend.build_prompts([req], "vanilla", DIGITS)
    text = render_prompt("vanilla", req[0].query, DIGITS, n)
    prompt = texts[0]
    placeholder = backend.processor.image_token
    at = [i for i in range(len(prompt)) if prompt.startswith(placeholder, i)]
    assert len(at) == n and max(at) < prompt.index(text)  # one per image, all before the text

    inputs, spans = backend.encode([req], texts, imgs)
    ids = inputs["input_ids"][0].tolist()
    assert len(spans) == 1 and len(spans[0]) == n
    image_id = backend.model.config.image_token_id
    # Spans are ordered, disjoint, each holds image tokens, and together hold all of them.
    assert all(a[1] <= b[0] for a, b in pairwise(spans[0]))
    assert all(image_id in ids[s:e] for s, e in spans[0])
    inside = {i for s, e in spans[0] for i in range(s, e)}
    assert {i for i, t in enumerate(ids) if t == image_id} <= inside
    if real.pinned is None:
        return
    # What a person reads off the checkpoint's template and processor, through its tokenizer.
    assert prompt == real.pinned.prompt.format(images=real.pinned.image * n, text=text)
    counts = [_image_tokens(real, picture) for picture in imgs[0]]
    expected_ids, expected_spans = _expected_tokens(real, text, counts)
    assert ids == expected_ids
    assert spans[0] == expected_spans


def test_gemma3_bos_once_and_blank_lines_outside_spans(real: Real, images: list[Path]) -> None:
    """Gemma3's template writes <bos> and the processor writes a blank line before and after each
    picture: one BOS, and the blank lines belong to no span (they merge with the text's own
    newlines into one token, e.g. "\n\n\n" after "user\n")."""
    if not real.name.startswith("gemma-3"):
        pytest.skip("Gemma3 only")
    backend, tok = real.backend, real.backend.processor.tokenizer
    req = _request(images, 2)
    inputs, spans = backend.encode([req], *backend.build_prompts([req], "vanilla", DIGITS))
    ids = inputs["input_ids"][0].tolist()
    assert ids[0] == tok.bos_token_id and ids.count(tok.bos_token_id) == 1
    names = tok.convert_ids_to_tokens(ids)
    (s1, e1), (s2, e2) = spans[0]
    assert names[s1] == names[s2] == "<start_of_image>"
    assert names[e1 - 1] == names[e2 - 1] == "<end_of_image>"
    assert names[s1 - 1] == "\n\n\n" and names[e1:s2] == ["\n\n\n\n"]  # outside the spans


def test_internvl_tiles_and_markers_inside_each_span(real: Real, tmp_path: Path) -> None:
    """With tiling on, an InternVL picture is a thumbnail plus up to 12 tiles of 256 tokens each,
    all inside <img>...</img>; a 640 x 480 picture tiles 4 x 3 (the grid of aspect 4:3 within 12
    tiles), so 13 x 256 tokens, and nothing but its own tokens is in its span."""
    if not real.name.startswith("InternVL"):
        pytest.skip("InternVL only")
    from PIL import Image

    pictures = []
    for k, size in enumerate([(640, 480), (100, 100)]):
        pictures.append(tmp_path / f"{k}.png")
        Image.new("RGB", size, (40 * k, 90, 200)).save(pictures[-1])
    backend = real.backend
    saved = backend.image_options
    backend.image_options = {**saved, "crop_to_patches": True}
    try:
        req = (Item("tiles", "a red ball", pictures, 0), 0, [0, 1])
        texts, imgs = backend.build_prompts([req], "vanilla", DIGITS)
        inputs, spans = backend.encode([req], texts, imgs)
    finally:
        backend.image_options = saved
    ids = inputs["input_ids"][0].tolist()
    text = render_prompt("vanilla", "a red ball", DIGITS, 2)
    expected_ids, expected_spans = _expected_tokens(real, text, [13 * 256, 1 * 256])
    assert ids == expected_ids and spans[0] == expected_spans
    names = real.backend.processor.tokenizer.convert_ids_to_tokens(ids)
    for s, e in spans[0]:
        assert names[s] == "<img>" and names[e - 1] == "</img>"
        assert set(names[s + 1 : e - 1]) == {"<IMG_CONTEXT>"}


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
    if tok(prompt + lead, add_special_tokens=False)["input_ids"][: len(head)] != head:
        # The turn's text merges into the generation prompt's last token (Qwen3.5's "<think>\n"
        # and "\n</think>\n\n"): the model reads the turn as it is written, up to the label.
        prompt, lead = before, ""
        head = tok(prompt, add_special_tokens=False)["input_ids"]
    seqs = []
    for label in labels:
        assert turn(label) == before + label + after  # the label is written verbatim
        ids = tok(prompt + lead + label, add_special_tokens=False)["input_ids"]
        full = tok(prompt + lead + label + after, add_special_tokens=False)["input_ids"]
        assert ids[: len(head)] == head and full[: len(ids)] == ids
        seqs.append([*ids[len(head) :], end])
    return prompt, lead, seqs


def _teacher_forced(model: Any, inputs: dict[str, Any], seq: list[int]) -> list[torch.Tensor]:
    """Next-token logits after the prompt and each `seq[:i]`, i < len(seq): one full forward of
    the prompt and `seq[:-1]`, no cache (the causal mask makes each position its own prefix's)."""
    out = model(**extend_inputs(inputs, seq[:-1]), use_cache=False, logits_to_keep=len(seq))
    return list(out.logits[0])


@torch.no_grad()
def _brute_force(
    real: Real,
    req: tuple[Item, int, list[int]],
    scheme_name: str,
    n: int,
    next_logits: Callable[[Any, dict[str, Any], list[int]], torch.Tensor] | None = None,
):
    """log P(c_k|x): a softmax over the valid next tokens at every branching prefix of the
    template-rendered replies, each prefix's logits from `next_logits` on the reference model
    (transformers' own eager attention and masks; by default one full forward without a cache per
    reply, read at every prefix of it)."""
    from PIL import Image

    item, _, order = req
    scheme = get_scheme(scheme_name)
    labels = scheme.labels(n)
    text = render_prompt("vanilla", item.query, scheme, n)
    backend = real.backend
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
            if prefix not in logits and next_logits is None:
                for j, row in enumerate(_teacher_forced(real.reference, inputs, seq)):
                    logits.setdefault(tuple(seq[:j]), row.double())
            elif prefix not in logits:
                logits[prefix] = next_logits(real.reference, inputs, list(prefix)).double()
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
        reference, lead, seqs = _brute_force(real, req, scheme_name, n)
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
    window = _sliding_window(real)
    assert window is None or min(r.extra["prompt_tokens"] for r in one) > window
    for a, b in zip(one, four, strict=True):
        assert (a.item, a.order, a.extra) == (b.item, b.order, b.extra)
        np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-5, rtol=0)
        np.testing.assert_allclose(a.attention, b.attention, atol=1e-5, rtol=0)


def _sliding_window(real: Real) -> int | None:
    """The window of the decoder's sliding-window layers, None if it has none."""
    text = real.backend.model.config.get_text_config()
    kinds = getattr(text, "layer_types", None) or []
    return text.sliding_window if any("sliding" in k for k in kinds) else None


def test_sliding_window_label_logprobs_equal_reference_at_every_n(
    real: Real, images: list[Path]
) -> None:
    """Past the sliding window (Gemma3: 1,024 tokens; 12 pictures are ~3,100), the labels' steps
    on lad's KV cache and its masks give the probabilities of the reference's full forwards, at
    every N. (Left-padded batches past the window: test_batch_of_four_equals_one_at_a_time, whose
    4-picture prompts are past it too.)"""
    window = _sliding_window(real)
    if window is None:
        pytest.skip(f"{real.name}: no sliding-window layers")
    lengths = []
    for n in range(2, real.max_n + 1):
        req = _request(images, n, k=2)
        (record,) = real.backend.records([req], scheme=DIGITS)
        reference, _, _ = _brute_force(real, req, "digits", n)
        np.testing.assert_allclose(record.logprobs, reference, atol=1e-5, rtol=0)
        lengths.append(record.extra["prompt_tokens"])
    assert lengths[-1] > window  # so the window was exercised


# ----------------------------------------------------------------- Gemma3, last layer sliding

GEMMA3 = "gemma-3-4b-it"


@pytest.fixture(scope="module")
def sliding_tail(tmp_path_factory: pytest.TempPathFactory) -> Real:
    """gemma-3-4b-it shrunk to the first two of its real layer_types, both sliding_attention (the
    real model's last four layers slide), its real 1,024-token window kept: hidden 64, 4 heads of
    16, 2 KV heads, a one-layer vision tower. (The `real` fixture keeps one layer of each kind, so
    its last layer attends to every key.)"""
    from transformers import AutoConfig

    source = _source(GEMMA3)
    config = AutoConfig.from_pretrained(source)
    text, vision = config.text_config, config.vision_config
    assert text.layer_types[-4:] == ["sliding_attention"] * 4
    text.num_hidden_layers, text.layer_types = 2, text.layer_types[:2]
    text.hidden_size, text.intermediate_size = 64, 128
    text.num_attention_heads, text.head_dim, text.num_key_value_heads = 4, 16, 2
    vision.num_hidden_layers, vision.num_attention_heads = 1, 2
    vision.hidden_size, vision.intermediate_size = 32, 64
    out = tmp_path_factory.mktemp("sliding-tail") / GEMMA3
    return _load_both(GEMMA3, _save_shrunk(source, config, out))


def test_last_layer_sliding_label_logprobs_equal_reference_at_every_n(
    sliding_tail: Real, images: list[Path]
) -> None:
    """Every layer slides, the last one too: at every N from 2 (inside the window) to 12 (past
    it) lad's label log-probabilities equal the plain transformers model's no-cache full
    forwards (its own eager attention and masks; lad's model object and capture play no part)."""
    real = sliding_tail
    text = real.reference.config.get_text_config()
    assert text.layer_types == ["sliding_attention"] * 2 and text.sliding_window == 1024
    assert text._attn_implementation == "eager"
    lengths = []
    for n in range(2, 13):
        req = _request(images, n, k=2)
        (record,) = real.backend.records([req], scheme=DIGITS)
        reference, _, _ = _brute_force(real, req, "digits", n)
        gap = np.abs(np.exp(record.logprobs) - np.exp(reference)).max()
        print(f"N={n}, {record.extra['prompt_tokens']} tokens: max |P lad - P reference| {gap:.1e}")
        np.testing.assert_allclose(record.logprobs, reference, atol=1e-5, rtol=0)
        assert np.abs(reference - np.log(1 / n)).max() > 1e-3  # a wrong window would show
        lengths.append(record.extra["prompt_tokens"])
    assert lengths[0] < text.sliding_window < lengths[-1]


def _generated_logits(model: Any, inputs: dict[str, Any], prefix: list[int]) -> torch.Tensor:
    """The logits (V,) the model's own `generate` computes after `prefix`, which it is made to
    write token by token on its own cache (greedy, no other logits processor)."""
    start, vocab = inputs["input_ids"].shape[-1], model.config.get_text_config().vocab_size

    def allowed(_row: int, ids: torch.Tensor) -> list[int]:
        step = ids.shape[-1] - start
        return [prefix[step]] if step < len(prefix) else list(range(vocab))

    out = model.generate(
        **inputs,
        max_new_tokens=len(prefix) + 1,
        do_sample=False,
        top_k=None,
        top_p=None,
        prefix_allowed_tokens_fn=allowed,
        output_logits=True,
        return_dict_in_generate=True,
    )
    kept = [layer.keys.shape[-2] for layer in out.cache.layers]
    window = model.config.get_text_config().sliding_window
    assert all(layer.is_sliding for layer in out.cache.layers)
    assert start > window and max(kept) < window  # its cache slid: the prompt's start is gone
    return out.logits[len(prefix)][0]


def test_last_layer_sliding_label_logprobs_equal_the_models_generate(
    sliding_tail: Real, images: list[Path]
) -> None:
    """What the model answers: the first label steps' logits of its own `generate`, on its
    sliding-window cache, past the window (N = 12: the labels' second token is a decoding step).
    lad's label log-probabilities equal them (and, by the test above on the same request, so do
    transformers' no-cache full forwards: its cached and uncached paths agree)."""
    req = _request(images, 12, k=2)
    (record,) = sliding_tail.backend.records([req], scheme=DIGITS)
    generated, _, seqs = _brute_force(sliding_tail, req, "digits", 12, _generated_logits)
    assert any(len(s) > 2 for s in seqs)  # "10".."12": a step after the first label token
    gap = np.abs(np.exp(record.logprobs) - np.exp(generated)).max()
    print(f"N=12: max |P lad - P generate| {gap:.1e}")
    np.testing.assert_allclose(record.logprobs, generated, atol=1e-5, rtol=0)


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

    def count(pictures: list[Any]) -> int:
        text = backend.processor.image_token * len(pictures)
        out = backend.processor(text=[text], images=[pictures], **backend.image_options)
        return list(out["input_ids"][0]).count(image_id)

    def own(k: int) -> int:
        """Picture k's image tokens in this company (LLaVA-OneVision gives a picture fewer
        tokens among several than alone): all four pictures' less the other three's."""
        return count(imgs[0]) - count([p for j, p in enumerate(imgs[0]) if j != k])

    where = [i for i, t in enumerate(ids) if t == image_id]
    covered = {i for s, e in spans[0] for i in range(s, e)}
    outside = [i for i in where if i not in covered]
    context = 3 if inline else 0  # where the context picture is among the four shown
    assert len(outside) == own(context) > 0
    assert outside == (where[-own(context) :] if inline else where[: own(context)])
    shown = [k for k in range(4) if k != context]
    for (s, e), k in zip(spans[0], shown, strict=True):
        assert ids[s:e].count(image_id) == own(k)


# ------------------------------------------------------- left-padded batches against references


# Checkpoints whose left-padded batch is also checked at N = 12 (the others' 12-picture prompts,
# up to 8,828 tokens, are checked one at a time above; a batch of two there costs minutes).
BATCHED_AT_12 = ("Qwen3-VL-4B-Instruct", "Qwen3.5-0.8B")


@pytest.mark.parametrize("n", [2, 4, 12])
@torch.no_grad()
def test_left_padded_batch_equals_references(real: Real, images: list[Path], n: int) -> None:
    """Two prompts of different lengths in one left-padded batch: each one's label
    log-probabilities equal the brute-force reference, and each layer's span attention equals
    the reference model's eager `output_attentions` on the prompt alone (the last prompt token's
    row, head-averaged), summed over the spans written out by hand, to 1e-5. A hybrid model's
    rows are its softmax-attention layers, in order, and its records name them."""
    from PIL import Image

    if real.pinned is None or n > real.max_n:
        pytest.skip(f"{real.name}: not pinned, or N = {n} exceeds its context")
    if n == 12 and real.name not in BATCHED_AT_12:
        pytest.skip(f"{real.name}: N = 12 one prompt at a time in the tests above (CI time)")
    backend = real.backend
    reqs = [_request(images, n, k) for k in (1, 2)]
    records = list(backend.records(reqs, scheme=DIGITS, batch_size=2))
    assert records[0].extra["prompt_tokens"] != records[1].extra["prompt_tokens"]  # padded
    text_config = real.reference.config.get_text_config()
    kinds = getattr(text_config, "layer_types", None) or []
    softmax = [i for i, kind in enumerate(kinds) if kind != "linear_attention"]
    for req, record in zip(reqs, records, strict=True):
        reference, _, _ = _brute_force(real, req, "digits", n)
        np.testing.assert_allclose(record.logprobs, reference, atol=1e-5, rtol=0)

        item, _, order = req
        text = render_prompt("vanilla", item.query, DIGITS, n)
        prompt, _, _ = _replies(backend.processor, text, n, DIGITS.labels(n))
        pictures = [Image.open(item.images[i]).convert("RGB") for i in order]
        bos = backend.processor.tokenizer.bos_token
        inputs = backend.processor(
            text=[prompt],
            images=[pictures],
            return_tensors="pt",
            add_special_tokens=not (bos and prompt.startswith(bos)),
            **backend.image_options,
        )
        counts = [_image_tokens(real, picture) for picture in pictures]
        ids, spans = _expected_tokens(real, text, counts)
        assert inputs["input_ids"][0].tolist() == ids
        out = real.reference(**inputs, output_attentions=True, use_cache=False, logits_to_keep=1)
        rows = [a[0, :, -1].double().mean(0) for a in out.attentions]  # per softmax layer
        expected = [[float(row[s:e].sum()) for s, e in spans] for row in rows]
        assert len(rows) == backend.num_layers
        np.testing.assert_allclose(record.attention, expected, atol=1e-5, rtol=0)
        if len(softmax) < len(kinds):  # a hybrid
            assert len(rows) == len(softmax) == len(record.attention)
            assert record.extra["attention_layers"] == softmax == backend.attention_layers
        else:
            assert "attention_layers" not in record.extra


def test_qwen3_picture_costs(real: Real) -> None:
    """Qwen3-VL / Qwen3.5 at lad's defaults: 32 px per token, a picture upscaled to the model's
    65,536-pixel minimum (64 tokens) and kept within 256 tokens (docs/backends.md's table)."""
    from PIL import Image

    if real.backend.arch.name not in ("Qwen3-VL", "Qwen3.5"):
        pytest.skip("Qwen3-VL / Qwen3.5 only")
    processor = real.backend.processor
    for size, tokens in (((32, 32), 64), ((224, 224), 64), ((336, 336), 100), ((640, 480), 234)):
        out = processor(
            text=[processor.image_token],
            images=[[Image.new("RGB", size)]],
            **real.backend.image_options,
        )
        assert list(out["input_ids"][0]).count(real.backend.image_token) == tokens, size
    big = processor(
        text=[processor.image_token],
        images=[[Image.new("RGB", (4000, 3000))]],
        **real.backend.image_options,
    )
    assert list(big["input_ids"][0]).count(real.backend.image_token) <= 256
