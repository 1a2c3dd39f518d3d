"""Tiny Qwen-family builders for lad.testing.tiny: Qwen2-VL, Qwen2.5-VL, Qwen3-VL (interleaved
M-RoPE, DeepStack) and Qwen3.5 (hybrid: Gated DeltaNet layers, softmax attention every second
layer here; its template opens a think block)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from lad.testing.tiny_parts import CHATML, Builder, TinySize, chatml, content, text_kwargs


def _qwen_vision(s: TinySize, v25: bool) -> dict[str, Any]:
    common = {
        "depth": s.vision_layers,
        "hidden_size": s.hidden,  # output size after the patch merger
        "num_heads": s.vision_heads,
        "patch_size": s.patch,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
    }
    if v25:
        return {
            **common,
            "hidden_size": s.vision_hidden,
            "out_hidden_size": s.hidden,
            "intermediate_size": 2 * s.vision_hidden,
            "fullatt_block_indexes": [s.vision_layers - 1],
            "window_size": 2 * s.patch * 2,
        }
    return {**common, "embed_dim": s.vision_hidden, "mlp_ratio": 2}


def _qwen_config(v25: bool) -> Callable[[Any, TinySize], Any]:
    def build(tok: Any, s: TinySize) -> Any:
        from transformers import Qwen2_5_VLConfig, Qwen2VLConfig

        half = s.hidden // s.heads // 2
        t = half // 4
        section = [half - 2 * t, t, t]
        text = {
            **text_kwargs(tok, s),
            "rope_parameters": {
                "rope_type": "default",
                "rope_theta": 10000.0,
                "mrope_section": section,
            },
        }
        cls = Qwen2_5_VLConfig if v25 else Qwen2VLConfig
        return cls(text_config=text, vision_config=_qwen_vision(s, v25), **_ids(tok))

    return build


def _qwen_processor(v25: bool) -> Callable[[Any, TinySize, str], Any]:
    def build(tok: Any, s: TinySize, template: str) -> Any:
        from transformers import (
            Qwen2_5_VLProcessor,
            Qwen2VLImageProcessor,
            Qwen2VLProcessor,
            Qwen2VLVideoProcessor,
        )

        pixels = s.image_side * s.image_side
        kw = {"min_pixels": pixels, "max_pixels": pixels, "patch_size": s.patch}
        images = Qwen2VLImageProcessor(**kw, merge_size=2, temporal_patch_size=2)
        video = Qwen2VLVideoProcessor(**kw, merge_size=2, temporal_patch_size=2)
        cls = Qwen2_5_VLProcessor if v25 else Qwen2VLProcessor
        return cls(
            image_processor=images, tokenizer=tok, video_processor=video, chat_template=template
        )

    return build


def _qwen(v25: bool, model_class: str) -> Builder:
    """Qwen2-VL's row (Qwen2.5-VL's with `v25`): the same tokens and template."""
    return Builder(
        special_tokens=CHATML,
        extra_special=(
            "<|im_start|>",
            "<|vision_start|>",
            "<|vision_end|>",
            "<|image_pad|>",
            "<|video_pad|>",
        ),
        chat_template=chatml("<|vision_start|><|image_pad|><|vision_end|>"),
        config=_qwen_config(v25),
        processor=_qwen_processor(v25),
        model_class=model_class,
    )


def _ids(tok: Any) -> dict[str, int]:
    """A Qwen config's special token ids, from the tokenizer."""
    return {
        name: tok.convert_tokens_to_ids(token)
        for name, token in (
            ("image_token_id", "<|image_pad|>"),
            ("video_token_id", "<|video_pad|>"),
            ("vision_start_token_id", "<|vision_start|>"),
            ("vision_end_token_id", "<|vision_end|>"),
        )
    }


def _qwen3_text(tok: Any, s: TinySize, rotary: float = 1.0) -> dict[str, Any]:
    """Qwen3-VL / Qwen3.5 text arguments: interleaved M-RoPE over a rotary part of each head."""
    head = s.hidden // s.heads
    half = int(head * rotary) // 2
    t = half // 4
    section = [half - 2 * t, t, t]
    rope = {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": section}
    rope |= {"mrope_interleaved": True}
    if rotary != 1.0:
        rope["partial_rotary_factor"] = rotary
    return {**text_kwargs(tok, s), "head_dim": head, "rope_parameters": rope}


def _qwen3_vision(s: TinySize, deepstack: list[int]) -> dict[str, Any]:
    return {
        "depth": s.vision_layers,
        "hidden_size": s.vision_hidden,
        "intermediate_size": 2 * s.vision_hidden,
        "num_heads": s.vision_heads,
        "out_hidden_size": s.hidden,
        "patch_size": s.patch,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
        "num_position_embeddings": 16,  # a 4 x 4 grid, interpolated to each picture's
        "deepstack_visual_indexes": deepstack,
    }


def _qwen3vl_config(tok: Any, s: TinySize) -> Any:
    from transformers import Qwen3VLConfig

    # DeepStack: the vision tower's first block feeds the first decoder layer.
    vision = _qwen3_vision(s, [0])
    return Qwen3VLConfig(text_config=_qwen3_text(tok, s), vision_config=vision, **_ids(tok))


def _qwen3_5_config(tok: Any, s: TinySize) -> Any:
    from transformers import Qwen3_5Config

    # Hybrid: a Gated DeltaNet layer before each of `text_layers` softmax attention layers (the
    # real model: three before each), so L counts softmax layers as in every other builder.
    text = {
        **_qwen3_text(tok, s, rotary=0.5),
        "num_hidden_layers": 2 * s.text_layers,
        "layer_types": ["linear_attention", "full_attention"] * s.text_layers,
        "linear_num_key_heads": s.kv_heads,
        "linear_num_value_heads": s.heads,
        "linear_key_head_dim": s.hidden // s.heads,
        "linear_value_head_dim": s.hidden // s.heads,
    }
    return Qwen3_5Config(text_config=text, vision_config=_qwen3_vision(s, []), **_ids(tok))


def _qwen3_processor(tok: Any, s: TinySize, template: str) -> Any:
    from transformers import Qwen2VLImageProcessor, Qwen3VLProcessor, Qwen3VLVideoProcessor

    pixels = s.image_side * s.image_side
    size = {"shortest_edge": pixels, "longest_edge": pixels}
    kw = {"size": size, "patch_size": s.patch, "merge_size": 2, "temporal_patch_size": 2}
    return Qwen3VLProcessor(
        image_processor=Qwen2VLImageProcessor(**kw),
        tokenizer=tok,
        video_processor=Qwen3VLVideoProcessor(**kw),
        chat_template=template,
    )


# Qwen3.5's template: the generation prompt opens a think block, a reply closes an empty one.
_THINK = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['role'] == 'assistant' %}<think>\n\n</think>\n\n{% endif %}"
    + content("<|vision_start|><|image_pad|><|vision_end|>")
    + "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n<think>\n"
    "{% endif %}"
)
_QWEN_TOKENS = ("<|im_start|>", "<|vision_start|>", "<|vision_end|>", "<|image_pad|>")


def _qwen3(
    template: str, config: Callable[[Any, TinySize], Any], model_class: str, byte_level: bool
) -> Builder:
    """Qwen3-VL's row, or Qwen3.5's: transformers rebuilds a qwen3_5 tokenizer from its
    vocabulary and merges (Qwen3_5Tokenizer), so it gets a byte-level BPE one."""
    return Builder(
        byte_level=byte_level,
        special_tokens=CHATML,
        extra_special=(*_QWEN_TOKENS, "<|video_pad|>", "<think>", "</think>"),
        chat_template=template,
        config=config,
        processor=_qwen3_processor,
        model_class=model_class,
    )


QWEN: dict[str, Builder] = {
    "qwen2_vl": _qwen(False, "Qwen2VLForConditionalGeneration"),
    "qwen2_5_vl": _qwen(True, "Qwen2_5_VLForConditionalGeneration"),
    "qwen3_vl": _qwen3(
        chatml("<|vision_start|><|image_pad|><|vision_end|>", system=False),
        _qwen3vl_config,
        "Qwen3VLForConditionalGeneration",
        byte_level=False,
    ),
    "qwen3_5": _qwen3(_THINK, _qwen3_5_config, "Qwen3_5ForConditionalGeneration", True),
}
