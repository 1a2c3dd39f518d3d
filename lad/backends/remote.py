"""Models whose code ships with the checkpoint (config.json `auto_map`, `trust_remote_code`):
how lad calls a forward it did not write, and the capture that works on it.

Such code is written for the transformers of its day (LLaVA-OneVision-1.5's for 4.53.1) and runs
in an environment that has it (docs/backends.md, "Remote code"). There lad loads only these
models: its built-in rows need transformers 5 (`check_transformers`). Their decoders call
`torch.nn.functional.scaled_dot_product_attention` themselves, not transformers' attention
interface, so the capture wraps that function for the span of each decoder attention module's
forward (`install`): it sees q and k after RoPE, and the mask, and computes the captured row
with lad.backends.capture.last_row_attention (O(T) per layer), the output still from SDPA.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any

import torch

from lad.backends import capture as cap
from lad.errors import BackendError

NEEDED = "5.0"  # the transformers release lad's built-in architectures need


def transformers_major() -> int:
    import transformers

    return int(transformers.__version__.split(".")[0])


def check_transformers(arch: Any, model: str) -> None:
    """Under transformers 4.x only remote-code rows load (their code needs it); a built-in
    architecture is refused in one line, before any weight."""
    if transformers_major() >= 5 or arch.remote_code:
        return
    import transformers

    raise BackendError(
        f"{model}: lad's support for {arch.name} needs transformers>={NEEDED}; this environment "
        f"has {transformers.__version__}, in which lad loads only remote-code models "
        "(LLaVA-OneVision-1.5: docs/backends.md, 'Remote code')"
    )


def dtype_argument(dtype: torch.dtype) -> dict[str, torch.dtype]:
    """from_pretrained's dtype keyword: `dtype` in transformers 5, `torch_dtype` before (where
    `dtype` would be taken for a config attribute and the weights loaded in float32)."""
    return {"dtype" if transformers_major() >= 5 else "torch_dtype": dtype}


@dataclass(frozen=True)
class Forward:
    """What a model's forward is called with: the name of its cache argument and output field
    (`cache` in transformers 5, `past_key_values` in code written before), and whether it takes
    `logits_to_keep` (else the output head is given the last positions' hidden states only)."""

    cache_name: str
    keeps_logits: bool

    @classmethod
    def of(cls, model: Any) -> Forward:
        params = inspect.signature(model.forward).parameters
        name = "cache" if "cache" in params else "past_key_values"
        return cls(name, "logits_to_keep" in params)

    def cache(self, value: Any) -> dict[str, Any]:
        """The cache keyword argument of a decoding step."""
        return {self.cache_name: value}

    def cache_of(self, out: Any) -> Any:
        return getattr(out, self.cache_name)

    def last_logits(self, model: Any, kwargs: dict[str, Any], keep: int) -> Any:
        """A context in which the model's forward computes logits of the last `keep` positions
        only (O(keep·V), not O(T·V)): `logits_to_keep`, or a pre-hook on its output head."""
        if self.keeps_logits:
            kwargs["logits_to_keep"] = keep
            return nullcontext()
        return _head_sees_last(model.get_output_embeddings(), keep)


@contextmanager
def _head_sees_last(head: torch.nn.Module, keep: int) -> Iterator[None]:
    handle = head.register_forward_pre_hook(lambda _m, args: (args[0][:, -keep:], *args[1:]))
    try:
        yield
    finally:
        handle.remove()


# --------------------------------------------------------------------------- capture


class _Layer:
    """The decoder attention module whose forward is running (None outside of one)."""

    index: int | None = None
    calls = 0


_sdpa = torch.nn.functional.scaled_dot_product_attention


def _capturing_sdpa(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    **kwargs: Any,
) -> torch.Tensor:
    """SDPA, and inside a decoder attention module's forward while a Capture is active, the row
    lad captures (lad.backends.capture.last_row_attention) from the same q, k and mask."""
    layer = _Layer.index
    if layer is not None and cap._active:
        _Layer.calls += 1
        c = cap._active[-1]
        if attn_mask is None and not is_causal and query.shape[2] > 1:
            raise BackendError(
                f"decoder layer {layer} attends without a causal mask; lad's capture of remote "
                "code expects a causal decoder"
            )
        scaling = scale if scale is not None else query.shape[-1] ** -0.5
        c.rows[layer] = cap.last_row_attention(query, key, attn_mask, scaling, None, c.offset)
    return _sdpa(
        query, key, value, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal,
        scale=scale, **kwargs,
    )  # fmt: skip


def _enter(module: torch.nn.Module, _args: Any) -> None:
    _Layer.index, _Layer.calls = module.layer_idx, 0
    torch.nn.functional.scaled_dot_product_attention = _capturing_sdpa


def _leave(module: torch.nn.Module, _args: Any, _out: Any) -> None:
    torch.nn.functional.scaled_dot_product_attention = _sdpa
    calls, _Layer.index, _Layer.calls = _Layer.calls, None, 0
    if calls > 1:
        raise BackendError(
            f"decoder layer {module.layer_idx} called scaled_dot_product_attention {calls} "
            "times in one forward; lad's capture of remote code expects one call"
        )


def decoder_attention(model: Any) -> list[torch.nn.Module]:
    """The language decoder's attention modules: those of the text config's layer count that
    carry a `layer_idx` and project keys (`k_proj`), in layer order."""
    found = [
        m
        for m in model.modules()
        if isinstance(getattr(m, "layer_idx", None), int) and hasattr(m, "k_proj")
    ]
    count = model.config.get_text_config().num_hidden_layers
    if sorted(m.layer_idx for m in found) != list(range(count)):
        raise BackendError(
            f"model_type {model.config.model_type!r}: lad cannot find its {count} decoder "
            "attention modules (modules with layer_idx and k_proj), so it cannot capture their "
            "attention"
        )
    return sorted(found, key=lambda m: m.layer_idx)


def install(model: Any) -> None:
    """Capture the decoder's attention through SDPA, wrapped while each of its attention
    modules runs (the wrapper is removed when it returns or raises); each prompt's pictures
    through the vision tower on their own (`_PerPrompt`)."""
    for module in decoder_attention(model):
        module.register_forward_pre_hook(_enter)
        module.register_forward_hook(_leave, always_call=True)
    visual = getattr(model, "visual", None)
    if isinstance(visual, torch.nn.Module):
        _PerPrompt(model, visual)


class _PerPrompt:
    """The vision tower called once per prompt of a batch, on that prompt's pictures only, as
    the prompt alone would call it. LLaVA-OneVision-1.5's RICE-ViT puts a class token before
    each picture and, taking them out again, offsets every picture by one token only, so a
    picture's features shift with the pictures before it in the call (checked on the published
    code): one call per prompt keeps a batch's records those of each prompt alone. The prompts'
    picture counts come from their image tokens (a forward pre-hook on the model)."""

    def __init__(self, model: Any, visual: torch.nn.Module) -> None:
        self.forward, self.merge = visual.forward, visual.spatial_merge_size
        self.image_token = model.config.image_token_id
        self.tokens: list[int] = []  # image tokens per prompt of the running forward
        model.register_forward_pre_hook(self.prompts, with_kwargs=True)
        visual.forward = self.per_prompt

    def prompts(self, _model: Any, args: Any, kwargs: dict[str, Any]) -> None:
        ids = kwargs.get("input_ids", args[0] if args else None)
        self.tokens = [] if ids is None else (ids == self.image_token).sum(-1).tolist()

    def per_prompt(self, pixels: torch.Tensor, grid_thw: torch.Tensor, **kwargs: Any) -> Any:
        sizes = grid_thw.prod(-1).tolist()  # patches per picture
        groups, taken, exact = [], 0, True  # each prompt's pictures: [first, last)
        for tokens in (t for t in self.tokens if t):
            first = taken
            while tokens > 0 and taken < len(sizes):
                tokens -= sizes[taken] // self.merge**2
                taken += 1
            groups.append((first, taken))
            exact = exact and tokens == 0
        if len(groups) < 2 or taken != len(sizes) or not exact:  # one prompt, or not known
            return self.forward(pixels, grid_thw=grid_thw, **kwargs)
        starts = [0, *torch.tensor(sizes).cumsum(0).tolist()]
        return torch.cat([
            self.forward(pixels[starts[a] : starts[b]], grid_thw=grid_thw[a:b], **kwargs)
            for a, b in groups
        ])  # fmt: skip
