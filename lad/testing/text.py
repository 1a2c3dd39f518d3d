"""Tiny random-init text-only causal LMs (Qwen2, Llama), for tests and the text demo.

On lad's own small word tokenizer with a ChatML chat template (no file needed), or on a real
tokenizer folder (e.g. ../shared/real-checkpoints/qwen3-text-tokenizer: its vocabulary, special
tokens and chat template kept). Saved with save_pretrained; load with from_pretrained(path).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from lad.errors import BackendError, check_choice
from lad.testing.tiny import TinySize, build_tokenizer, save_model
from lad.testing.tiny_parts import CHATML, chatml, text_kwargs

TEXT_ARCHITECTURES = {
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM"),
    "llama": ("LlamaConfig", "LlamaForCausalLM"),
}


def build_text_tokenizer(words: Iterable[str] = ()) -> Any:
    """lad's tiny word tokenizer (lad.testing.tiny) with ChatML turns over string contents."""
    tok = build_tokenizer(CHATML, ("<|im_start|>",), words)
    tok.chat_template = chatml(None, system=False)
    return tok


def build_tiny_text_model(
    arch: str,
    path: str | Path,
    *,
    tokenizer: str | Path | None = None,
    size: TinySize | None = None,
    words: Iterable[str] = (),
    seed: int = 0,
) -> Path:
    """Write a random-init causal LM of `arch` ("qwen2" or "llama") to `path`.

    tokenizer: a folder of tokenizer files (the real ones of a model family); None: lad's tiny
    tokenizer over its default words plus `words`. The weights depend only on the arguments.
    """
    import transformers
    from transformers import AutoTokenizer

    check_choice("arch", arch, sorted(TEXT_ARCHITECTURES), BackendError)
    if tokenizer is None and arch != "llama":
        # transformers loads a qwen2 checkpoint's tokenizer as Qwen2Tokenizer whatever its
        # tokenizer_config says, which reads lad's word tokenizer without its spaces.
        raise BackendError(f"lad's tiny tokenizer goes with arch 'llama'; give {arch} a tokenizer")
    if tokenizer is None:
        tok = build_text_tokenizer(words)
    else:
        tok = AutoTokenizer.from_pretrained(tokenizer)
    config_name, model_name = TEXT_ARCHITECTURES[arch]
    config = getattr(transformers, config_name)(**text_kwargs(tok, size or TinySize()))
    return save_model(model_name, config, path, seed, tok)
