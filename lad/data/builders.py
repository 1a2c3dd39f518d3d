"""Candidate selection shared by every benchmark builder (paper §5.2, Appendix C).

- random: N−1 distractors drawn uniformly from the pool, never the anchor, no duplicates.
- adversarial: the pool is filtered (same category set as the anchor; any caption whose text cosine
  to the query is ≥ 0.9), then the N−1 distractors are the most visually similar images left.
- the answer's position is balanced over the N positions and shuffled, seeded.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from lad.core.methods import flag
from lad.data.clip import DEFAULT_CLIP, CacheStats, ClipEmbedder, EmbeddingCache, cache_dir_for
from lad.data.items import Item, seeded_rng, write_items
from lad.errors import DataError, check_choice
from lad.io.images import check_image

SETTINGS = ("random", "adversarial")
TEXT_SIMILARITY_THRESHOLD = 0.9


def check_split(items: int | None, calibration_items: int) -> None:
    if calibration_items < 0 or (items is not None and items < 1):
        raise DataError("--items must be at least 1 and --calibration-items at least 0")


def balanced_positions(
    count: int,
    num_candidates: int,
    rng: np.random.Generator,
    weights: Sequence[float] | None = None,
) -> list[int]:
    """Answer positions for `count` items: each position's share follows `weights` (uniform by
    default) to within one item, in a seeded random order."""
    if weights is None:
        weights = [1.0] * num_candidates
    w = np.asarray(weights, dtype=np.float64)
    with np.errstate(over="ignore"):
        total = w.sum() if w.shape == (num_candidates,) else np.nan
        finite = np.isfinite(count * total)  # then so is every count·w below
    if not finite or np.any(w < 0) or total <= 0:
        raise DataError(
            f"--position-weights must be {num_candidates} non-negative numbers, not all zero, "
            f"whose sum times the item count is finite; got {list(weights)}"
        )
    # Largest-remainder rounding keeps the counts within one of count·w/Σw.
    exact = count * w / total
    counts = np.floor(exact).astype(int)
    remainder_order = np.argsort(-(exact - counts), kind="stable")
    counts[remainder_order[: count - counts.sum()]] += 1
    positions = np.repeat(np.arange(num_candidates), counts)
    return rng.permutation(positions).tolist()


def place_answer(
    anchor: int, distractors: Sequence[int], position: int, rng: np.random.Generator
) -> list[int]:
    """The candidate list: the anchor at `position`, the distractors in a random order around it
    (never in selection order, which would put the hardest negatives at fixed positions)."""
    candidates = [distractors[i] for i in rng.permutation(len(distractors))]
    candidates.insert(position, anchor)
    return candidates


def random_distractors(
    anchor: int, pool: Sequence[int], k: int, rng: np.random.Generator
) -> list[int]:
    """k distinct pool members other than the anchor, uniformly at random (_check_options made
    sure every pool build_benchmark draws from has them)."""
    pool = np.asarray(pool, dtype=np.int64)
    others = pool[pool != anchor]
    return others[rng.choice(len(others), size=k, replace=False)].tolist()


@dataclass
class _Embeddings:
    images: np.ndarray  # (M, D) ℓ2-normalised
    captions: np.ndarray  # (C, D) ℓ2-normalised, image by image
    bounds: np.ndarray  # (M + 1,) image i's captions are rows bounds[i]:bounds[i+1]
    category_ids: np.ndarray | None  # (M,) a number per distinct category set


def hard_negatives(
    anchor: int, pool: np.ndarray, k: int, emb: _Embeddings, query: np.ndarray, threshold: float
) -> list[int] | None:
    """The k pool images most visually similar to the anchor among those that pass the filters
    (Appendix C), or None when fewer than k pass.

    Filtered out: the anchor; images whose category set equals the anchor's; images with any
    caption whose cosine to the query embedding is ≥ threshold. Visual ties go to the lower
    index. Candidates are tested nearest first, so only the few nearest images' captions are
    ever scored: the same result as filtering the whole pool first, at a fraction of the cost.
    """
    keep = pool[pool != anchor]
    if emb.category_ids is not None:
        keep = keep[emb.category_ids[keep] != emb.category_ids[anchor]]
    sims = (emb.images @ emb.images[anchor])[keep]  # (len(keep),)
    chosen: list[int] = []
    for i in keep[np.lexsort((keep, -sims))]:
        captions = emb.captions[emb.bounds[i] : emb.bounds[i + 1]]
        if np.max(captions @ query) < threshold:
            chosen.append(int(i))
            if len(chosen) == k:
                return chosen
    return None


@dataclass
class Pool:
    """A dataset's usable images with their captions (and category sets where the dataset has
    them, i.e. MS-COCO). `source` names the annotation file, for messages."""

    name: str
    source: Path
    images: list[Path]
    captions: list[list[str]]
    categories: list[frozenset[int]] | None = None


@dataclass
class BuildOptions:
    """How to draw items from a pool. A field's metadata is its flag of `lad data coco|flickr8k`
    (as lad.core.methods.flag's, read by lad.cli.flags.add_settings); `lad data shapes` shares those
    of num_candidates, setting, items and seed."""

    num_candidates: int = flag(4, "images per item, N", flags=("--num-candidates", "-n"), minimum=2)
    setting: str = flag("random", "how distractors are chosen", choices=SETTINGS)
    items: int = flag(1000, "number of items", minimum=1)
    calibration_items: int = flag(
        5, "items written to OUT's .calibration.jsonl sibling, disjoint from the others", minimum=0
    )
    seed: int = flag(0, "seed of every random choice", type=int)
    clip: str = flag(
        DEFAULT_CLIP, "CLIP-like model (hub id or local path) for the adversarial setting"
    )
    device: str = flag("auto", "auto, cpu or cuda[:i]")
    batch_size: int = flag(32, "CLIP batch size", minimum=1)
    text_threshold: float = TEXT_SIMILARITY_THRESHOLD


@dataclass
class BuildResult:
    """What a build wrote, and how much work the embedding cache saved."""

    items_path: Path
    calibration_path: Path | None
    cache: CacheStats | None
    skipped_anchors: int


def calibration_path_for(out: Path) -> Path:
    """`coco-adv-4.jsonl` → `coco-adv-4.calibration.jsonl`."""
    return out.with_name(out.stem + ".calibration.jsonl")


def write_split_items(out: Path, items: list[Item], calibration: list[Item]) -> Path | None:
    """`items` to `out`, the calibration items (if any) to its sibling, whose path it returns."""
    write_items(out, items)
    if calibration:
        write_items(calibration_path_for(out), calibration)
    return calibration_path_for(out) if calibration else None


def _embed(pool: Pool, options: BuildOptions, out: Path) -> tuple[_Embeddings, CacheStats]:
    cache = EmbeddingCache(
        cache_dir_for(out, options.clip),
        ClipEmbedder(options.clip, device=options.device, batch_size=options.batch_size),
    )
    images = cache.images(pool.images)
    captions = cache.texts([c for caps in pool.captions for c in caps])
    bounds = np.cumsum([0, *(len(caps) for caps in pool.captions)])
    category_ids = None
    if pool.categories is not None:
        numbers: dict[frozenset[int], int] = {}
        category_ids = np.asarray([numbers.setdefault(c, len(numbers)) for c in pool.categories])
    return _Embeddings(images, captions, bounds, category_ids), cache.stats


def _check_options(pool: Pool, options: BuildOptions) -> None:
    check_choice("setting", options.setting, SETTINGS, DataError)
    if not pool.images or any(not caps for caps in pool.captions):
        raise DataError(f"{pool.source}: every image of the pool needs at least one caption")
    n = options.num_candidates
    if n < 2:
        raise DataError(f"--num-candidates must be at least 2. Got {n}.")
    check_split(options.items, options.calibration_items)
    if options.setting == "adversarial" and pool.name == "coco" and pool.categories is None:
        raise DataError("the adversarial MS-COCO setting needs --instances (category sets)")
    needed = options.calibration_items * n + max(options.items, n)
    if len(pool.images) < needed:
        raise DataError(
            f"{pool.source}: {len(pool.images)} usable images, but {options.items} items and "
            f"{options.calibration_items} calibration items of N = {n} need at least {needed}"
        )


def _draw_items(
    pool: Pool,
    options: BuildOptions,
    emb: _Embeddings | None,
    anchors: list[int],
    allowed: np.ndarray,
    count: int,
    id_prefix: str,
    rng: np.random.Generator,
) -> tuple[list[Item], int]:
    """`count` items whose anchors come from `anchors` in order; returns them and the number of
    anchors skipped because too few distractors passed the filters."""
    positions = balanced_positions(count, options.num_candidates, rng)
    k = options.num_candidates - 1
    built: list[Item] = []
    skipped = 0
    for anchor in anchors:
        if len(built) == count:
            break
        query = int(rng.integers(len(pool.captions[anchor])))
        if emb is None:  # the random setting
            distractors = random_distractors(anchor, allowed, k, rng)
        else:
            text = emb.captions[emb.bounds[anchor] + query]
            distractors = hard_negatives(anchor, allowed, k, emb, text, options.text_threshold)
        if distractors is None:
            skipped += 1
            continue
        position = positions[len(built)]
        chosen = place_answer(anchor, distractors, position, rng)
        extra = {
            "setting": options.setting,
            "source": pool.name,
            "image": pool.images[anchor].name,
            "caption_index": query,
        }
        item_id = f"{id_prefix}-{len(built):05d}"
        images = [pool.images[i] for i in chosen]
        built.append(Item(item_id, pool.captions[anchor][query], images, position, extra))
    if len(built) < count:
        raise DataError(
            f"{pool.source}: only {len(built)} of {count} items could be built; for {skipped} "
            f"anchors fewer than {options.num_candidates - 1} images passed the adversarial "
            "filters. Ask for fewer items or candidates, or use a larger image set."
        )
    return built, skipped


def build_benchmark(pool: Pool, out: str | Path, options: BuildOptions) -> BuildResult:
    """Write `options.items` evaluation items to `out` and the calibration items beside it.

    Calibration items are drawn first; none of their images (anchors or distractors) is used by
    any evaluation item. Evaluation anchors are distinct images; captions are chosen by the seed.
    """
    _check_options(pool, options)
    out = Path(out)
    emb, stats = _embed(pool, options, out) if options.setting == "adversarial" else (None, None)
    rng = seeded_rng(options.seed, pool.name, options.setting, options.num_candidates)
    order = rng.permutation(len(pool.images)).tolist()
    everyone = np.arange(len(pool.images))
    prefix = f"{pool.name}-{options.setting}-n{options.num_candidates}"
    calibration, skipped_cal = _draw_items(
        pool, options, emb, order, everyone, options.calibration_items, prefix + "-cal", rng
    )
    index = {path: i for i, path in enumerate(pool.images)}
    taken = {index[path] for it in calibration for path in it.images}
    allowed = np.asarray([i for i in everyone if i not in taken], dtype=np.int64)
    anchors = [i for i in order if i not in taken]
    items, skipped = _draw_items(pool, options, emb, anchors, allowed, options.items, prefix, rng)
    for path in dict.fromkeys(p for it in [*calibration, *items] for p in it.images):
        check_image(path)  # within lad.io.images' limits, and PIL's integrity check
    cal_path = write_split_items(out, items, calibration)
    return BuildResult(out, cal_path, stats, skipped + skipped_cal)


def build_from_files(
    dataset: str, files: dict, out: str | Path, options: BuildOptions, skip_missing: bool = False
) -> BuildResult:
    """`build_benchmark` of the pool of a dataset's own files (`lad data coco|flickr8k`, a suite's
    cell): files' images folder, captions file and MS-COCO's instances file (None: no category
    sets); skip_missing: leave out listed images absent on disk."""
    images, captions = files["images"], files["captions"]
    if dataset == "coco":
        from lad.data.coco import load_coco

        pool = load_coco(images, captions, files["instances"], skip_missing=skip_missing)
    else:
        from lad.data.flickr import load_flickr8k

        pool = load_flickr8k(images, captions, skip_missing=skip_missing)
    return build_benchmark(pool, out, options)
