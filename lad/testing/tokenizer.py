"""The tokenizer of lad's tiny test models, made here from a word list; nothing is downloaded.

Greedy longest-match over whole words (the prompt text of lad.core.prompts, labels of every
scheme, chat-template words, plus any `words` the caller gives), digits split one per token as in
Llama/Qwen, so labels "10".."12" take two tokens and unknown words fall back to characters.
"""

from __future__ import annotations

import re
import string
from collections.abc import Iterable
from typing import Any

from lad.core.labels import LABEL_SCHEMES
from lad.core.prompts import TEMPLATES

_SPACE = "\u2581"  # sentencepiece-style word-start marker


_COMMON_WORDS = (
    "one two three four five six seven eight nine ten eleven twelve zero "
    "system user assistant model You are a helpful USER ASSISTANT User Assistant Image "
    "yes no red green blue yellow black white circle square triangle star the of and"
)


def _vocabulary(more: Iterable[str]) -> list[str]:
    """The words that are one token each, sorted: the default ones and `more`, letters only
    (digits and punctuation stay single characters)."""
    words = set(_COMMON_WORDS.split()) | set(more)
    for text in TEMPLATES.values():
        words.update(re.findall(r"[A-Za-z]+", text))
    for scheme in LABEL_SCHEMES.values():
        if scheme.name != "roman":  # roman numerals stay multi-token, as in real tokenizers
            words.update(scheme.labels(scheme.max_candidates))
        words.add(scheme.noun)
    return sorted(w for w in words if re.fullmatch(r"[A-Za-z]+", w))


def build_tokenizer(
    special_tokens: dict[str, str],
    extra_special: Iterable[str] = (),
    words: Iterable[str] = (),
    attrs: dict[str, str] | None = None,
) -> Any:
    """A fast tokenizer over the default words plus `words` (letters only; others are ignored).

    special_tokens: role -> token, roles among bos/eos/unk/pad (missing unk becomes "<unk>").
    extra_special: further special tokens (image placeholders, turn markers), never split.
    attrs: tokenizer attributes some processors read, e.g. {"boi_token": "<start_of_image>"}.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    unk = special_tokens.get("unk_token", "<unk>")
    specials = list(dict.fromkeys([unk, *special_tokens.values(), *extra_special]))
    vocab: dict[str, int] = {tok: i for i, tok in enumerate(specials)}
    for ch in [_SPACE, "\n", *string.printable.strip(), "\u201c", "\u201d"]:
        vocab.setdefault(ch, len(vocab))
    for ch in string.ascii_letters:
        vocab.setdefault(_SPACE + ch, len(vocab))
    for word in _vocabulary(words):
        vocab.setdefault(word, len(vocab))
        vocab.setdefault(_SPACE + word, len(vocab))
    # Greedy longest match: a known word is one token, an unknown one falls back to pieces.
    model = models.WordPiece(
        vocab=vocab, unk_token=unk, continuing_subword_prefix="", max_input_chars_per_word=200
    )
    tok = Tokenizer(model)
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split("\n", behavior="isolated"),
            pre_tokenizers.Metaspace(replacement=_SPACE, prepend_scheme="never", split=True),
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.Punctuation(),
        ]
    )
    tok.decoder = decoders.Metaspace(replacement=_SPACE, prepend_scheme="never", split=True)
    return _fast(tok, {**special_tokens, "unk_token": unk}, specials, **(attrs or {}))


def build_byte_level_tokenizer(
    special_tokens: dict[str, str], extra_special: Iterable[str] = (), words: Iterable[str] = ()
) -> Any:
    """A byte-level BPE tokenizer (GPT-2 / Qwen style) over the same words, for architectures
    whose tokenizer transformers rebuilds from a vocabulary and merges whatever the file says
    (Qwen3.5: Qwen3_5Tokenizer, its own pre-tokenizer). Every byte is a token; each word
    (and " word") is one, reached by merging its characters left to right."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    specials = list(dict.fromkeys([*special_tokens.values(), *extra_special]))
    vocab: dict[str, int] = {tok: i for i, tok in enumerate(specials)}
    for symbol in sorted(pre_tokenizers.ByteLevel.alphabet()):
        vocab.setdefault(symbol, len(vocab))
    to_bytes = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    merges: dict[tuple[str, str], None] = {}
    for word in _vocabulary(words):
        for text in (word, " " + word):
            ((symbols, _),) = to_bytes.pre_tokenize_str(text)
            for k in range(2, len(symbols) + 1):
                merges.setdefault((symbols[: k - 1], symbols[k - 1]), None)
                vocab.setdefault(symbols[:k], len(vocab))
    tok = Tokenizer(models.BPE(vocab=vocab, merges=list(merges), ignore_merges=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    return _fast(tok, special_tokens, specials)


def _fast(tok: Any, special_tokens: dict[str, str], specials: list[str], **attrs: str) -> Any:
    """transformers' fast tokenizer of `tok`, its special tokens named by role (bos, eos, pad,
    unk) and the other `specials` additional ones."""
    from transformers import PreTrainedTokenizerFast

    roles = ("bos_token", "eos_token", "pad_token", "unk_token")
    named = {k: v for k, v in special_tokens.items() if k in roles}
    extra = [t for t in specials if t not in named.values()]
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, additional_special_tokens=extra, **named, **attrs
    )
