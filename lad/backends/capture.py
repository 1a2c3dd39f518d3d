"""Attention evidence (Eq. 6) captured inside the attention function, output still from SDPA.

`lad_capture` is registered with transformers' AttentionInterface (and its mask builder with
AttentionMaskInterface, else the function always receives mask=None and padding / sliding windows
are lost). It computes the layer's output with SDPA and, while a `Capture` is active, also the last
query row's post-softmax attention averaged over heads: O(T) memory per layer, not O(T²).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

CAPTURE_IMPL = "lad_capture"


class Capture:
    """Rows captured during one forward: layer index -> (B, T_kv) head-averaged attention.

    offset: tokens appended after the prompt in the same forward; the captured query is the one
    `offset` places before the end, and keys after it are left out (causal).
    """

    def __init__(self, offset: int = 0) -> None:
        self.rows: dict[int, torch.Tensor] = {}
        self.offset = offset


_active: list[Capture] = []


@contextmanager
def capturing(offset: int = 0) -> Iterator[Capture]:
    """Record the last prompt query's row of every decoder layer run inside this block."""
    cap = Capture(offset)
    _active.append(cap)
    try:
        yield cap
    finally:
        _active.remove(cap)


def last_row_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    mask: torch.Tensor | None,
    scaling: float,
    softcap: float | None = None,
    offset: int = 0,
) -> torch.Tensor:
    """Head-averaged attention of query row q-1-offset onto keys, in float32: (B, T_kv - offset).

    query (B, H, q, D); key (B, H_kv, T_kv, D); mask None (causal: the row sees every key up to
    its own), bool (B, 1, q, T_kv) with True = attend, or additive float of the same shape.
    """
    b, h, q_len, d = query.shape
    h_kv, t_kv = key.shape[1], key.shape[2] - offset
    q = query[:, :, q_len - 1 - offset, :].float().reshape(b, h_kv, h // h_kv, d)  # (B, H_kv, G, D)
    keys = key[:, :, :t_kv, :].float()  # (B, H_kv, T_kv, D)
    scores = torch.matmul(q, keys.transpose(-1, -2)) * scaling  # (B, H_kv, G, T_kv)
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    if mask is not None:
        last = mask[:, :, q_len - 1 - offset, :t_kv].unsqueeze(2)  # (B, 1, 1, T_kv)
        if last.dtype == torch.bool:
            scores = scores.masked_fill(~last, float("-inf"))
        else:
            scores = scores + last.float()
    return scores.softmax(dim=-1).mean(dim=(1, 2))  # (B, T_kv)


def lad_capture_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if _active:
        scale = scaling if scaling is not None else query.shape[-1] ** -0.5
        c = _active[-1]
        row = last_row_attention(query, key, attention_mask, scale, kwargs.get("softcap"), c.offset)
        c.rows[module.layer_idx] = row
    return sdpa_attention_forward(
        module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
    )


def register() -> None:
    """Make `attn_implementation="lad_capture"` available (idempotent)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(CAPTURE_IMPL, lad_capture_attention)
    AttentionMaskInterface.register(CAPTURE_IMPL, sdpa_mask)
