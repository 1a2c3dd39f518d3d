"""SoFA (Tian et al., CVPR 2025) as a mask: future image tokens get weight σ in every second layer
(docs/baselines.md, "SoFA").

M = (1 − σ)·causal + σ·bidirectional among image tokens: a weight multiplies exp(score) before the
softmax renormalises, so it enters SDPA as the additive entry log σ (σ = 0: the causal mask
exactly). `sofa_mask` (AttentionMaskInterface, `lad_sofa`) returns the model's own mask and its
SoFA version stacked as (B, 2, Q, KV); `sofa_attention` picks a half per layer, then runs lad's
capture function. A layer without the stacked mask, or a forward in which the SoFA layers did not
all run, is a BackendError: SoFA is never silently a no-op.

    with sofa_applied(backend, SofaOptions(sigma=0.5)):
        records = list(backend.records(requests, scheme=scheme))
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch

from lad.backends import capture as cap
from lad.errors import BackendError, bad_parameter

SOFA_IMPL = "lad_sofa"


@dataclass(frozen=True)
class SofaOptions:
    """sigma: weight σ in [0, 1] of a future image token; within_image: open same-image pairs."""

    sigma: float = 0.5
    within_image: bool = False

    def __post_init__(self) -> None:
        if not (isinstance(self.sigma, (int, float)) and 0.0 <= self.sigma <= 1.0):
            raise bad_parameter("sofa_sigma", "in [0, 1]", self.sigma, BackendError)


@dataclass
class _Scope:
    """One batch under SoFA: image_ids (B, T) = image index of each token, -1 for others."""

    image_ids: torch.Tensor
    options: SofaOptions
    soft: set[int] = field(default_factory=set)  # the decoder layers SoFA changes
    applied: set[int] = field(default_factory=set)
    masks: int = 0


_active: list[_Scope] = []


def image_ids(spans: list[list[tuple[int, int]]], length: int) -> torch.Tensor:
    """(B, T) image index k of every token inside image k's span, -1 elsewhere."""
    ids = torch.full((len(spans), length), -1, dtype=torch.long)
    for b, row in enumerate(spans):
        for k, (s, e) in enumerate(row):
            ids[b, s:e] = k
    return ids


def opened_pairs(
    ids: torch.Tensor,
    q_positions: torch.Tensor,
    kv_positions: torch.Tensor,
    within_image: bool,
) -> torch.Tensor:
    """(B, Q, KV) True where query q (an image token) meets a *later* image token kv.

    ids (B, T); positions beyond T are plain text (decoding steps).
    """
    width = int(max(q_positions.max(), kv_positions.max())) + 1
    if width > ids.shape[1]:
        ids = torch.nn.functional.pad(ids, (0, width - ids.shape[1]), value=-1)
    iq = ids[:, q_positions][:, :, None]  # (B, Q, 1)
    ik = ids[:, kv_positions][:, None, :]  # (B, 1, KV)
    pairs = (iq >= 0) & (ik >= 0) & (kv_positions[None, None, :] > q_positions[None, :, None])
    if not within_image:
        pairs &= iq != ik
    return pairs


def sofa_mask(
    batch_size: int,
    q_length: int,
    kv_length: int,
    q_offset: int = 0,
    kv_offset: int = 0,
    dtype: torch.dtype = torch.float32,
    **kwargs: Any,
) -> torch.Tensor:
    """The model's mask and its SoFA version, stacked: (B, 2, Q, KV) additive float;
    `kwargs`: sdpa_mask's (attention_mask, device, ...)."""
    from transformers.masking_utils import sdpa_mask

    if not _active:
        raise BackendError("the lad_sofa mask was built outside sofa_applied()")
    scope = _active[-1]
    kwargs["allow_is_causal_skip"] = False  # a mask even where it is all causal
    base = sdpa_mask(batch_size, q_length, kv_length, q_offset, kv_offset, **kwargs)
    # base: (B, 1, Q, KV) bool, True = attend
    ids = scope.image_ids.to(base.device)
    if batch_size != ids.shape[0]:
        if batch_size % ids.shape[0]:
            raise BackendError(f"SoFA: batch of {batch_size} rows for {ids.shape[0]} prompts")
        ids = ids.repeat_interleave(batch_size // ids.shape[0], dim=0)  # label decoding paths
    q_pos = torch.arange(q_offset, q_offset + q_length, device=base.device)
    kv_pos = torch.arange(kv_offset, kv_offset + kv_length, device=base.device)
    opened = opened_pairs(ids, q_pos, kv_pos, scope.options.within_image)[:, None] & ~base
    blocked = torch.finfo(dtype).min
    causal = torch.zeros(base.shape, dtype=dtype, device=base.device).masked_fill(~base, blocked)
    sigma = scope.options.sigma
    soft = causal.masked_fill(opened, math.log(sigma) if sigma > 0 else blocked)
    scope.masks += 1
    return torch.cat([causal, soft], dim=1)


def sofa_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    if attention_mask is None or attention_mask.dim() != 4 or attention_mask.shape[1] != 2:
        raise BackendError(
            f"SoFA cannot be applied: decoder layer {module.layer_idx} did not receive lad's "
            "SoFA mask (this architecture builds its attention mask outside transformers' "
            "AttentionMaskInterface)"
        )
    soft = bool(_active) and module.layer_idx in _active[-1].soft
    if soft:
        _active[-1].applied.add(module.layer_idx)
    mask = attention_mask[:, 1:2] if soft else attention_mask[:, 0:1]  # (B, 1, Q, KV)
    return cap.lad_capture_attention(module, query, key, value, mask, **kwargs)


@contextmanager
def sofa_applied(backend: Any, options: SofaOptions) -> Iterator[Any]:
    """Within this block `backend.records(...)` runs under the SoFA mask (fast capture only)."""
    cap.register()
    cap.register(SOFA_IMPL, sofa_attention, sofa_mask)
    before = backend.model.config.get_text_config()._attn_implementation
    if before != cap.CAPTURE_IMPL:
        raise BackendError(
            f"SoFA needs the language model on lad's attention function, not {before!r}"
        )
    # Every second softmax-attention layer from the first: a change in the last layer could not
    # reach the answer (the last token reads that layer's keys and values, made before it).
    soft = set(backend.attention_layers[::2])

    @contextmanager
    def scope(inputs: dict[str, Any], spans: Any) -> Iterator[None]:
        batch = _Scope(image_ids(spans, inputs["attention_mask"].shape[1]), options, soft)
        _active.append(batch)
        try:
            yield
        finally:
            _active.remove(batch)
        if batch.masks == 0:
            raise BackendError("SoFA cannot be applied: the model never built its mask through lad")
        if batch.applied != batch.soft:
            raise BackendError(
                f"SoFA reached decoder layers {sorted(batch.applied)} of {sorted(batch.soft)}; "
                "this architecture's attention does not go through lad's attention function"
            )

    backend.mask_scope = scope
    try:
        with backend.text_attention(SOFA_IMPL):
            yield backend
    finally:
        backend.mask_scope = None
