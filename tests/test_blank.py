"""The `blank` method (CapCal): its scores' invariants (hypothesis), the blank prompt really blanks
(grey pictures of each candidate's size, empty texts; records of the blank prompt against records
of items blanked by hand), and `lad eval --methods blank` end to end on tiny models."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays
from PIL import Image

from lad.backends import load_backend
from lad.cli import main
from lad.core.blank import blank_alpha, blank_scores
from lad.core.calibrate import log_softmax
from lad.core.items import Item
from lad.core.labels import get_scheme
from lad.core.methods import METHODS, MethodOptions, score
from lad.core.predictions import read_predictions
from lad.core.records import RecordSet, read_records
from lad.data.blank import GREY, blank_requests
from lad.data.items import write_items
from lad.data.orders import shuffled_requests
from lad.data.shapes import build_shapes, shapes_vocabulary
from lad.errors import LadError, RecordError
from lad.evaluate import evaluate
from lad.testing.text import build_tiny_text_model
from lad.testing.tiny import build_tiny_model
from tests.runfiles import small_config

N = 3


def _set(logits: np.ndarray, orders: np.ndarray | None = None) -> RecordSet:
    r, n = logits.shape
    order = np.tile(np.arange(n), (r, 1)) if orders is None else orders
    return RecordSet(
        items=np.array([f"i{k}" for k in range(r)]),
        ordering=np.zeros(r, dtype=np.int64),
        order=order,
        answer=np.zeros(r, dtype=np.int64),
        logprobs=log_softmax(logits, axis=1),
        attention=np.ones((r, 1, n)),
        extra=[{} for _ in range(r)],
    )


logits = st.integers(2, 6).flatmap(
    lambda n: arrays(np.float64, (5, n), elements=st.floats(-20, 20))
)
alphas = st.one_of(st.floats(0, 4), st.just("entropy"))


@settings(max_examples=60, deadline=None)
@given(logits, logits, alphas)
def test_scores_keep_the_probability_mass(x, b, alpha):
    """Σ_j (P_blank − 1/N) = 0, so every row of S sums to 1 whatever α."""
    if x.shape != b.shape:
        b = np.resize(b, x.shape)
    s = blank_scores(_set(x), _set(b), alpha)
    assert np.allclose(s.sum(axis=1), 1.0)


@settings(max_examples=60, deadline=None)
@given(logits, alphas)
def test_a_uniform_blank_prompt_changes_nothing(x, alpha):
    uniform = _set(np.zeros_like(x))
    assert np.allclose(blank_scores(_set(x), uniform, alpha), np.exp(_set(x).logprobs))


@settings(max_examples=60, deadline=None)
@given(logits, logits, alphas, st.randoms(use_true_random=False))
def test_scores_move_with_the_candidates(x, b, alpha, rnd):
    """Showing the candidates in another order (in both prompts) permutes S the same way."""
    b = np.resize(b, x.shape)
    perm = list(range(x.shape[1]))
    rnd.shuffle(perm)
    s = blank_scores(_set(x), _set(b), alpha)
    moved = blank_scores(_set(x[:, perm]), _set(b[:, perm]), alpha)
    assert np.allclose(moved, s[:, perm])


@settings(max_examples=60, deadline=None)
@given(logits)
def test_entropy_alpha_is_the_normalised_entropy(x):
    rec = _set(x)
    p = np.exp(rec.logprobs)
    h = -(p * np.log(np.where(p > 0, p, 1.0))).sum(axis=1) / math.log(x.shape[1])
    got = blank_alpha(rec, "entropy")[:, 0]
    assert np.allclose(got, np.clip(h, 0, 1)) and ((got >= 0) & (got <= 1)).all()


def test_alpha_one_against_its_own_prompt_is_uniform():
    """A blank prompt that is the prompt itself: with α = 1 every candidate scores 1/N."""
    rec = _set(np.array([[3.0, 0.0, -1.0], [0.0, 5.0, 1.0]]))
    assert np.allclose(blank_scores(rec, rec, 1.0), 1 / 3)


def test_hand_computed_example():
    x = _set(np.log(np.array([[0.6, 0.3, 0.1]])))
    b = _set(np.log(np.array([[0.7, 0.2, 0.1]])))
    s = score("blank", x, None, MethodOptions(blank_alpha=0.5), b)
    assert np.allclose(s, [[0.6 - 0.5 * (0.7 - 1 / 3), 0.3 - 0.5 * (0.2 - 1 / 3),
                            0.1 - 0.5 * (0.1 - 1 / 3)]])  # fmt: skip
    assert METHODS["blank"].forward_passes(3) == 2


def test_refusals_name_what_is_missing():
    x = _set(np.zeros((2, 3)))
    with pytest.raises(LadError, match=r"blank_records\.jsonl"):
        score("blank", x)
    other = _set(np.zeros((2, 3)))
    other.items = np.array(["i0", "zz"])
    with pytest.raises(RecordError, match="lack item 'i1'"):
        score("blank", x, None, MethodOptions(), other)
    with pytest.raises(LadError, match="blank_alpha"):
        MethodOptions(blank_alpha=-1)


# ------------------------------------------------------------------- the blank prompt


def _picture(path: Path, size: tuple[int, int], colour: tuple[int, int, int]) -> Path:
    Image.new("RGB", size, colour).save(path)
    return path


def test_blank_requests_grey_every_candidate_and_keep_the_rest(tmp_path):
    sizes = [(20, 12), (9, 30), (20, 12)]
    pics = [_picture(tmp_path / f"c{k}.png", s, (200, 10 * k, 5)) for k, s in enumerate(sizes)]
    context = _picture(tmp_path / "ref.png", (8, 8), (1, 2, 3))
    item = Item("q", "a caption", pics, 1, question="Which? <image>", context_images=[context])
    texts = Item("t", "Which word?", [], 0, candidates=["apple", "stone", "river"])
    requests = [(item, 0, [2, 0, 1]), (item, 1, [0, 1, 2]), (texts, 0, [1, 2, 0])]
    blanked = blank_requests(requests, tmp_path / "blank")
    assert [(r.item.id, r.ordering, r.order) for r in blanked] == [
        (it.id, o, order) for it, o, order in requests
    ]
    shown = blanked[0].item
    assert shown.question == item.question and shown.context_images == [context]
    assert shown.answer == item.answer and shown.query == item.query
    for path, size in zip(shown.images, sizes, strict=True):
        with Image.open(path) as im:
            assert im.size == size and im.mode == "RGB"
            assert (np.asarray(im) == np.array(GREY, dtype=np.uint8)).all()
    assert len(set(shown.images)) == 2  # one file per size
    assert blanked[2].item.candidates == ["", "", ""]
    assert item.images == pics and texts.candidates == ["apple", "stone", "river"]  # untouched


@pytest.fixture(scope="module")
def shapes(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("blank-shapes")
    kw = {"num_candidates": N, "setting": "random", "seed": 5, "image_size": 32}
    return (
        build_shapes(root / "eval", items=3, split="eval", **kw),
        build_shapes(root / "cal", items=2, split="calibration", **kw),
    )


@pytest.fixture(scope="module")
def qwen(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("qwen2_vl") / "model"
    return str(build_tiny_model("qwen2_vl", path, words=shapes_vocabulary()))


def test_lad_eval_blank_records_are_records_of_grey_items(qwen, shapes, tmp_path, monkeypatch):
    """blank_records.jsonl holds, for each evaluated (item, ordering), the record of the same
    prompt with every candidate a grey picture of its size, made here by hand; the blank prompt
    does not depend on the ordering (the candidates are alike), so neither do its records."""
    run = tmp_path / "run"
    config = small_config(qwen, shapes, num_candidates=N, dtype="float32", batch_size=1,
                          methods=("vanilla", "blank"))  # fmt: skip
    result = evaluate(config, run)
    assert result.metrics["methods"]["blank"]["forward_passes_per_item"] == 2
    made = read_records(run / "blank_records.jsonl")
    vanilla = read_records(run / "records.jsonl")
    assert made.keys() == vanilla.keys() and np.array_equal(made.order, vanilla.order)
    assert not np.allclose(made.logprobs, vanilla.logprobs)

    from lad.data.items import read_items

    items = {it.id: it for it in read_items(shapes[0], N)}
    by_hand = []
    for it in items.values():
        greys = []
        for k, path in enumerate(it.images):
            with Image.open(path) as im:
                size = im.size
            grey = np.full((size[1], size[0], 3), 128, dtype=np.uint8)
            greys.append(tmp_path / f"{it.id}-{k}.png")
            Image.fromarray(grey).save(greys[-1])
        by_hand.append(Item(it.id, it.query, greys, it.answer, question=it.question))
    backend = load_backend(qwen, device="cpu", dtype="float32", quiet=True)
    requests = shuffled_requests(by_hand, config.num_shuffles, config.seed)
    expected = RecordSet.from_records(
        list(backend.records(requests, scheme=get_scheme("digits"), batch_size=1))
    )
    key = {
        (r, o): k for k, (r, o) in enumerate(zip(expected.items, expected.ordering, strict=True))
    }
    rows = [key[(r, o)] for r, o in zip(made.items, made.ordering, strict=True)]
    assert np.allclose(made.logprobs, expected.logprobs[rows], atol=1e-6)
    for item in items:
        mine = made.logprobs[made.items == item]
        assert np.allclose(mine, mine[0], atol=1e-6)  # the same prompt under every ordering

    # lad score on the stored files gives the run's own blank choices, and refuses without them
    out = tmp_path / "blank.jsonl"
    args = ["score", "--records", str(run / "records.jsonl"), "--methods", "blank"]
    blank = ["--blank-records", str(run / "blank_records.jsonl")]
    assert main([*args, *blank, "--out", str(out)]) == 0
    mine = {(p.item, p.ordering): p.prediction for p in read_predictions(out)}
    ran = read_predictions(run / "predictions.jsonl")
    assert mine == {(p.item, p.ordering): p.prediction for p in ran if p.method == "blank"}
    assert main([*args, "--out", str(tmp_path / "none.jsonl")]) == 1

    # a rescoring reads the blank records back: no model, no picture decoded or written
    import shutil

    shutil.rmtree(run / "blank")

    def refuse(*args, **kwargs):
        raise AssertionError("a rescoring must not load the model")

    monkeypatch.setattr("lad.backends.load_backend", refuse)
    monkeypatch.setattr("lad.data.blank.open_image", refuse)
    again = evaluate(config.replace(blank_alpha="entropy"), run)
    assert again.metrics["methods"]["blank"]["acc"] >= 0 and not (run / "blank").exists()


WORDS = ["apple", "stone", "river", "cloud", "tiger", "piano", "bread", "lamp"]


def test_lad_eval_blank_on_text_options(tmp_path):
    model = str(build_tiny_text_model("llama", tmp_path / "llama", words=WORDS))

    def items(start: int, count: int) -> list[Item]:
        return [
            Item(f"q{i}", f"Which word names a {WORDS[i % 8]}?", [], i % N,
                 candidates=[WORDS[(i + k) % 8] for k in range(N)])
            for i in range(start, start + count)
        ]  # fmt: skip

    write_items(tmp_path / "mcq.jsonl", items(0, 3))
    write_items(tmp_path / "cal.jsonl", items(10, 2))
    bench = (tmp_path / "mcq.jsonl", tmp_path / "cal.jsonl")
    config = small_config(model, bench, num_candidates=N, dtype="float32",
                          methods=("vanilla", "pride", "blank"), blank_alpha="entropy")  # fmt: skip
    result = evaluate(config, tmp_path / "run")
    assert set(result.metrics["methods"]) == {"vanilla", "pride", "blank"}
    made = read_records(tmp_path / "run" / "blank_records.jsonl")
    assert np.allclose(made.attention, 0.0)  # an empty option has no token: Eq. 6 sums nothing
    for item in set(made.items.tolist()):
        mine = made.logprobs[made.items == item]
        assert np.allclose(mine, mine[0], atol=1e-6)
