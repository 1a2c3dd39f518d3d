"""What lad.testing.tiny's builders share: the size of a tiny model, a builder's row, chat
template pieces and the config arguments every decoder and ViT-style tower takes."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


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

    @property
    def square(self) -> dict[str, int]:
        return {"height": self.image_side, "width": self.image_side}


@dataclass(frozen=True)
class Builder:
    """What it takes to build one architecture: tokens, chat template, config, processor."""

    special_tokens: dict[str, str]
    extra_special: tuple[str, ...]
    chat_template: str
    config: Callable[[Any, TinySize], Any]  # (tokenizer, size) -> model config
    processor: Callable[[Any, TinySize, str], Any]  # (tokenizer, size, chat template)
    model_class: str
    tokenizer_attrs: dict[str, str] = field(default_factory=dict)
    byte_level: bool = False  # lad.testing.tokenizer.build_byte_level_tokenizer (Qwen3.5)


def content(image: str, text: str = "{{ c['text'] }}") -> str:
    """Jinja: a message's content, string or list of {"type": "image"|"text"} parts, in order."""
    return (
        "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
        "{% for c in message['content'] %}{% if c['type'] == 'image' %}" + image + "{% elif "
        "c['type'] == 'text' %}" + text + "{% endif %}{% endfor %}{% endif %}"
    )


def chatml(image: str | None, system: bool = True) -> str:
    """ChatML turns, `image` standing for each picture (None: string contents only, text models)."""
    body = "{{ message['content'] }}" if image is None else content(image)
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
        + body
        + "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )


CHATML = {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}


def text_kwargs(tok: Any, s: TinySize) -> dict[str, Any]:
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


def vision_kwargs(s: TinySize) -> dict[str, Any]:
    """The vision tower's config arguments that every ViT-style tower takes."""
    return {
        "hidden_size": s.vision_hidden,
        "intermediate_size": 2 * s.vision_hidden,
        "num_hidden_layers": s.vision_layers,
        "num_attention_heads": s.vision_heads,
        "image_size": s.image_side,
        "patch_size": s.patch,
    }
