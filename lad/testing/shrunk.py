"""Random-init models shrunk from a published checkpoint's own files (config, tokenizer,
processor, chat template; no weights), at a head size vLLM's CPU attention takes: the models on
which tests/test_vllm_engine.py and benchmarks/bench_vllm.py compare the two engines."""

from __future__ import annotations

import shutil
from pathlib import Path


def shrink_vision_language(source: str | Path, out: str | Path, *, layers: int = 2) -> Path:
    """`source`'s multimodal checkpoint (e.g. real-checkpoints/qwen2.5-vl-3b-instruct) with
    `layers` decoder layers of 2 query / 1 KV heads of its own head size (Qwen2.5-VL-3B: 128,
    so M-RoPE's sections still fit) and a 2-block vision tower of width 64, random (seed 0);
    vocabulary, token ids, patch and merge sizes and every non-weight file kept."""
    import torch
    from transformers import AutoConfig, AutoModelForImageTextToText

    source, out = Path(source), Path(out)
    config = AutoConfig.from_pretrained(source)
    text = config.get_text_config()
    head = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    text.num_hidden_layers = layers
    text.num_attention_heads, text.num_key_value_heads = 2, 1
    text.hidden_size, text.head_dim, text.intermediate_size = 2 * head, head, 256
    if getattr(text, "layer_types", None):
        text.layer_types = text.layer_types[:layers]
    vision = config.vision_config
    for name, value in (("depth", 2), ("num_heads", 2), ("hidden_size", 64)):
        setattr(vision, name, value)
    vision.intermediate_size = 128
    vision.out_hidden_size = text.hidden_size
    vision.fullatt_block_indexes = [1]
    torch.manual_seed(0)
    AutoModelForImageTextToText.from_config(config).save_pretrained(out)
    for path in source.iterdir():  # the checkpoint's own tokenizer, template, processor files
        if path.is_file() and path.name != "config.json" and path.suffix != ".safetensors":
            shutil.copy(path, out / path.name)
    return out


def shrink_text(tokenizer: str | Path, out: str | Path, *, layers: int = 2) -> Path:
    """A Qwen2 causal LM on a real tokenizer folder (e.g. real-checkpoints/qwen3-text-tokenizer)
    with `layers` layers of width 256, 4 query / 2 KV heads (head size 64), random (seed 0)."""
    from lad.testing.text import build_tiny_text_model
    from lad.testing.tiny import TinySize

    size = TinySize(text_layers=layers, hidden=256, heads=4, kv_heads=2, intermediate=256)
    return build_tiny_text_model("qwen2", out, tokenizer=tokenizer, size=size)
