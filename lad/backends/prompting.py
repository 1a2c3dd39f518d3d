"""Prompt building: images first, then lad.prompts' text, through the model's own chat template;
tokenisation with left padding, and each image's token span (Eq. 6's R_k)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from lad.errors import BackendError, DataError


def load_image(path: str | Path) -> Any:
    """An RGB PIL image; an unreadable or corrupt file is a DataError naming it."""
    from PIL import Image

    try:
        with Image.open(path) as im:
            return im.convert("RGB")
    except (OSError, ValueError, SyntaxError) as e:
        raise DataError(f"{path}: cannot read image ({e})") from None


def chat_messages(text: str, num_images: int) -> list[dict[str, Any]]:
    """One user turn: N image slots in presentation order, then the text."""
    content: list[dict[str, Any]] = [{"type": "image"} for _ in range(num_images)]
    return [{"role": "user", "content": [*content, {"type": "text", "text": text}]}]


def chat_text(processor: Any, text: str, num_images: int) -> str:
    """The full prompt string, ending with the chat template's generation prompt."""
    return processor.apply_chat_template(
        chat_messages(text, num_images), add_generation_prompt=True, tokenize=False
    )


def encode(
    processor: Any,
    texts: list[str],
    images: list[list[Any]],
    options: dict[str, Any],
    markers: list[int],
    special: set[int],
) -> tuple[dict[str, Any], list[list[tuple[int, int]]]]:
    """Tokenise a batch (left padded) and find each image's token span [start, end).

    A span is the tokens its placeholder expanded to (all tiles), less plain-text tokens at its
    ends (Gemma3 wraps images in blank lines), widened by adjacent marker tokens of the
    architecture (e.g. <|vision_start|> ... <|vision_end|>). `special`: the special token ids.
    """
    enc = processor(
        text=texts,
        images=images,
        padding=True,
        return_tensors="pt",
        return_text_replacement_offsets=True,
        return_offsets_mapping=True,
        **options,
    )
    inputs = dict(enc)
    offsets = inputs.pop("offset_mapping")  # (B, T, 2) character span of each token
    replacements = inputs.pop("text_replacement_offsets")
    ids = inputs["input_ids"]
    spans = []
    for b in range(ids.shape[0]):
        images_b = [r["new_span"] for r in replacements[b] if r.get("type") == "image"]
        spans.append([_token_span(offsets[b], ids[b], s, markers, special) for s in images_b])
    return inputs, spans


def _token_span(
    offsets: torch.Tensor,
    ids: torch.Tensor,
    chars: tuple[int, int],
    markers: list[int],
    special: set[int],
) -> tuple[int, int]:
    start, end = offsets[:, 0], offsets[:, 1]
    inside = (start >= chars[0]) & (end <= chars[1]) & (end > start)
    inside &= torch.tensor([int(t) in special for t in ids.tolist()])
    where = inside.nonzero().flatten()
    if where.numel() == 0:
        raise BackendError(f"no tokens found for the image placeholder at characters {chars}")
    lo, hi = int(where[0]), int(where[-1]) + 1
    if lo > 0 and int(ids[lo - 1]) in markers:
        lo -= 1
    if hi < ids.shape[0] and int(ids[hi]) in markers:
        hi += 1
    return lo, hi


def check_round_trip(tokenizer: Any, text: str, model: str) -> None:
    """Refuse a tokenizer whose tokens of `text` do not decode back to `text`.

    Seen: a tokenizer saved under one transformers version that loads under another as something
    else, dropping every space and newline; the model then reads a prompt nobody wrote. Compared
    modulo the tokenizer's own documented normalisation: each stretch between added tokens
    (special or not, matched before the model) is decoded on its own, as it was encoded, so a
    SentencePiece "▁" prepended to each stretch (legacy Llama) is undone; and the texts are equal
    after the tokenizer's normalizer (e.g. Qwen's NFC) if not before. A BackendError names `model`.
    """
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    added = set(tokenizer.added_tokens_decoder)
    runs: list[list[int]] = []
    for i in ids:
        if i in added or not runs or runs[-1][-1] in added:
            runs.append([i])
        else:
            runs[-1].append(i)
    back = "".join(
        tokenizer.decode(run, skip_special_tokens=False, clean_up_tokenization_spaces=False)
        for run in runs
    )
    normalizer = getattr(getattr(tokenizer, "backend_tokenizer", None), "normalizer", None)
    if back == text or (
        normalizer is not None and normalizer.normalize_str(back) == normalizer.normalize_str(text)
    ):
        return
    import transformers

    pairs = zip(text, back, strict=False)  # the first character where they differ
    k = next((i for i, (a, b) in enumerate(pairs) if a != b), min(len(text), len(back)))
    raise BackendError(
        f"{model}: its tokenizer does not give the prompt back: a {len(text)}-character prompt "
        f"made {len(ids)} tokens that decode to {len(back)} characters, first differing at "
        f"character {k} ({text[max(0, k - 15) : k + 15]!r} became "
        f"{back[max(0, k - 15) : k + 15]!r}). Its files were probably saved by another "
        f"transformers version and load differently under {transformers.__version__}; re-save "
        "the tokenizer with the version it was made with, or use that version"
    )


def label_token_ids(tokenizer: Any, prompt: str, label: str) -> list[int]:
    """The tokens a model emits for `label` right after `prompt` (its last line as context)."""
    cut = prompt.rfind("\n", 0, len(prompt) - 1) + 1
    tail = prompt[cut:]
    head = tokenizer(tail, add_special_tokens=False)["input_ids"]
    full = tokenizer(tail + label, add_special_tokens=False)["input_ids"]
    if full[: len(head)] != head:
        raise BackendError(
            f"label {label!r} does not tokenise as a continuation of the prompt's end {tail!r}"
        )
    return full[len(head) :]
