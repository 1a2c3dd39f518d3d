"""Shrunk random-weight copies of remote-code checkpoints (LLaVA-OneVision-1.5): the folder's own
config, code, tokenizer, chat template and processor files, its layers few and narrow, saved and
loadable with from_pretrained(..., trust_remote_code=True). Runs under the transformers the code
needs (4.53 for LLaVA-OneVision-1.5: docs/backends.md, "Remote code")."""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any


def shrink_remote(config: Any) -> Any:
    """Two decoder layers of two query heads and one KV head (head size kept), a two-layer vision
    tower 64 wide; vocabulary, token ids, patch and merge sizes kept."""
    text = config.text_config
    head = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    text.num_hidden_layers, text.layer_types = 2, text.layer_types[:2]
    text.num_attention_heads, text.num_key_value_heads = 2, 1
    text.hidden_size, text.head_dim, text.intermediate_size = 2 * head, head, 128
    text.max_window_layers = 2
    vision = config.vision_config
    vision.depth, vision.num_heads = 2, 2
    vision.embed_dim = vision.hidden_size = 64
    vision.intermediate_size = 128
    vision.text_hidden_size = text.hidden_size
    return config


def save_shrunk_remote(source: str | Path, out: str | Path, seed: int = 0) -> Path:
    """The checkpoint folder `source` (remote code) shrunk (`shrink_remote`), random-initialised
    with `seed`, saved in `out` beside a copy of every other file of `source`."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    source, out = Path(source), Path(out)
    config = shrink_remote(AutoConfig.from_pretrained(source, trust_remote_code=True))
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, trust_remote_code=True)
    model.save_pretrained(out)
    for path in source.iterdir():  # code, tokenizer, template, processor: the checkpoint's own
        if path.is_file() and path.name != "config.json" and path.suffix != ".safetensors":
            shutil.copy(path, out / path.name)
    save_fast_tokenizer(out)
    return out


def save_fast_tokenizer(folder: str | Path) -> Path:
    """`folder`'s fast tokenizer, as transformers builds it from vocab.json and merges.txt, saved
    as its tokenizer.json (if it has none), so that later loads read it instead of building it
    again (the checkpoint files here have none: SOURCES.md)."""
    from transformers import AutoTokenizer

    path = Path(folder) / "tokenizer.json"
    if not path.exists():
        AutoTokenizer.from_pretrained(folder, use_fast=True).backend_tokenizer.save(str(path))
    return path


# The published eager attention's size check names `bsz` and `self.num_heads`, which it never
# defines (SOURCES.md of the checkpoint): the one line a reference copy changes.
_BROKEN_CHECK = re.compile(r"\(bsz, self\.num_heads, input_shape\[1\], self\.head_dim\)")


def patch_eager(folder: str | Path) -> Path:
    """`folder`'s modeling code with the eager attention's size check made valid (batch from
    the input, heads from the config), so that `output_attentions=True` works; nothing else
    changes. Refuses code in which that check is not found."""
    for path in Path(folder).glob("modeling_*.py"):
        code = path.read_text()
        fixed, count = _BROKEN_CHECK.subn(
            "(input_shape[0], self.config.num_attention_heads, input_shape[1], self.head_dim)",
            code,
        )
        if count:
            path.write_text(fixed)
            return Path(folder)
    raise ValueError(f"{folder}: no modeling file with the published eager size check")
