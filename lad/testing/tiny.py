"""Tiny random-init multimodal models of every architecture lad supports, for tests and benchmarks.

`build_tiny_model(arch, path)` writes a checkpoint folder (config, weights, tokenizer, processor,
chat template) that loads back through `from_pretrained` exactly like a hub checkpoint; nothing is
downloaded. The tokenizer is lad.testing.tokenizer's, made from a word list. `ARCHITECTURES` is
the builders' one table, a row per architecture. `TinySize` sets the shape; a benchmark can make
it realistic where the cost comes from (many decoder layers, hundreds of image tokens per image).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch
import transformers

from lad.errors import BackendError, check_choice
from lad.testing.tiny_parts import (
    CHATML,
    Builder,
    TinySize,
    chatml,
    content,
    text_kwargs,
    vision_kwargs,
)
from lad.testing.tiny_qwen import QWEN
from lad.testing.tokenizer import build_byte_level_tokenizer, build_tokenizer

__all__ = ["ARCHITECTURES", "TinySize", "build_tiny_model", "build_tiny_parts"]


def _llava_config(tok: Any, s: TinySize) -> Any:
    vision = transformers.CLIPVisionConfig(**vision_kwargs(s), projection_dim=s.vision_hidden)
    return transformers.LlavaConfig(
        vision_config=vision,
        text_config=transformers.LlamaConfig(**text_kwargs(tok, s)),
        image_token_id=tok.convert_tokens_to_ids("<image>"),
        vision_feature_layer=-1,
        vision_feature_select_strategy="default",
    )


def _llava_processor(tok: Any, s: TinySize, template: str) -> Any:
    images = transformers.CLIPImageProcessor(
        size={"shortest_edge": s.image_side}, crop_size=s.square
    )
    return transformers.LlavaProcessor(
        image_processor=images,
        tokenizer=tok,
        patch_size=s.patch,
        vision_feature_select_strategy="default",
        num_additional_image_tokens=1,
        chat_template=template,
    )


def _onevision_config(tok: Any, s: TinySize) -> Any:
    return transformers.LlavaOnevisionConfig(
        vision_config=transformers.SiglipVisionConfig(**vision_kwargs(s)),
        text_config=transformers.Qwen2Config(**text_kwargs(tok, s)),
        image_token_index=tok.convert_tokens_to_ids("<image>"),
        video_token_index=tok.convert_tokens_to_ids("<video>"),
        vision_feature_select_strategy="full",
        vision_feature_layer=-1,
        image_grid_pinpoints=[[s.image_side, s.image_side]],
    )


def _onevision_processor(tok: Any, s: TinySize, template: str) -> Any:
    grid = [[s.image_side, s.image_side]]
    return transformers.LlavaOnevisionProcessor(
        image_processor=transformers.LlavaOnevisionImageProcessor(
            size=s.square, image_grid_pinpoints=grid
        ),
        video_processor=transformers.LlavaOnevisionVideoProcessor(size=s.square),
        tokenizer=tok,
        num_image_tokens=(s.image_side // s.patch) ** 2,
        vision_feature_select_strategy="full",
        chat_template=template,
    )


def _internvl_config(tok: Any, s: TinySize) -> Any:
    square = {"image_size": (s.image_side, s.image_side), "patch_size": (s.patch, s.patch)}
    vision = transformers.InternVLVisionConfig(**{**vision_kwargs(s), **square})
    return transformers.InternVLConfig(
        vision_config=vision,
        text_config=transformers.Qwen2Config(**text_kwargs(tok, s)),
        image_token_id=tok.convert_tokens_to_ids("<IMG_CONTEXT>"),
        image_seq_length=(s.image_side // s.patch) ** 2 // 4,
        downsample_ratio=0.5,
    )


def _internvl_processor(tok: Any, s: TinySize, template: str) -> Any:
    return transformers.InternVLProcessor(
        image_processor=transformers.GotOcr2ImageProcessor(
            size=s.square, crop_to_patches=True, max_patches=4
        ),
        video_processor=transformers.InternVLVideoProcessor(size=s.square),
        tokenizer=tok,
        image_seq_length=(s.image_side // s.patch) ** 2 // 4,
        chat_template=template,
    )


def _idefics3_config(tok: Any, s: TinySize) -> Any:
    vision = transformers.Idefics3VisionConfig(**vision_kwargs(s))
    return transformers.Idefics3Config(
        vision_config=vision,
        text_config=transformers.LlamaConfig(**text_kwargs(tok, s)),
        image_token_id=tok.convert_tokens_to_ids("<image>"),
        scale_factor=2,
    )


def _idefics3_processor(tok: Any, s: TinySize, template: str) -> Any:
    edge = {"longest_edge": s.image_side}
    images = transformers.Idefics3ImageProcessor(
        size={"longest_edge": 2 * s.image_side}, max_image_size=edge, do_image_splitting=True
    )
    return transformers.Idefics3Processor(
        image_processor=images,
        tokenizer=tok,
        image_seq_len=(s.image_side // s.patch) ** 2 // 4,
        chat_template=template,
    )


def _gemma3_config(tok: Any, s: TinySize) -> Any:
    head_dim = s.hidden // s.heads
    text = transformers.Gemma3TextConfig(
        **text_kwargs(tok, s),
        head_dim=head_dim,
        query_pre_attn_scalar=head_dim,
        sliding_window=s.sliding_window,
    )
    return transformers.Gemma3Config(
        text_config=text,
        vision_config=transformers.SiglipVisionConfig(**vision_kwargs(s)),
        mm_tokens_per_image=(s.image_side // s.patch // 2) ** 2,
        boi_token_index=tok.convert_tokens_to_ids("<start_of_image>"),
        eoi_token_index=tok.convert_tokens_to_ids("<end_of_image>"),
        image_token_index=tok.convert_tokens_to_ids("<image_soft_token>"),
    )


def _gemma3_processor(tok: Any, s: TinySize, template: str) -> Any:
    return transformers.Gemma3Processor(
        image_processor=transformers.Gemma3ImageProcessor(size=s.square),
        tokenizer=tok,
        image_seq_length=(s.image_side // s.patch // 2) ** 2,
        chat_template=template,
    )


# The builders' table: one row per architecture lad supports (lad.backends.archs.ARCHS).
ARCHITECTURES: dict[str, Builder] = {
    "llava": Builder(
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
            + content("<image>\n", "{{ c['text'] + ' ' }}")
            + "{% if message['role'] == 'assistant' %}</s>{% endif %}{% endfor %}"
            "{% if add_generation_prompt %}ASSISTANT:{% endif %}"
        ),
        config=_llava_config,
        processor=_llava_processor,
        model_class="LlavaForConditionalGeneration",
    ),
    **QWEN,
    "llava_onevision": Builder(
        special_tokens=CHATML,
        extra_special=("<|im_start|>", "<image>", "<video>"),
        chat_template=chatml("<image>"),
        config=_onevision_config,
        processor=_onevision_processor,
        model_class="LlavaOnevisionForConditionalGeneration",
    ),
    "internvl": Builder(
        special_tokens=CHATML,
        extra_special=("<|im_start|>", "<img>", "</img>", "<IMG_CONTEXT>", "<video>"),
        chat_template=chatml("<IMG_CONTEXT>\n"),
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
    "idefics3": Builder(
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
            + content("<image>")
            + "<end_of_utterance>\n{% endfor %}{% if add_generation_prompt %}Assistant:{% endif %}"
        ),
        config=_idefics3_config,
        processor=_idefics3_processor,
        model_class="Idefics3ForConditionalGeneration",
    ),
    "gemma3": Builder(
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
            + content("<start_of_image>")
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
    config, processor = build_tiny_parts(arch, size=size, words=words)
    return save_model(ARCHITECTURES[arch].model_class, config, path, seed, processor)


def save_model(model_class: str, config: Any, path: str | Path, seed: int, *parts: Any) -> Path:
    """A random-init transformers `model_class` of `config` (its weights set by `seed` alone)
    saved to `path` with its generation config and `parts` (a processor or tokenizer)."""
    torch.manual_seed(seed)
    model = getattr(transformers, model_class)(config).eval()
    path = Path(path)
    model.save_pretrained(path)
    for part in parts:
        part.save_pretrained(path)
    return path


def build_tiny_parts(
    arch: str, *, size: TinySize | None = None, words: Iterable[str] = ()
) -> tuple[Any, Any]:
    """The model config and the processor (tokenizer, chat template) of `arch`, nothing written.

    A benchmark can change the config's sizes to a real checkpoint's and instantiate the model
    in memory (`_from_config`); the token ids in the config match the processor's tokenizer.
    """
    check_choice("arch", arch, sorted(ARCHITECTURES), BackendError)
    spec = ARCHITECTURES[arch]
    size = size or TinySize()
    if spec.byte_level:
        tok = build_byte_level_tokenizer(spec.special_tokens, spec.extra_special, words)
    else:
        tok = build_tokenizer(spec.special_tokens, spec.extra_special, words, spec.tokenizer_attrs)
    return spec.config(tok, size), spec.processor(tok, size, spec.chat_template)
