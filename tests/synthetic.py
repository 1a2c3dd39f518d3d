"""Synthetic records from a toy "model" with a known position bias, for tests and benchmarks.

Each item has N images with a content score (the answer image's is higher). The toy model's
log-probs are   β · content[order[p]] + B[answer, p] + noise,   so with bias="conditional" the
bias depends on where the answer is (it favours the answer's right-hand neighbour, as in §3.1,
plus a static preference for the last position). Its attention, in a few informative layers,
carries more mass and follows the content, times a structural prior (a sink on the first
position); the other layers carry little mass and no content. With bias="none" the log-probs and
attention depend on content only.

    model = SyntheticModel(num_candidates=4)
    records = model.eval_records(200, num_shuffles=5)
    calibration = model.calibration_records(5)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from lad.core.records import RecordSet


@dataclass(frozen=True)
class SyntheticModel:
    num_candidates: int = 4
    num_layers: int = 12
    informative_layers: tuple[int, ...] | None = None  # default: layers L/2 and 3L/4
    bias: str = "conditional"  # or "none"
    margin: float = 1.5  # answer image's content advantage
    signal: float = 1.5  # β, weight of content in the log-probs
    neighbor_bias: float = 3.0  # B[i, (i+1) mod N]
    last_bias: float = 1.0  # B[i, N-1]
    attention_signal: float = 1.2  # content weight in informative layers' attention
    sink: float = 3.0  # structural attention prior on position 0
    noise: float = 0.7  # perception noise per prompt
    attention_noise: float = 0.05
    seed: int = 0

    # -- items -----------------------------------------------------------------------------

    def _items(self, num_items: int, prefix: str, stream: int):
        rng = np.random.default_rng([self.seed, stream])
        n = self.num_candidates
        content = rng.normal(size=(num_items, n))
        answer_image = rng.integers(0, n, size=num_items)
        content[np.arange(num_items), answer_image] += self.margin
        names = np.array([f"{prefix}-{k:05d}" for k in range(num_items)])
        return names, content, answer_image

    def eval_records(self, num_items: int, num_shuffles: int = 5) -> RecordSet:
        """T orderings per item: the identity first, then random permutations."""
        n = self.num_candidates
        rng = np.random.default_rng([self.seed, 2])
        item_idx = np.repeat(np.arange(num_items), num_shuffles)
        ordering = np.tile(np.arange(num_shuffles), num_items)
        order = np.argsort(rng.random((len(item_idx), n)), axis=1)
        order[ordering == 0] = np.arange(n)
        return self._records(self._items(num_items, "item", 0), item_idx, ordering, order, 3)

    def _cyclic(self, items, stream: int) -> RecordSet:
        n = self.num_candidates
        num_items = len(items[0])
        item_idx = np.repeat(np.arange(num_items), n)
        shift = np.tile(np.arange(n), num_items)
        order = (np.arange(n)[None, :] + shift[:, None]) % n  # order[p] = (p + s) mod N
        return self._records(items, item_idx, shift, order, stream)

    def calibration_records(self, num_items: int = 5) -> RecordSet:
        """Calibration items (disjoint from evaluation items) under all N cyclic shifts."""
        return self._cyclic(self._items(num_items, "cal", 1), stream=4)

    def perm_records(self, num_items: int) -> RecordSet:
        """The evaluation items under all N cyclic shifts of the identity order (perm-avg)."""
        return self._cyclic(self._items(num_items, "item", 0), stream=5)

    # -- the toy model ---------------------------------------------------------------------

    def bias_matrix(self) -> np.ndarray:
        """(N, N) B[i, j]: added to log-prob j when the answer is at i."""
        n = self.num_candidates
        b = np.zeros((n, n))
        if self.bias == "conditional":
            b[np.arange(n), (np.arange(n) + 1) % n] += self.neighbor_bias
            b[:, n - 1] += self.last_bias
        return b

    def _records(self, items, item_idx, ordering, order, stream: int) -> RecordSet:
        names, content, answer_image = items
        n, nl = self.num_candidates, self.num_layers
        rng = np.random.default_rng([self.seed, stream])
        r = len(item_idx)
        # (R, N) content at each position as this prompt perceives it; logits and attention
        # both read this, so in an unbiased model attention adds no information to the logits
        shown = content[item_idx[:, None], order] + self.noise * rng.normal(size=(r, n))
        answer = np.argmax(order == answer_image[item_idx][:, None], axis=1)
        z = self.signal * shown + self.bias_matrix()[answer] + 0.05 * rng.normal(size=(r, n))
        logprobs = z - np.log(np.exp(z).sum(axis=1, keepdims=True))

        informative = np.zeros(nl, dtype=bool)
        informative[list(self.informative_layers or (nl // 2, 3 * nl // 4))] = True
        mass = np.where(informative, 0.6, rng.uniform(0.05, 0.25, size=nl))  # (L,)
        structural = np.zeros(n)
        if self.bias == "conditional":
            structural[0] = np.log(self.sink)
        weight = np.where(informative, self.attention_signal, 0.0)  # (L,)
        # (R, L, N) log attention weights, normalised per layer to that layer's mass
        logits = (
            structural[None, None, :]
            + weight[None, :, None] * shown[:, None, :]
            + self.attention_noise * rng.normal(size=(r, nl, n)) * informative[None, :, None]
        )
        share = np.exp(logits - logits.max(axis=2, keepdims=True))
        share /= share.sum(axis=2, keepdims=True)
        attention = mass[None, :, None] * rng.uniform(0.8, 1.2, size=(r, nl, 1)) * share
        return RecordSet(
            items=names[item_idx],
            ordering=ordering.astype(np.int64),
            order=order.astype(np.int64),
            answer=answer.astype(np.int64),
            logprobs=logprobs,
            attention=attention,
            extra=[{} for _ in range(r)],
        )
