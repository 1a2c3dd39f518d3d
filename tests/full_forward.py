"""What the tests' no-cache references share: a prompt's processor inputs with tokens appended."""

from __future__ import annotations

from typing import Any

import torch


def extend_inputs(inputs: dict[str, Any], tokens: list[int]) -> dict[str, Any]:
    """`inputs` (one prompt) with `tokens` appended: to input_ids, a 1 per token to the attention
    mask, 0 (text) to every other per-token row (token_type_ids, mm_token_type_ids)."""
    out = dict(inputs)
    for key, value in inputs.items():
        if torch.is_tensor(value) and value.dim() == 2 and value.shape == inputs["input_ids"].shape:
            fill = torch.tensor([tokens]) if key == "input_ids" else None
            if fill is None:
                fill = torch.full((1, len(tokens)), int(key == "attention_mask"))
            out[key] = torch.cat([value, fill.to(value.dtype)], dim=1)
    return out
