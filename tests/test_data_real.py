import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from lad.cli import main
from lad.data.builders import BuildOptions, build_benchmark, place_answer
from lad.data.clip import ClipEmbedder, cache_dir_for
from lad.data.coco import load_coco
from lad.data.flickr import load_flickr8k
from lad.data.items import read_items
from lad.errors import DataError
from tests.data_fixtures import make_tiny_clip, write_coco, write_flickr


@pytest.fixture(scope="session")
def clip(tmp_path_factory) -> str:
    return str(make_tiny_clip(tmp_path_factory.mktemp("clip")))


@pytest.fixture(scope="session")
def coco(tmp_path_factory) -> dict[str, Path]:
    return write_coco(tmp_path_factory.mktemp("coco"))


@pytest.fixture(scope="session")
def flickr(tmp_path_factory) -> dict[str, Path]:
    return write_flickr(tmp_path_factory.mktemp("flickr"))


@pytest.fixture(scope="session")
def embeddings(clip, coco) -> dict:
    """Embeddings computed directly, without the builder's cache, to check its choices."""
    pool = load_coco(coco["images"], coco["captions"], coco["instances"])
    return {**_direct_embeddings(clip, pool), "pool": pool}


def _direct_embeddings(clip: str, pool) -> dict:
    embedder = ClipEmbedder(clip, device="cpu", batch_size=64)
    texts = sorted({c for caps in pool.captions for c in caps})
    table = dict(zip(texts, embedder.embed_texts(texts), strict=True))
    return {
        "image": dict(zip(pool.images, embedder.embed_images(pool.images), strict=True)),
        "text": lambda captions: np.stack([table[c] for c in captions]),
    }


def _options(clip: str, **kwargs) -> BuildOptions:
    base = {"num_candidates": 4, "items": 10, "calibration_items": 3, "clip": clip}
    return BuildOptions(device="cpu", **{**base, **kwargs})


def _all_images(items) -> set[Path]:
    return {p for it in items for p in it.images}


def _check_adversarial(items, calibration, pool, embeddings, use_categories: bool):
    index = {p: i for i, p in enumerate(pool.images)}
    vis = embeddings["image"]
    excluded = _all_images(calibration)
    for it in items:
        anchor = it.images[it.answer]
        a = index[anchor]
        assert it.query in pool.captions[a]
        q = embeddings["text"]([it.query])[0]
        allowed = []
        for p in pool.images:
            i = index[p]
            if p == anchor or p in excluded:
                continue
            if use_categories and pool.categories[i] == pool.categories[a]:
                continue
            if np.max(embeddings["text"](pool.captions[i]) @ q) >= 0.9:
                continue
            allowed.append(p)
        distractors = [p for k, p in enumerate(it.images) if k != it.answer]
        expected = sorted(allowed, key=lambda p: -float(vis[p] @ vis[anchor]))[:3]
        assert sorted(distractors) == sorted(expected)
        for p in distractors:
            if use_categories:
                assert pool.categories[index[p]] != pool.categories[a]
            assert np.max(embeddings["text"](pool.captions[index[p]]) @ q) < 0.9


def test_coco_adversarial_obeys_filters_and_takes_top_visual_neighbours(
    tmp_path, clip, coco, embeddings
):
    pool = embeddings["pool"]
    result = build_benchmark(pool, tmp_path / "adv.jsonl", _options(clip, setting="adversarial"))
    items = read_items(result.items_path, num_candidates=4)
    calibration = read_items(result.calibration_path, num_candidates=4)
    assert len(items) == 10 and len(calibration) == 3
    assert not _all_images(items) & _all_images(calibration)
    assert len({it.images[it.answer] for it in items}) == 10
    _check_adversarial(items, calibration, pool, embeddings, use_categories=True)
    _check_adversarial(calibration, [], pool, embeddings, use_categories=True)
    # the text filter had work to do: a twin shares a caption with cosine 1
    assert result.cache.misses["images"] == 40


def test_flickr_adversarial_uses_only_the_text_filter(tmp_path, clip, flickr):
    pool = load_flickr8k(flickr["images"], flickr["captions"])
    assert pool.categories is None and len(pool.images) == 40
    result = build_benchmark(pool, tmp_path / "f.jsonl", _options(clip, setting="adversarial"))
    items = read_items(result.items_path)
    calibration = read_items(result.calibration_path)
    emb = _direct_embeddings(clip, pool)
    _check_adversarial(items, calibration, pool, emb, use_categories=False)


def test_random_items_have_no_duplicates_and_balanced_answers(tmp_path, coco):
    pool = load_coco(coco["images"], coco["captions"])
    opts = BuildOptions(num_candidates=4, items=20, calibration_items=2, seed=7)
    result = build_benchmark(pool, tmp_path / "r.jsonl", opts)
    items = read_items(result.items_path)
    assert result.cache is None  # the random setting needs no CLIP
    for it in items:
        assert len(set(it.images)) == 4
        assert it.query in pool.captions[pool.images.index(it.images[it.answer])]
    assert Counter(it.answer for it in items) == {0: 5, 1: 5, 2: 5, 3: 5}
    assert not _all_images(items) & _all_images(read_items(result.calibration_path))


def test_builds_are_deterministic_for_a_seed(tmp_path, coco):
    pool = load_coco(coco["images"], coco["captions"])
    texts = [
        build_benchmark(pool, tmp_path / f"{name}.jsonl", BuildOptions(items=8, seed=seed))
        .items_path.read_text()
        .replace(f"{name}.jsonl", "")
        for name, seed in [("a", 1), ("b", 1), ("c", 2)]
    ]
    assert texts[0] == texts[1]
    assert texts[0] != texts[2]


def test_embeddings_are_cached_next_to_the_output(tmp_path, clip, coco):
    pool = load_coco(coco["images"], coco["captions"], coco["instances"])
    first = build_benchmark(pool, tmp_path / "a.jsonl", _options(clip, setting="adversarial"))
    assert first.cache.misses["images"] == 40 and first.cache.hits["images"] == 0
    folder = cache_dir_for(tmp_path / "a.jsonl", clip)
    assert len((folder / "images.txt").read_text().splitlines()) == 40
    assert np.load(folder / "images.npy").shape == (40, 16)
    opts = _options(clip, setting="adversarial", num_candidates=3, seed=4)
    second = build_benchmark(pool, tmp_path / "b.jsonl", opts)
    assert second.cache.misses == {"images": 0, "texts": 0}
    assert second.cache.hits["images"] == 40


def _rewrite(path: Path, edit) -> None:
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data))


def test_annotation_errors_name_the_file_and_entry(tmp_path, coco):
    bad = tmp_path / "captions.json"
    bad.write_text(coco["captions"].read_text())
    _rewrite(bad, lambda d: d["annotations"][2].pop("caption"))
    with pytest.raises(DataError, match=r"captions\.json: annotations\[2\]: missing key 'caption'"):
        load_coco(coco["images"], bad)
    _rewrite(bad, lambda d: d.pop("images"))
    with pytest.raises(DataError, match=r"captions\.json: top level: missing key 'images'"):
        load_coco(coco["images"], bad)
    bad.write_text(json.dumps({"images": [1], "annotations": []}))
    with pytest.raises(DataError, match=r"captions\.json: images\[0\]: expected a JSON object"):
        load_coco(coco["images"], bad)


def test_a_caption_file_that_is_no_text_file_is_one_error(tmp_path, flickr):
    with pytest.raises(DataError, match=r"is a folder, not a caption file"):
        load_flickr8k(flickr["images"], tmp_path)
    latin = tmp_path / "Flickr8k.token.txt"
    latin.write_bytes(b"img_0000.jpg#0\tcaf\xe9\n")
    with pytest.raises(DataError, match=r"not UTF-8 text .*line 1"):
        load_flickr8k(flickr["images"], latin)


def test_missing_and_unreadable_images_are_errors(tmp_path, clip):
    paths = write_coco(tmp_path / "c", count=24)
    (paths["images"] / "img_0003.jpg").unlink()
    with pytest.raises(DataError, match=r"1 listed images are not in .*img_0003\.jpg"):
        load_coco(paths["images"], paths["captions"])
    pool = load_coco(paths["images"], paths["captions"], paths["instances"], skip_missing=True)
    assert len(pool.images) == 23
    (paths["images"] / "img_0005.jpg").write_bytes(b"not a jpeg")
    opts = BuildOptions(items=19, calibration_items=1)
    with pytest.raises(DataError, match=r"img_0005\.jpg: cannot read image"):
        build_benchmark(pool, tmp_path / "r.jsonl", opts)
    with pytest.raises(DataError, match=r"img_0005\.jpg: cannot read image"):
        build_benchmark(pool, tmp_path / "a.jsonl", _options(clip, setting="adversarial"))


def test_too_few_images_is_an_error(tmp_path, coco):
    pool = load_coco(coco["images"], coco["captions"])
    with pytest.raises(DataError, match=r"40 usable images, but 30 items and 5 calibration items"):
        build_benchmark(pool, tmp_path / "x.jsonl", BuildOptions(items=30, calibration_items=5))


def test_flickr_bad_line_names_the_line(tmp_path, flickr):
    bad = tmp_path / "Flickr8k.token.txt"
    bad.write_text(flickr["captions"].read_text() + "img_0001.jpg a caption without a tab\n")
    with pytest.raises(DataError, match=r"Flickr8k\.token\.txt:\d+: expected '<image>#<k><TAB>"):
        load_flickr8k(flickr["images"], bad)


def test_flickr_lines_end_where_a_text_file_s_lines_end(tmp_path, flickr):
    """Lines end at \\n, \\r\\n or \\r only: a caption holding another Unicode line separator
    is one caption, and a UTF-8 BOM is no part of the first image's name."""
    lines = flickr["captions"].read_text().splitlines()
    lines[3] += " caf\u2028e\x0c\x85"
    odd = tmp_path / "Flickr8k.token.txt"
    odd.write_text("\ufeff" + "\r\n".join(lines) + "\n", encoding="utf-8", newline="")
    pool, plain = (
        load_flickr8k(flickr["images"], odd),
        load_flickr8k(flickr["images"], flickr["captions"]),
    )
    assert pool.images == plain.images  # the first image kept, by its name
    flat = [c for caps in pool.captions for c in caps]
    assert flat == [line.partition("\t")[2].strip() for line in lines]
    assert "caf\u2028e" in flat[3]


def test_cli_coco_and_flickr(tmp_path, clip, coco, flickr, capsys):
    out = tmp_path / "coco.jsonl"
    argv = ["data", "coco", "--images", str(coco["images"]), "--captions", str(coco["captions"])]
    argv += ["--instances", str(coco["instances"]), "--items", "6", "--clip", clip]
    assert main([*argv, "--setting", "adversarial", "--device", "cpu", "--out", str(out)]) == 0
    assert "Wrote 6 items" in capsys.readouterr().out
    assert len(read_items(out)) == 6
    assert len(read_items(tmp_path / "coco.calibration.jsonl")) == 5
    flick = ["data", "flickr8k", "--images", str(flickr["images"]), "--captions"]
    assert main([*flick, str(tmp_path / "none.txt"), "--out", str(out)]) == 1
    assert capsys.readouterr().err.strip().endswith("none.txt: no such caption file")


def test_distractors_are_placed_in_random_order_around_the_answer():
    orders = set()
    for seed in range(60):
        candidates = place_answer(9, [1, 2, 3], 2, np.random.default_rng(seed))
        assert candidates[2] == 9
        orders.add(tuple(c for c in candidates if c != 9))
    assert len(orders) == 6  # never the selection (nearest-first) order only


def test_bad_device_and_broken_cache_are_clear_errors(tmp_path, clip, coco):
    import torch

    from lad.errors import BackendError

    if not torch.cuda.is_available():
        with pytest.raises(BackendError, match="--device cuda: no CUDA"):
            ClipEmbedder(clip, device="cuda")
    with pytest.raises(BackendError, match="--device must be auto, cpu or cuda"):
        ClipEmbedder(clip, device="tpu")
    pool = load_coco(coco["images"], coco["captions"], coco["instances"])
    build_benchmark(pool, tmp_path / "a.jsonl", _options(clip, setting="adversarial"))
    listing = cache_dir_for(tmp_path / "a.jsonl", clip) / "images.txt"
    listing.write_text("\n".join(listing.read_text().splitlines()[:-1]) + "\n")
    with pytest.raises(DataError, match=r"cache is inconsistent .* delete the folder"):
        build_benchmark(pool, tmp_path / "b.jsonl", _options(clip, setting="adversarial"))
