"""The tokenizer sanity check: a prompt's tokens must decode back to its text (a tokenizer that
loads differently under the installed transformers is refused before any record)."""

from __future__ import annotations

from typing import Any

from lad.errors import BackendError


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
