"""Requests in batches of one N, what a batch is on its way through the model (`Encoded`,
`Prefill`), and the inputs of a batch's label steps (docs/backends.md)."""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from lad.backends.scoring import LabelTrie, Prefix
from lad.core.records import Record
from lad.errors import BackendError, bad_parameter

if TYPE_CHECKING:
    from lad.core.items import Item, Request


@dataclass
class Prefill:
    """What one prompt forward gives: root logits (B, V), the KV cache, attention rows (B, L, T),
    and, when label tokens rode along in the same forward, their logits (B, 1, D, V)."""

    logits: torch.Tensor
    cache: Any
    rows: torch.Tensor
    path_logits: torch.Tensor | None = None


@dataclass
class Encoded:
    """One batch ready for the model: the processor's outputs on the host (pinned when the model
    is on CUDA, so the copy to the GPU does not block), each prompt's image spans (Eq. 6's R_k)
    and the labels' trie; `images`: each prompt's pictures as the processor got them (None for
    text candidates), which an engine that runs its own processor is given again."""

    batch: list[Request]
    inputs: dict[str, Any]
    spans: list[list[tuple[int, int]]]
    trie: LabelTrie
    images: list[list[Any]] | None = None


@dataclass
class Queued:
    """A batch whose forward and scoring are queued on the device, results not read yet."""

    encoded: Encoded
    inputs: dict[str, Any]
    prefill: Prefill
    logprobs: torch.Tensor


def make_record(
    request: Request,
    logprobs: torch.Tensor,
    attention: torch.Tensor,
    spans: list[tuple[int, int]],
    prompt_tokens: int,
    extra: dict[str, Any] | None = None,
) -> Record:
    """A request's record (both engines'): its labels' log-probs (N,), Eq. 6's evidence (L, N),
    and in its `extra` the prompt's token count and each candidate's (`spans`), then `extra`'s.
    NaN/inf (e.g. a float16 overflow) is refused: a batch's records are all made before any
    is handed on."""
    item, ordering, order = request
    if not (torch.isfinite(logprobs).all() and torch.isfinite(attention).all()):
        raise BackendError(
            f"item {item.id!r}, ordering {ordering}: the model gave NaN or infinite "
            "log-probabilities or attention; try --dtype float32 (or bfloat16 on GPU)"
        )
    key = "candidate_tokens" if item.is_text else "image_tokens"
    sizes = {"prompt_tokens": int(prompt_tokens), key: [e - s for s, e in spans]}
    return Record(
        item=item.id,
        ordering=ordering,
        order=list(order),
        answer=list(order).index(item.answer),
        logprobs=logprobs.tolist(),
        attention=attention.tolist(),
        extra={**sizes, **(extra or {})},
    )


def extend_inputs(inputs: dict[str, Any], tokens: Prefix) -> dict[str, Any]:
    """The prompts' inputs with the same `tokens` appended to every row (rows end aligned)."""
    if not tokens:
        return dict(inputs)
    ids = inputs["input_ids"]
    new = torch.tensor(tokens, dtype=ids.dtype, device=ids.device).expand(ids.shape[0], -1)
    out = dict(inputs, input_ids=torch.cat([ids, new], dim=1))
    for key in ("attention_mask", "token_type_ids", "mm_token_type_ids"):
        if key in inputs:
            fill = torch.full_like(new, int(key == "attention_mask"), dtype=inputs[key].dtype)
            out[key] = torch.cat([inputs[key], fill], dim=1)
    return out


def positions(mask: torch.Tensor) -> torch.Tensor:
    """Position ids that skip left padding: (B, T)."""
    return (mask.long().cumsum(-1) - 1).clamp(min=0)


def check_order(item: Item, order: list[int]) -> None:
    if sorted(order) != list(range(item.num_candidates)):
        raise BackendError(
            f"item {item.id!r}: order {order} is not a permutation of its "
            f"{item.num_candidates} image indices"
        )


def check_context(item: Item, length: int, max_context: int, image: int | None = None) -> None:
    """A prompt of more tokens than the model's context is refused: its item, its token count
    (with `image`, how many are the pictures': how they divide), and what to do."""
    if length <= max_context:
        return
    parts, fix = "", "shorten the question or the options"  # text candidates
    if image is not None:
        parts = f" ({image} for the images, {length - image} for the text)"
        lower = "lower the image resolution/tiling options"
        fix = "shorten the query" if length - image > image else lower
    raise BackendError(
        f"item {item.id!r}: the prompt has {length} tokens{parts}, more than the model's "
        f"context of {max_context}; {fix}"
    )


def batched(requests: Iterable[Request], size: int, least: int = 1) -> Iterator[list[Request]]:
    """Consecutive requests, at most max(`size`, `least`) per batch, one N per batch (the trie
    depends on N) and one kind of candidate (pictures or texts); `size`, the 'batch_size'
    parameter, is refused below 1."""
    if size < 1:
        raise bad_parameter("batch_size", ">= 1", size, BackendError)
    runs = itertools.groupby(requests, lambda req: (req[0].num_candidates, req[0].is_text))
    for _, run in runs:
        while batch := list(itertools.islice(run, max(size, least))):
            yield batch
