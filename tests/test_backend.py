"""The HF backend on tiny random-init models of every supported architecture (lad.testing.tiny).

Fast capture vs eager output_attentions, exact label scoring vs a brute-force full-sequence
reference, batch-size invariance, determinism, and the per-record errors.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from lad.backends import load_backend
from lad.backends.hf import Backend, evidence
from lad.core.labels import get_scheme
from lad.data.items import Item
from lad.testing.tiny import ARCHITECTURES, build_tiny_model
from tests.full_forward import extend_inputs

ARCHS = sorted(ARCHITECTURES)
DIGITS = get_scheme("digits")


def _images(folder: Path, n: int, seed: int) -> list[Path]:
    from PIL import Image

    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(n):
        h, w = 28 + 7 * (i % 3), 40 + 9 * ((i + seed) % 4)  # varied sizes: Qwen spans differ
        path = folder / f"img{seed}_{i}.png"
        Image.fromarray((rng.random((h, w, 3)) * 255).astype("uint8")).save(path)
        paths.append(path)
    return paths


@pytest.fixture(scope="module")
def images(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    return _images(tmp_path_factory.mktemp("images"), 12, seed=0)


@pytest.fixture(scope="module", params=ARCHS)
def backend(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Backend:
    path = build_tiny_model(request.param, tmp_path_factory.mktemp(request.param) / "model")
    return load_backend(str(path), device="cpu", dtype="float32")


def _items(images: list[Path], n: int) -> list[Item]:
    captions = ["red ball", "a blue circle and a much longer caption than the first", "star"]
    return [
        Item(f"q{k}", captions[k % 3], images[k : k + n] if k + n <= 12 else images[:n], k % n)
        for k in range(4)
    ]


def _requests(items: list[Item], seed: int = 1) -> list[tuple[Item, int, list[int]]]:
    rng = np.random.default_rng(seed)
    return [(it, t, rng.permutation(it.num_candidates).tolist()) for it in items for t in range(1)]


def test_fast_capture_equals_eager_single_and_padded_batch(
    backend: Backend, images: list[Path]
) -> None:
    reqs = _requests(_items(images, 4)[:2])
    lengths = set()
    for batch_size in (1, 2):
        fast = list(backend.records(reqs, scheme=DIGITS, batch_size=batch_size))
        eager = list(backend.records(reqs, scheme=DIGITS, batch_size=batch_size, capture="eager"))
        for f, e in zip(fast, eager, strict=True):
            assert len(f.attention) == backend.num_layers
            np.testing.assert_allclose(f.attention, e.attention, atol=1e-5, rtol=0)
            np.testing.assert_allclose(f.logprobs, e.logprobs, atol=1e-5, rtol=0)
            assert min(min(row) for row in f.attention) > 0 or backend.arch.name == "Gemma3"
            lengths.add(f.extra["prompt_tokens"])
    assert len(lengths) == 2  # the two prompts differ in length, so the batch was left padded


def _brute_force(backend: Backend, req: tuple[Item, int, list[int]], scheme) -> np.ndarray:
    """log P(c_k|x) by running prompt + label tokens (+ end of answer) in full, per label."""
    item = req[0]
    trie = backend.label_trie(scheme, item.num_candidates)
    texts, imgs = backend.build_prompts([req], "vanilla", scheme)
    inputs, _ = backend.encode([req], texts, imgs)
    t = inputs["input_ids"].shape[1]
    out = []
    for seq in trie.labels:
        steps = [*seq, trie.eos] if trie.valid(seq) else list(seq)
        extended = extend_inputs(inputs, steps)
        with torch.no_grad():
            logits = backend.model(**extended).logits[0, t - 1 :].double()
        total = 0.0
        for i, token in enumerate(steps):
            valid = trie.valid(seq[:i])
            if len(valid) > 1:
                total += float(logits[i, valid].log_softmax(-1)[valid.index(token)])
        out.append(total)
    return np.array(out)


# Multi-token labels (10..12, roman numerals: a deep trie) on every architecture; the single-token
# schemes on two, which is enough to cover the one-softmax path.
ALL_SCHEMES = [
    ("digits", 4),
    ("digits", 8),
    ("digits", 12),
    ("upper", 6),
    ("words", 5),
    ("roman", 12),
]
MULTI_TOKEN = [("digits", 12), ("roman", 12)]


def test_label_logprobs_equal_brute_force(backend: Backend, images: list[Path]) -> None:
    full = backend.arch.name in ("LLaVA-1.5", "Qwen2-VL")
    for scheme_name, n in ALL_SCHEMES if full else MULTI_TOKEN:
        scheme = get_scheme(scheme_name)
        req = _requests(_items(images, n)[:1])[0]
        record = next(backend.records([req], scheme=scheme))
        reference = _brute_force(backend, req, scheme)
        np.testing.assert_allclose(record.logprobs, reference, atol=1e-5, err_msg=scheme_name)
        assert np.exp(record.logprobs).sum() == pytest.approx(1.0, abs=1e-9)


def test_batch_size_invariance_and_determinism(backend: Backend, images: list[Path]) -> None:
    reqs = _requests(_items(images, 4))
    one = list(backend.records(reqs, scheme=DIGITS, batch_size=1))
    four = list(backend.records(reqs, scheme=DIGITS, batch_size=4))
    again = list(backend.records(reqs, scheme=DIGITS, batch_size=4))
    assert [r.item for r in four] == [it.id for it, _, _ in reqs]
    for a, b, c in zip(one, four, again, strict=True):
        assert (a.order, a.answer, a.extra) == (b.order, b.answer, b.extra)
        np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-5)
        np.testing.assert_allclose(a.attention, b.attention, atol=1e-5)
        assert (b.logprobs, b.attention) == (c.logprobs, c.attention)


def test_ride_along_label_tokens_leave_the_prompt_unchanged(
    backend: Backend, images: list[Path]
) -> None:
    # N = 12 digits: the "1" of "10".."12" is appended to the prompt's own forward.
    reqs = _requests(_items(images, 12)[:2])
    trie = backend.label_trie(DIGITS, 12)
    assert len(trie.paths) == 1
    fast = list(backend.records(reqs, scheme=DIGITS, batch_size=2))
    eager = list(backend.records(reqs, scheme=DIGITS, batch_size=2, capture="eager"))
    texts, imgs = backend.build_prompts(reqs, "vanilla", DIGITS)
    inputs, spans = backend.encode(reqs, texts, imgs)
    alone = backend.prefill(inputs, "fast", keep_cache=False)  # the prompt only
    for b, (f, e) in enumerate(zip(fast, eager, strict=True)):
        reference = evidence(alone.rows[b], spans[b]).numpy()
        np.testing.assert_allclose(f.attention, reference, atol=1e-5, rtol=0)
        np.testing.assert_allclose(e.attention, reference, atol=1e-5, rtol=0)
        np.testing.assert_allclose(f.logprobs, e.logprobs, atol=1e-5, rtol=0)
