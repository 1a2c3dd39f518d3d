"""Context pictures (an item's `context_images`): pictures that belong to the question, shown in
the prompt and the forward pass but never in a candidate span.

Checked on lad's tiny models of every architecture: a context picture's tokens lie in no span;
permuting the candidates leaves the context pictures where they were; and an item without context
pictures gives the records it gave before context pictures existed (tests/data/
records_without_context.json, written by `python -m tests.test_context_images` from main at
e54eb37, the commit before them).
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest

from lad.backends import load_backend
from lad.backends.hf import Backend
from lad.core.labels import get_scheme
from lad.data.items import Item, read_items, write_items
from lad.errors import BackendError, DataError
from lad.testing.tiny import ARCHITECTURES, build_tiny_model

ARCHS = sorted(ARCHITECTURES)
DIGITS = get_scheme("digits")
REFERENCE = Path(__file__).parent / "data" / "records_without_context.json"
ORDERS = ([0, 1, 2], [2, 0, 1])


def _images(folder: Path, n: int, seed: int) -> list[Path]:
    from PIL import Image

    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(n):
        h, w = 28 + 7 * (i % 3), 40 + 9 * ((i + seed) % 4)
        path = folder / f"img{seed}_{i}.png"
        Image.fromarray((rng.random((h, w, 3)) * 255).astype("uint8")).save(path)
        paths.append(path)
    return paths


def _plain_items(images: list[Path]) -> list[Item]:
    """Items without context pictures: one caption, one question."""
    return [
        Item("cap", "a red ball", images[:3], 1),
        Item("ask", "Which one is darker?", images[3:6], 2, question="Which one is darker?"),
    ]


def _plain_records(folder: Path) -> dict[str, dict]:
    """arch -> the records and prompt texts of _plain_items under ORDERS (batch of 2)."""
    images = _images(folder / "images", 6, seed=3)
    out = {}
    for arch in ARCHS:
        backend = load_backend(str(build_tiny_model(arch, folder / arch)), device="cpu")
        reqs = [(it, k, list(o)) for it in _plain_items(images) for k, o in enumerate(ORDERS)]
        # Caption and question items are asked with different templates: one run each.
        recs, prompts = [], []
        for part in (reqs[:2], reqs[2:]):
            recs += backend.records(part, scheme=DIGITS, batch_size=2)
            prompts += backend.build_prompts(part, "vanilla", DIGITS)[0]
        out[arch] = {"records": [dataclasses.asdict(r) for r in recs], "prompts": prompts}
    return out


@pytest.fixture(scope="module")
def pictures(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    return _images(tmp_path_factory.mktemp("pictures"), 6, seed=3)


@pytest.fixture(scope="module")
def reference() -> dict[str, dict]:
    return json.loads(REFERENCE.read_text())


@pytest.fixture(scope="module", params=ARCHS)
def arch(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture(scope="module")
def backend(arch: str, tmp_path_factory: pytest.TempPathFactory) -> Backend:
    path = build_tiny_model(arch, tmp_path_factory.mktemp(arch) / "model")
    return load_backend(str(path), device="cpu")


def test_records_without_context_pictures_are_unchanged(arch, backend, pictures, reference):
    if arch not in reference:
        pytest.skip(f"{arch} came after e54eb37: there are no records from before context pictures")
    want = reference[arch]
    reqs = [(it, k, list(o)) for it in _plain_items(pictures) for k, o in enumerate(ORDERS)]
    recs, prompts = [], []
    for part in (reqs[:2], reqs[2:]):
        recs += backend.records(part, scheme=DIGITS, batch_size=2)
        prompts += backend.build_prompts(part, "vanilla", DIGITS)[0]
    assert prompts == want["prompts"]
    for got, old in zip(recs, want["records"], strict=True):
        for key in ("item", "ordering", "order", "answer", "extra"):
            assert getattr(got, key) == old[key]
        np.testing.assert_allclose(got.logprobs, old["logprobs"], rtol=0, atol=1e-6)
        np.testing.assert_allclose(got.attention, old["attention"], rtol=0, atol=1e-6)


def _image_token(backend: Backend) -> int:
    config = backend.model.config
    token = getattr(config, "image_token_id", None)
    return getattr(config, "image_token_index", None) if token is None else token


def _runs(ids: list[int], token: int) -> list[tuple[int, int]]:
    """Maximal runs [start, end) of `token` in `ids`: one per picture in these tiny models."""
    runs: list[tuple[int, int]] = []
    for t, i in enumerate(ids):
        if i != token:
            continue
        if runs and runs[-1][1] == t:
            runs[-1] = (runs[-1][0], t + 1)
        else:
            runs.append((t, t + 1))
    return runs


def _context_items(pictures: list[Path]) -> list[Item]:
    before = Item("before", "x", pictures[:3], 0, question="Which one shows the same place?")
    before.context_images = [pictures[5]]
    inline = Item("inline", "x", pictures[1:4], 2, question="Like <image>, which one is blue?")
    inline.context_images = [pictures[4]]
    return [before, inline]


@pytest.mark.parametrize("order", [[0, 1, 2], [2, 0, 1]])
def test_context_picture_tokens_are_in_no_span(arch, backend, pictures, order):
    """The runs of image tokens, in prompt order, are hand-placed: `before` shows its context
    picture first, `inline` after its three candidates (at the question's <image>)."""
    if arch == "llava_onevision":
        pytest.skip("its tiny template writes pictures back to back: one run of image tokens")
    items = _context_items(pictures)
    for item, context_run in zip(items, (0, 3), strict=True):
        req = [(item, 0, order)]
        texts, images = backend.build_prompts(req, "vanilla", DIGITS)
        inputs, spans = backend.encode(req, texts, images)
        runs = _runs(inputs["input_ids"][0].tolist(), _image_token(backend))
        assert len(runs) == 4 and len(spans[0]) == 3
        candidate_runs = [r for k, r in enumerate(runs) if k != context_run]
        c0, c1 = runs[context_run]
        for (s, e), (r0, r1) in zip(spans[0], candidate_runs, strict=True):
            assert s <= r0 and r1 <= e  # the candidate's own picture
            assert e <= c0 or s >= c1  # and nothing of the context picture


def test_permuting_candidates_leaves_context_pictures_in_place(backend, pictures):
    """The pictures given to the processor, in prompt order, under two orderings."""
    from PIL import Image

    def pixels(path: Path) -> bytes:
        return backend.picture(path).tobytes()

    for item, slot in zip(_context_items(pictures), (0, 3), strict=True):
        for order in ([0, 1, 2], [1, 2, 0], [2, 1, 0]):
            shown = backend.build_prompts([(item, 0, order)], "vanilla", DIGITS)[1][0]
            assert all(isinstance(p, Image.Image) for p in shown)
            assert shown[slot].tobytes() == pixels(item.context_images[0])
            rest = [p.tobytes() for k, p in enumerate(shown) if k != slot]
            assert rest == [pixels(item.images[i]) for i in order]
        recs = list(backend.records([(item, 0, [0, 1, 2]), (item, 1, [2, 0, 1])], scheme=DIGITS))
        assert [r.answer for r in recs] == [item.answer, [2, 0, 1].index(item.answer)]
        assert all(len(r.logprobs) == 3 and len(r.attention[0]) == 3 for r in recs)


def test_a_template_that_moves_pictures_is_refused_for_inline_context(pictures, tmp_path):
    """LLaVA-1.5's published template writes every image before any text; with a context picture
    at the question's <image> it would land among the candidates, so lad refuses."""
    images_first = (
        "{% for message in messages %}{% if message['role'] == 'user' %}USER: "
        "{% for c in message['content'] | selectattr('type', 'equalto', 'image') %}<image>\n"
        "{% endfor %}{% for c in message['content'] | selectattr('type', 'equalto', 'text') %}"
        "{{ c['text'] }}{% endfor %}{% else %}ASSISTANT: {% for c in message['content'] %}"
        "{{ c['text'] }}{% endfor %}{% endif %}{% endfor %}"
        "{% if add_generation_prompt %}ASSISTANT:{% endif %}"
    )
    (tmp_path / "t.jinja").write_text(images_first)
    model = build_tiny_model("llava", tmp_path / "llava")
    backend = load_backend(str(model), device="cpu", chat_template=tmp_path / "t.jinja")
    before, inline = _context_items(pictures)
    assert len(list(backend.records([(before, 0, [0, 1, 2])], scheme=DIGITS))) == 1
    with pytest.raises(BackendError, match="does not keep the pictures where the question"):
        list(backend.records([(inline, 0, [0, 1, 2])], scheme=DIGITS))


def test_items_file_round_trips_context_pictures_and_checks_places(pictures, tmp_path):
    items = _context_items(pictures)
    write_items(tmp_path / "items.jsonl", items)
    back = read_items(tmp_path / "items.jsonl")
    assert [it.context_images for it in back] == [it.context_images for it in items]
    assert [it.pictures for it in back] == [[*it.images, *it.context_images] for it in items]
    line = json.loads((tmp_path / "items.jsonl").read_text().splitlines()[1])
    line["context_images"] = []  # an <image> place without its picture
    (tmp_path / "bad.jsonl").write_text(json.dumps(line) + "\n")
    with pytest.raises(DataError, match="'question' holds 1 <image> places but the item has 0"):
        read_items(tmp_path / "bad.jsonl")
    line["context_images"] = ["nowhere.png"]
    (tmp_path / "bad.jsonl").write_text(json.dumps(line) + "\n")
    with pytest.raises(DataError, match="context image not found"):
        read_items(tmp_path / "bad.jsonl")
    # Without context pictures an item is written exactly as before.
    write_items(tmp_path / "plain.jsonl", _plain_items(pictures)[:1])
    assert "context_images" not in (tmp_path / "plain.jsonl").read_text()


def test_run_fingerprints_context_pictures_as_it_does_candidates(pictures, tmp_path):
    from lad.run.config import eval_config
    from lad.run.preflight import check_inputs

    items = _context_items(pictures)
    write_items(tmp_path / "items.jsonl", items)
    config = eval_config(data=str(tmp_path / "items.jsonl"), num_candidates=3)
    evaluation = read_items(tmp_path / "items.jsonl")
    inputs = check_inputs(config, tmp_path / "run", (evaluation, [])).inputs
    fingerprinted = inputs["data"]["images"]
    for it in items:
        for p in it.pictures:
            assert os.path.relpath(p, tmp_path) in fingerprinted
    assert len(fingerprinted) == 6  # pictures[0..5]: candidates and both context pictures


if __name__ == "__main__":  # writes the reference; run only on the code before context pictures
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        REFERENCE.write_text(json.dumps(_plain_records(Path(tmp)), indent=1) + "\n")
    sys.exit(0)
