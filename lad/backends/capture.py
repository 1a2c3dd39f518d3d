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

from lad.errors import BackendError

CAPTURE_IMPL = "lad_capture"


class Capture:
    """Rows captured during one forward: layer index -> (B, T_kv) head-averaged attention.

    offset: tokens appended after the prompt in the same forward; the captured query is the one
    `offset` places before the end, and keys after it are left out (causal).
    """

    def __init__(self, offset: int = 0) -> None:
        self.rows: dict[int, torch.Tensor] = {}
        self.offset = offset
        # Every layer of a kind gets the same mask tensor: its last row, as an additive bias,
        # is made once per forward. Entries keep the mask alive, so its id stays its own.
        self._biases: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def bias(
        self, mask: torch.Tensor | None, query: torch.Tensor, key: torch.Tensor
    ) -> torch.Tensor | None:
        """`mask_bias` of the captured query's row (None without a mask), made once per mask."""
        if mask is None:
            return None
        entry = self._biases.get(id(mask))
        if entry is None or entry[0] is not mask:
            row, t_kv = query.shape[2] - 1 - self.offset, key.shape[2] - self.offset
            entry = (mask, mask_bias(mask, row, t_kv, key.shape[0], key.shape[1]))
            self._biases[id(mask)] = entry
        return entry[1]


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


def mask_bias(mask: torch.Tensor, row: int, t_kv: int, b: int, h_kv: int) -> torch.Tensor:
    """Row `row` of an attention mask (bool, True = attend; or additive float) over the first
    t_kv keys, as an additive float32 bias for every KV head: (B*H_kv, 1, T_kv)."""
    last = mask[:, :, row, :t_kv]  # (B or 1, 1, T_kv)
    if last.dtype == torch.bool:
        bias = torch.zeros(last.shape, dtype=torch.float32, device=last.device)
        bias = bias.masked_fill_(~last, float("-inf"))
    else:
        bias = last.float()
    return bias.expand(b, h_kv, t_kv).reshape(b * h_kv, 1, t_kv)


def last_row_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    mask: torch.Tensor | None,
    scaling: float,
    softcap: float | None = None,
    offset: int = 0,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """Head-averaged attention of query row q-1-offset onto keys, in float32: (B, T_kv - offset).

    query (B, H, q, D); key (B, H_kv, T_kv, D); mask None (causal: the row sees every key up to
    its own), bool (B, 1, q, T_kv) with True = attend, or additive float of the same shape.
    bias: `mask_bias` of `mask`, when the caller made it already (once for all layers).
    This runs once per decoder layer inside the forward, so it is a few kernels (in bfloat16:
    two float32 copies, one matmul that also scales and masks, softmax, mean) and never reads a
    value back to the host.
    """
    b, h, q_len, d = query.shape
    h_kv, t_kv = key.shape[1], key.shape[2] - offset
    row = q_len - 1 - offset
    q = _float32(query[:, :, row, :]).reshape(b * h_kv, h // h_kv, d)  # (B*H_kv, G, D)
    keys = _float32(key[:, :, :t_kv, :]).reshape(b * h_kv, t_kv, d).mT  # (B*H_kv, D, T_kv)
    if mask is not None and bias is None:
        bias = mask_bias(mask, row, t_kv, b, h_kv)
    if softcap is not None:
        scores = torch.tanh(torch.bmm(q, keys) * (scaling / softcap)) * softcap
        scores = scores if bias is None else scores + bias
    elif bias is None:  # beta=0: the input is ignored; alpha folds the scaling in
        scores = torch.baddbmm(q.new_empty(()), q, keys, beta=0, alpha=scaling)
    else:
        scores = torch.baddbmm(bias, q, keys, alpha=scaling)  # (B*H_kv, G, T_kv)
    return scores.view(b, h, t_kv).softmax(dim=-1).mean(dim=1)  # (B, T_kv)


def _float32(x: torch.Tensor) -> torch.Tensor:
    """`x` in float32; a conversion is made contiguous in the same kernel, so the reshapes to
    (B*H_kv, ...) above are views (a float32 input is copied by them only where it must be)."""
    if x.dtype == torch.float32:
        return x
    return x.to(torch.float32, memory_format=torch.contiguous_format)


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
        bias = c.bias(attention_mask, query, key)
        c.rows[module.layer_idx] = last_row_attention(
            query, key, attention_mask, scale, kwargs.get("softcap"), c.offset, bias
        )
    return sdpa_attention_forward(
        module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
    )


def register(name: str = CAPTURE_IMPL, attention: Any = None, mask: Any = None) -> None:
    """Make `attn_implementation=name` available (idempotent): `attention` (lad_capture_attention
    by default) with its mask builder (`mask`; transformers' sdpa_mask by default)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(name, attention or lad_capture_attention)
    AttentionMaskInterface.register(name, mask or sdpa_mask)


def stack_rows(
    rows: dict[int, torch.Tensor], layers: list[int], device: torch.device, config: Any
) -> torch.Tensor:
    """A forward's captured rows of the decoder layers `layers` (those with softmax attention),
    stacked (B, L, T) on `device`; a layer missing (or one more) is a BackendError naming the
    model type of `config` (the loaded model's)."""
    if sorted(rows) != layers:
        impl = config.get_text_config()._attn_implementation
        raise BackendError(
            f"model_type {config.model_type!r}: lad cannot capture its attention: the capture "
            f"saw decoder layers {sorted(rows)} of its softmax-attention layers {layers}, so "
            f"its decoder's attention (implementation {impl!r}) does not go through "
            f"transformers' AttentionInterface as text_config={CAPTURE_IMPL!r}"
        )
    # Layers may sit on several GPUs (device_map): gather the rows on the input device.
    return torch.stack([rows[i].to(device) for i in layers], dim=1)


def eager_rows(attentions: Any, layers: list[int], offset: int = 0) -> torch.Tensor:
    """The reference capture: the last prompt query's row, head-averaged, from eager
    `output_attentions` (one map per softmax-attention layer, in order: a hybrid model's tuple
    index is not its layer index), `offset` appended tokens left out: (B, L, T)."""
    if attentions is None or len(attentions) != len(layers) or None in attentions:
        got = "none" if attentions is None else f"{len(attentions)} maps"
        raise BackendError(
            f"eager output_attentions gave {got} for the {len(layers)} softmax attention "
            "layers; use capture='fast', which does not depend on it"
        )
    t = attentions[0].shape[-1] - offset
    return torch.stack([a[:, :, t - 1, :t].float().mean(1) for a in attentions], 1)


def evidence(rows: torch.Tensor, spans: list[tuple[int, int]]) -> torch.Tensor:
    """Eq. 6: attention rows (L, T) summed over each image's span -> (L, N), float64."""
    return torch.stack([rows[:, s:e].double().sum(-1) for s, e in spans], dim=1).cpu()
