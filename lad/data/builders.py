"""Candidate selection shared by every benchmark builder (paper §5.2, Appendix C).

- random: N−1 distractors drawn uniformly from the pool, never the anchor, no duplicates.
- adversarial: the pool is filtered (same category set as the anchor; any caption whose text cosine
  to the query is ≥ 0.9), then the N−1 distractors are the most visually similar images left.
- the answer's position is balanced over the N positions and shuffled, seeded.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np

from lad.errors import DataError

SETTINGS = ("random", "adversarial")
TEXT_SIMILARITY_THRESHOLD = 0.9


def check_setting(setting: str) -> str:
    if setting not in SETTINGS:
        raise DataError(
            f"The 'setting' parameter must be one of {list(SETTINGS)}. Got {setting!r} instead."
        )
    return setting


def seeded_rng(seed: int, *keys: object) -> np.random.Generator:
    """A generator keyed by the seed and names, so independent parts never share a stream."""
    text = "\0".join(str(k) for k in (seed, *keys))
    digest = hashlib.sha256(text.encode()).digest()
    return np.random.default_rng(int.from_bytes(digest[:8], "little"))


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
    if w.shape != (num_candidates,) or not np.all(np.isfinite(w)) or np.any(w < 0) or w.sum() <= 0:
        raise DataError(
            f"position weights must be {num_candidates} non-negative numbers, not all zero; "
            f"got {list(weights)}"
        )
    # Largest-remainder rounding keeps the counts within one of count·w/Σw.
    exact = count * w / w.sum()
    counts = np.floor(exact).astype(int)
    remainder_order = np.argsort(-(exact - counts), kind="stable")
    counts[remainder_order[: count - counts.sum()]] += 1
    positions = np.repeat(np.arange(num_candidates), counts)
    return rng.permutation(positions).tolist()


def place_answer(anchor: int, distractors: Sequence[int], position: int) -> list[int]:
    """The candidate list with the anchor at `position` and the distractors, in order, around it."""
    candidates = list(distractors)
    candidates.insert(position, anchor)
    return candidates


def random_distractors(
    anchor: int, pool: Sequence[int], k: int, rng: np.random.Generator
) -> list[int]:
    """k distinct pool members other than the anchor, uniformly at random."""
    others = np.asarray([p for p in pool if p != anchor], dtype=np.int64)
    if len(others) < k:
        raise DataError(f"the pool has {len(others)} images besides the anchor; {k} are needed")
    return others[rng.choice(len(others), size=k, replace=False)].tolist()


def adversarial_filter(
    anchor: int,
    pool: np.ndarray,
    query_embedding: np.ndarray,
    caption_embeddings: Sequence[np.ndarray],
    categories: Sequence[frozenset[int]] | None,
    threshold: float = TEXT_SIMILARITY_THRESHOLD,
) -> np.ndarray:
    """Pool members allowed as hard negatives of `anchor` (Appendix C, step 1).

    Excluded: the anchor; images whose category set equals the anchor's (when categories are known);
    images with any caption whose cosine to the query is ≥ threshold. Embeddings are ℓ2-normalised.
    """
    keep = pool[pool != anchor]
    if categories is not None:
        same = np.fromiter((categories[i] == categories[anchor] for i in keep), bool, len(keep))
        keep = keep[~same]
    max_cos = np.fromiter(
        (float(np.max(caption_embeddings[i] @ query_embedding)) for i in keep), float, len(keep)
    )
    return keep[max_cos < threshold]


def nearest_visual(
    anchor: int, candidates: np.ndarray, image_embeddings: np.ndarray, k: int
) -> list[int]:
    """The k candidates with the largest visual cosine to the anchor (Appendix C, step 2).

    Ties are broken by the lower index so the choice is deterministic.
    """
    if len(candidates) < k:
        raise DataError(f"only {len(candidates)} images pass the filters; {k} are needed")
    sims = image_embeddings[candidates] @ image_embeddings[anchor]
    order = np.lexsort((candidates, -sims))
    return candidates[order[:k]].tolist()
