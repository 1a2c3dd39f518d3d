"""Qwen2-VL / Qwen2.5-VL vision attention: every image and window of a batch in one SDPA call
(docs/backends.md, "Vision attention").

The towers pack a batch's patches into one sequence cut into segments at `cu_seqlens` (an image,
or a window of one); under SDPA transformers makes one call per segment and a host sync per
layer. A forward pre-hook hands the segments to `lad_vision` and gives the module the single
segment [0, T); `lad_vision` runs them as one padded batch, with a key-padding mask only when
their lengths differ (else the flash kernel applies). Segments are read once per forward.
"""

from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass
from typing import Any

import torch

VISION_IMPL = "lad_vision"


@dataclass(frozen=True)
class Segments:
    """A packed sequence's segments as a padded batch.

    count, longest: S segments, L_max tokens in the longest.
    whole: CPU [0, T]: what the module sees as its cu_seqlens (one segment, one call).
    gather: (S * L_max,) token index of each padded slot, padding slots point at token 0;
            None when all segments have L_max tokens (the packed sequence is the batch).
    keep: (T,) padded slot of each token, in order; None with `gather`.
    mask: (S, 1, 1, L_max) bool, True = a real key; None with `gather`.
    """

    count: int
    longest: int
    whole: torch.Tensor
    gather: torch.Tensor | None = None
    keep: torch.Tensor | None = None
    mask: torch.Tensor | None = None

    @classmethod
    def from_bounds(cls, bounds: list[int], device: torch.device) -> Segments:
        lengths = [b - a for a, b in itertools.pairwise(bounds) if b > a]
        total = bounds[-1] - bounds[0]
        whole = torch.tensor([0, total], dtype=torch.int32)
        longest = max(lengths)
        if all(n == longest for n in lengths):
            return cls(len(lengths), longest, whole)
        sizes = torch.tensor(lengths)
        starts = sizes.cumsum(0) - sizes  # (S,)
        slot = torch.arange(longest)
        real = slot[None, :] < sizes[:, None]  # (S, L_max)
        gather = torch.where(real, starts[:, None] + slot[None, :], 0).flatten()
        keep = real.flatten().nonzero().flatten()
        mask = real[:, None, None, :]
        moved = (t.to(device, non_blocking=True) for t in (gather, keep, mask))
        return cls(len(lengths), longest, whole, *moved)


def packed_vision_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    lad_segments: Segments | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """Attention within each segment of a packed (1, H, T, D) sequence, in one SDPA call.

    Without `lad_segments` (a module lad did not hook) it is plain SDPA.
    """
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if lad_segments is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    seg = lad_segments
    _, h, _, d = query.shape

    def padded(x: torch.Tensor) -> torch.Tensor:  # (1, H, T, D) -> (S, H, L_max, D)
        x = x[0] if seg.gather is None else x[0][:, seg.gather]  # (H, S * L_max, D)
        return x.reshape(h, seg.count, seg.longest, d).transpose(0, 1)

    out = torch.nn.functional.scaled_dot_product_attention(
        padded(query), padded(key), padded(value), attn_mask=seg.mask, scale=kwargs.get("scaling")
    )  # (S, H, L_max, D)
    out = out.transpose(1, 2).reshape(seg.count * seg.longest, h, d)  # (S * L_max, H, D)
    if seg.keep is not None:
        out = out[seg.keep]  # (T, H, D)
    return out.unsqueeze(0), None  # (1, T, H, D), as transformers' SDPA returns it


def use_packed_vision(model: Any) -> bool:
    """Route a Qwen2-VL / Qwen2.5-VL model's vision attention through `lad_vision`.

    Sets the vision tower's attention implementation and hooks its attention modules; returns
    False (and changes nothing) for a model without those modules. Idempotent.
    """
    from transformers import AttentionInterface
    from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VLVisionAttention
    from transformers.models.qwen2_vl.modeling_qwen2_vl import VisionAttention

    classes = (VisionAttention, Qwen2_5_VLVisionAttention)
    modules = [m for m in model.modules() if isinstance(m, classes)]
    if not modules:
        return False
    AttentionInterface.register(VISION_IMPL, packed_vision_attention)  # idempotent
    model.set_attn_implementation({"vision_config": VISION_IMPL})
    # A vision forward passes the same two cu_seqlens tensors (windows, whole images) to every
    # block: each is read to the host once (keyed by identity; the cache keeps them alive).
    cache = functools.lru_cache(maxsize=4)(lambda cu: Segments.from_bounds(cu.tolist(), cu.device))

    def hook(
        module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        if module.config._attn_implementation != VISION_IMPL:
            return args, kwargs  # another implementation was set later: leave the module as is
        segments = cache(kwargs["cu_seqlens"])
        return args, {**kwargs, "cu_seqlens": segments.whole, "lad_segments": segments}

    for module in modules:
        if not getattr(module, "_lad_packed", False):
            module.register_forward_pre_hook(hook, with_kwargs=True)
            module._lad_packed = True
    return True
