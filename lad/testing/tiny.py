"""Tiny random-init multimodal models of every architecture lad supports, for tests and benchmarks.

`build_tiny_model(arch, path)` writes a checkpoint folder (config, weights, tokenizer, processor,
chat template) that loads back through `from_pretrained` exactly like a hub checkpoint; nothing is
downloaded. The tokenizer is lad.testing.tokenizer's, made from a word list. `ARCHITECTURES` is
the builders' one table, a row per architecture. `TinySize` sets the shape; a benchmark can make
it realistic where the cost comes from (many decoder layers, hundreds of image tokens per image).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from lad.errors import BackendError
from lad.testing.tokenizer import build_tokenizer


@dataclass(frozen=True)
class TinySize:
    """Shape of a tiny model.

    text_layers, hidden, heads, kv_heads, intermediate: the language model's decoder.
    vision_layers, vision_hidden, vision_heads: the vision tower (its MLP is 2 * vision_hidden).
    patch: the vision patch side; image_side: the side (pixels) every image is resized to.
    max_positions: context length; sliding_window: Gemma3's local layers (small, so tests see it).
    """

    text_layers: int = 2
    hidden: int = 32
    heads: int = 4
    kv_heads: int = 2
    intermediate: int = 64
    vision_layers: int = 2
    vision_hidden: int = 32
    vision_heads: int = 2
    patch: int = 14
    image_side: int = 56
    max_positions: int = 8192
    sliding_window: int = 32


@dataclass(frozen=True)
class _Arch:
    """What it takes to build one architecture: tokens, chat template, config, processor."""

    special_tokens: dict[str, str]
    extra_special: tuple[str, ...]
    chat_template: str
    config: Callable[[Any, TinySize], Any]  # (tokenizer, size) -> model config
    processor: Callable[[Any, TinySize, str], Any]  # (tokenizer, size, chat template)
    model_class: str
    tokenizer_attrs: dict[str, str] = field(default_factory=dict)


def _content(image: str, text: str = "{{ c['text'] }}") -> str:
    """Jinja: a message's content, string or list of {"type": "image"|"text"} parts, in order."""
    return (
        "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
        "{% for c in message['content'] %}{% if c['type'] == 'image' %}" + image + "{% elif "
        "c['type'] == 'text' %}" + text + "{% endif %}{% endfor %}{% endif %}"
    )


def _chatml(image: str, system: bool = True) -> str:
    head = (
        "{% if loop.first and message['role'] != 'system' %}<|im_start|>system\n"
        "You are a helpful assistant.<|im_end|>\n{% endif %}"
        if system
        else ""
    )
    return (
        "{% for message in messages %}"
        + head
        + "<|im_start|>{{ message['role'] }}\n"
        + _content(image)
        + "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )


_CHATML = {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}


def _text_kwargs(tok: Any, s: TinySize) -> dict[str, Any]:
    return {
        "vocab_size": len(tok),
        "hidden_size": s.hidden,
        "intermediate_size": s.intermediate,
        "num_hidden_layers": s.text_layers,
        "num_attention_heads": s.heads,
        "num_key_value_heads": s.kv_heads,
        "max_position_embeddings": s.max_positions,
        "pad_token_id": tok.pad_token_id,
        "eos_token_id": tok.eos_token_id,
        "bos_token_id": tok.bos_token_id,
    }


def _vision_kwargs(s: TinySize) -> dict[str, Any]:
    """The vision tower's config arguments that every ViT-style tower takes."""
    return {
        "hidden_size": s.vision_hidden,
        "intermediate_size": 2 * s.vision_hidden,
        "num_hidden_layers": s.vision_layers,
        "num_attention_heads": s.vision_heads,
        "image_size": s.image_side,
        "patch_size": s.patch,
    }


def _llava_config(tok: Any, s: TinySize) -> Any:
    from transformers import CLIPVisionConfig, LlamaConfig, LlavaConfig

    vision = CLIPVisionConfig(**_vision_kwargs(s), projection_dim=s.vision_hidden)
    return LlavaConfig(
        vision_config=vision,
        text_config=LlamaConfig(**_text_kwargs(tok, s)),
        image_token_id=tok.convert_tokens_to_ids("<image>"),
        vision_feature_layer=-1,
        vision_feature_select_strategy="default",
    )


def _llava_processor(tok: Any, s: TinySize, template: str) -> Any:
    from transformers import CLIPImageProcessor, LlavaProcessor

    images = CLIPImageProcessor(
        size={"shortest_edge": s.image_side},
        crop_size={"height": s.image_side, "width": s.image_side},
    )
    return LlavaProcessor(
        image_processor=images,
        tokenizer=tok,
        patch_size=s.patch,
        vision_feature_select_strategy="default",
        num_additional_image_tokens=1,
        chat_template=template,
    )


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
            **_text_kwargs(tok, s),
            "rope_parameters": {
                "rope_type": "default",
                "rope_theta": 10000.0,
                "mrope_section": section,
            },
        }
        ids = {
            name: tok.convert_tokens_to_ids(token)
            for name, token in (
                ("image_token_id", "<|image_pad|>"),
                ("video_token_id", "<|video_pad|>"),
                ("vision_start_token_id", "<|vision_start|>"),
                ("vision_end_token_id", "<|vision_end|>"),
            )
        }
        cls = Qwen2_5_VLConfig if v25 else Qwen2VLConfig
        return cls(text_config=text, vision_config=_qwen_vision(s, v25), **ids)

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


def _qwen(v25: bool, model_class: str) -> _Arch:
    """Qwen2-VL's row (Qwen2.5-VL's with `v25`): the same tokens and template."""
    return _Arch(
        special_tokens=_CHATML,
        extra_special=(
            "<|im_start|>",
            "<|vision_start|>",
            "<|vision_end|>",
            "<|image_pad|>",
            "<|video_pad|>",
        ),
        chat_template=_chatml("<|vision_start|><|image_pad|><|vision_end|>"),
        config=_qwen_config(v25),
        processor=_qwen_processor(v25),
        model_class=model_class,
    )


def _siglip(s: TinySize) -> Any:
    from transformers import SiglipVisionConfig

    return SiglipVisionConfig(**_vision_kwargs(s))


def _qwen2_text(tok: Any, s: TinySize) -> Any:
    from transformers import Qwen2Config

    return Qwen2Config(**_text_kwargs(tok, s))


def _onevision_config(tok: Any, s: TinySize) -> Any:
    from transformers import LlavaOnevisionConfig

    return LlavaOnevisionConfig(
        vision_config=_siglip(s),
        text_config=_qwen2_text(tok, s),
        image_token_index=tok.convert_tokens_to_ids("<image>"),
        video_token_index=tok.convert_tokens_to_ids("<video>"),
        vision_feature_select_strategy="full",
        vision_feature_layer=-1,
        image_grid_pinpoints=[[s.image_side, s.image_side]],
    )


def _onevision_processor(tok: Any, s: TinySize, template: str) -> Any:
    from transformers import (
        LlavaOnevisionImageProcessor,
        LlavaOnevisionProcessor,
        LlavaOnevisionVideoProcessor,
    )

    side = {"height": s.image_side, "width": s.image_side}
    grid = [[s.image_side, s.image_side]]
    return LlavaOnevisionProcessor(
        image_processor=LlavaOnevisionImageProcessor(size=side, image_grid_pinpoints=grid),
        video_processor=LlavaOnevisionVideoProcessor(size=side),
        tokenizer=tok,
        num_image_tokens=(s.image_side // s.patch) ** 2,
        vision_feature_select_strategy="full",
        chat_template=template,
    )


def _internvl_config(tok: Any, s: TinySize) -> Any:
    from transformers import InternVLConfig, InternVLVisionConfig

    square = {"image_size": (s.image_side, s.image_side), "patch_size": (s.patch, s.patch)}
    vision = InternVLVisionConfig(**{**_vision_kwargs(s), **square})
    return InternVLConfig(
        vision_config=vision,
        text_config=_qwen2_text(tok, s),
        image_token_id=tok.convert_tokens_to_ids("<IMG_CONTEXT>"),
        image_seq_length=(s.image_side // s.patch) ** 2 // 4,
        downsample_ratio=0.5,
    )


def _internvl_processor(tok: Any, s: TinySize, template: str) -> Any:
    from transformers import GotOcr2ImageProcessor, InternVLProcessor, InternVLVideoProcessor

    side = {"height": s.image_side, "width": s.image_side}
    return InternVLProcessor(
        image_processor=GotOcr2ImageProcessor(size=side, crop_to_patches=True, max_patches=4),
        video_processor=InternVLVideoProcessor(size=side),
        tokenizer=tok,
        image_seq_length=(s.image_side // s.patch) ** 2 // 4,
        chat_template=template,
    )


def _idefics3_config(tok: Any, s: TinySize) -> Any:
    from transformers import Idefics3Config, Idefics3VisionConfig, LlamaConfig

    vision = Idefics3VisionConfig(**_vision_kwargs(s))
    return Idefics3Config(
        vision_config=vision,
        text_config=LlamaConfig(**_text_kwargs(tok, s)),
        image_token_id=tok.convert_tokens_to_ids("<image>"),
        scale_factor=2,
    )


def _idefics3_processor(tok: Any, s: TinySize, template: str) -> Any:
    from transformers import Idefics3ImageProcessor, Idefics3Processor

    edge = {"longest_edge": s.image_side}
    images = Idefics3ImageProcessor(
        size={"longest_edge": 2 * s.image_side}, max_image_size=edge, do_image_splitting=True
    )
    return Idefics3Processor(
        image_processor=images,
        tokenizer=tok,
        image_seq_len=(s.image_side // s.patch) ** 2 // 4,
        chat_template=template,
    )


def _gemma3_config(tok: Any, s: TinySize) -> Any:
    from transformers import Gemma3Config, Gemma3TextConfig

    head_dim = s.hidden // s.heads
    text = Gemma3TextConfig(
        **_text_kwargs(tok, s),
        head_dim=head_dim,
        query_pre_attn_scalar=head_dim,
        sliding_window=s.sliding_window,
    )
    return Gemma3Config(
        text_config=text,
        vision_config=_siglip(s),
        mm_tokens_per_image=(s.image_side // s.patch // 2) ** 2,
        boi_token_index=tok.convert_tokens_to_ids("<start_of_image>"),
        eoi_token_index=tok.convert_tokens_to_ids("<end_of_image>"),
        image_token_index=tok.convert_tokens_to_ids("<image_soft_token>"),
    )


def _gemma3_processor(tok: Any, s: TinySize, template: str) -> Any:
    from transformers import Gemma3ImageProcessor, Gemma3Processor

    side = {"height": s.image_side, "width": s.image_side}
    return Gemma3Processor(
        image_processor=Gemma3ImageProcessor(size=side),
        tokenizer=tok,
        image_seq_length=(s.image_side // s.patch // 2) ** 2,
        chat_template=template,
    )


# The builders' table: one row per architecture lad supports (lad.backends.archs.ARCHS).
ARCHITECTURES: dict[str, _Arch] = {
    "llava": _Arch(
        special_tokens={
            "bos_token": "<s>",
            "eos_token": "</s>",
            "unk_token": "<unk>",
            "pad_token": "<pad>",
        },
        extra_special=("<image>",),
        chat_template=(
            "{% for message in messages %}{% if message['role'] != 'system' %}"
            "{{ message['role'].upper() + ': ' }}{% endif %}"
            + _content("<image>\n", "{{ c['text'] + ' ' }}")
            + "{% if message['role'] == 'assistant' %}</s>{% endif %}{% endfor %}"
            "{% if add_generation_prompt %}ASSISTANT:{% endif %}"
        ),
        config=_llava_config,
        processor=_llava_processor,
        model_class="LlavaForConditionalGeneration",
    ),
    "qwen2_vl": _qwen(False, "Qwen2VLForConditionalGeneration"),
    "qwen2_5_vl": _qwen(True, "Qwen2_5_VLForConditionalGeneration"),
    "llava_onevision": _Arch(
        special_tokens=_CHATML,
        extra_special=("<|im_start|>", "<image>", "<video>"),
        chat_template=_chatml("<image>"),
        config=_onevision_config,
        processor=_onevision_processor,
        model_class="LlavaOnevisionForConditionalGeneration",
    ),
    "internvl": _Arch(
        special_tokens=_CHATML,
        extra_special=("<|im_start|>", "<img>", "</img>", "<IMG_CONTEXT>", "<video>"),
        chat_template=_chatml("<IMG_CONTEXT>\n"),
        config=_internvl_config,
        processor=_internvl_processor,
        model_class="InternVLForConditionalGeneration",
        tokenizer_attrs={
            "start_image_token": "<img>",
            "end_image_token": "</img>",
            "context_image_token": "<IMG_CONTEXT>",
            "video_token": "<video>",
        },
    ),
    "idefics3": _Arch(
        special_tokens={"eos_token": "<end_of_utterance>", "pad_token": "<|endoftext|>"},
        extra_special=(
            "<|im_start|>",
            "<fake_token_around_image>",
            "<image>",
            "<global-img>",
            *(f"<row_{r}_col_{c}>" for r in range(1, 7) for c in range(1, 7)),
        ),
        chat_template=(
            "<|im_start|>{% for message in messages %}{{ message['role'] | capitalize }}:"
            + _content("<image>")
            + "<end_of_utterance>\n{% endfor %}{% if add_generation_prompt %}Assistant:{% endif %}"
        ),
        config=_idefics3_config,
        processor=_idefics3_processor,
        model_class="Idefics3ForConditionalGeneration",
    ),
    "gemma3": _Arch(
        special_tokens={"bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>"},
        extra_special=(
            "<start_of_turn>",
            "<end_of_turn>",
            "<start_of_image>",
            "<end_of_image>",
            "<image_soft_token>",
        ),
        chat_template=(
            "<bos>{% for message in messages %}<start_of_turn>"
            "{{ 'model' if message['role'] == 'assistant' else message['role'] }}\n"
            + _content("<start_of_image>")
            + "<end_of_turn>\n{% endfor %}"
            "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
        ),
        config=_gemma3_config,
        processor=_gemma3_processor,
        model_class="Gemma3ForConditionalGeneration",
        tokenizer_attrs={
            "boi_token": "<start_of_image>",
            "eoi_token": "<end_of_image>",
            "image_token": "<image_soft_token>",
        },
    ),
}


def build_tiny_model(
    arch: str,
    path: str | Path,
    *,
    size: TinySize | None = None,
    words: Iterable[str] = (),
    seed: int = 0,
) -> Path:
    """Write a random-init checkpoint of `arch` to `path`; load it with `from_pretrained(path)`.

    words: extra vocabulary (e.g. a benchmark's captions) learned as whole tokens.
    seed: the weights depend only on (arch, size, words, seed).
    """
    import transformers

    config, processor = build_tiny_parts(arch, size=size, words=words)
    path = Path(path)
    torch.manual_seed(seed)
    model = getattr(transformers, ARCHITECTURES[arch].model_class)(config).eval()
    model.save_pretrained(path)
    processor.save_pretrained(path)
    model.generation_config.save_pretrained(path)
    return path


def build_tiny_parts(
    arch: str, *, size: TinySize | None = None, words: Iterable[str] = ()
) -> tuple[Any, Any]:
    """The model config and the processor (tokenizer, chat template) of `arch`, nothing written.

    A benchmark can change the config's sizes to a real checkpoint's and instantiate the model
    in memory (`_from_config`); the token ids in the config match the processor's tokenizer.
    """
    if arch not in ARCHITECTURES:
        raise BackendError(
            f"The 'arch' parameter must be one of {sorted(ARCHITECTURES)}. Got {arch!r} instead."
        )
    spec = ARCHITECTURES[arch]
    size = size or TinySize()
    tok = build_tokenizer(spec.special_tokens, spec.extra_special, words, spec.tokenizer_attrs)
    return spec.config(tok, size), spec.processor(tok, size, spec.chat_template)
