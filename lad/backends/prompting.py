"""Prompt building: images first, then lad.core.prompts' text, through the model's own chat
template; tokenisation with left padding, each image's token span (Eq. 6's R_k), and the labels'
tokens as the chat template writes the model's reply (docs/backends.md, "Exact labels")."""

from __future__ import annotations

import contextlib
import re
import weakref
from dataclasses import dataclass
from typing import Any

from lad.backends.spans import FIX as _FIX
from lad.backends.spans import OffsetSpans, marked_spans
from lad.core.prompts import CONTEXT_PLACEHOLDER, Part, prompt_parts
from lad.errors import BackendError
from lad.io import limits


def chat_messages(text: str, num_images: int, context: int = 0) -> list[dict[str, Any]]:
    """One user turn: N image slots in presentation order, then the text; `context` pictures of
    the question before them or at the text's <image> places (lad.core.prompts.prompt_parts)."""
    parts = prompt_parts(text, num_images, context)
    content = [
        {"type": "text", "text": p} if isinstance(p, str) else {"type": "image"} for p in parts
    ]
    return [{"role": "user", "content": content}]


def render(
    processor: Any, messages: list[dict[str, Any]], generation_prompt: bool, model: str
) -> str:
    """The chat template applied to `messages`; with `generation_prompt`, followed by its
    `answer_head`. A chat template is code its author wrote: any failure while it renders, or a
    prompt longer than lad.io.limits.CHAT_TEXT, is a BackendError naming `model` (the model, or
    the --chat-template file)."""
    text = _render(processor, messages, generation_prompt, model)
    return text + answer_head(processor, model) if generation_prompt else text


# tokenizer -> {chat template text: its answer head}
_HEADS: weakref.WeakKeyDictionary[Any, dict[str, str]] = weakref.WeakKeyDictionary()


def answer_head(processor: Any, model: str) -> str:
    r"""What the chat template writes at the start of every assistant turn after its generation
    prompt, where the tokenizer would merge it with the prompt's last token; else "".

    Qwen3.5 prompts with "...assistant\n<think>\n" and writes a turn as
    "...assistant\n<think>\n\n</think>\n\n1": the reply's "\n" merges with the prompt's into one
    "\n\n" token. The prompt then runs through that text, as the template writes the turn (its
    enable_thinking=False prompt), and the reply is the label. Read once per tokenizer and template.
    """
    tok = processor.tokenizer
    template = str(getattr(processor, "chat_template", None))
    known = _HEADS.setdefault(tok, {})
    if template not in known:
        user = [{"role": "user", "content": [{"type": "text", "text": "Which one?"}]}]
        prompt = _render(processor, user, True, model)
        fulls = [_render(processor, [*user, _assistant(c)], False, model) for c in ("1", "2")]
        head = ""
        if all(f.startswith(prompt) for f in fulls):
            lead = _lead([f[len(prompt) :] for f in fulls], ["1", "2"]) or ""
            ids = tok(prompt, add_special_tokens=False)["input_ids"]
            joint = tok(prompt + lead, add_special_tokens=False)["input_ids"]
            head = lead if joint[: len(ids)] != ids else ""
        known[template] = head
    return known[template]


def _render(
    processor: Any, messages: list[dict[str, Any]], generation_prompt: bool, model: str
) -> str:
    """The chat template itself applied to `messages` (`render`, without the answer head)."""
    _bound_output(processor)
    try:
        return processor.apply_chat_template(
            messages, add_generation_prompt=generation_prompt, tokenize=False
        )
    except _TooLong:
        limit = limits.CHAT_TEXT
        raise BackendError(
            f"{model}: its chat template writes more than {limit.value:,} characters for one "
            f"prompt, lad's limit; set {limit.env} higher to allow it"
        ) from None
    except Exception as e:  # user code: ZeroDivisionError, OverflowError, RecursionError, ...
        roles = "/".join(m["role"] for m in messages)
        detail = " ".join(str(e).split())[:200]
        raise BackendError(
            f"{model}: its chat template cannot render a {roles} conversation of images and text "
            f"({type(e).__name__}: {detail}); {_FIX}"
        ) from None


class _TooLong(Exception):
    """A chat template's output passed lad.io.limits.CHAT_TEXT while rendering."""


def _bound_output(processor: Any) -> None:
    """Make the processor's compiled chat template stop once its output passes
    lad.io.limits.CHAT_TEXT, as it renders, rather than fill the memory first. transformers renders
    the Jinja template it compiled and cached for this text; that object's render is wrapped."""
    text = getattr(processor, "chat_template", None)
    if not isinstance(text, str):
        return
    try:
        from transformers.utils.chat_template_utils import _compile_jinja_template

        template = _compile_jinja_template(text)
    except Exception:
        return  # a template that does not compile fails in render, named there
    if getattr(template, "_lad_bounded", False):
        return

    def bounded(*args: Any, **kwargs: Any) -> str:
        limit, pieces, size = limits.CHAT_TEXT, [], 0
        for piece in template.generate(*args, **kwargs):
            size += len(piece)
            if size > limit.value:
                raise _TooLong
            pieces.append(piece)
        return "".join(pieces)

    template.render = bounded
    template._lad_bounded = True


def check_data_text(tokenizer: Any, item: Any) -> None:
    """Refuse an item whose own text holds one of the tokenizer's control tokens (`control_in`)
    where lad cannot tokenise it as text: a picture prompt, which the model's processor tokenises
    whole as it expands the pictures (text-only models read it as text: lad.backends.text)."""
    found = control_in(tokenizer, item)
    if found:
        raise BackendError(
            f"item {item.id!r}: its text holds {found!r}, a control token of the model's "
            "tokenizer, which its processor would read as that token rather than as text (and "
            "could end the prompt's turn early); remove it from the item"
        )


def control_in(tokenizer: Any, item: Any) -> str | None:
    """The first of the tokenizer's control tokens (`control_tokens`) in an item's own text
    (query, question, text candidates), or None. The context placeholder lad itself places is
    not the item's text."""
    controls = control_tokens(tokenizer)[0]
    for text in [item.query, item.question or "", *item.candidates] if controls else ():
        found = controls.search(text.replace(CONTEXT_PLACEHOLDER, "\0"))
        if found:
            return found.group()
    return None


def control_tokens(tokenizer: Any) -> tuple[Any, frozenset[int]]:
    """The tokenizer's control tokens (`<|im_end|>`, `<end_of_turn>`, `<think>`: its added and
    special tokens, less those of whitespace alone, as Gemma's newlines): a pattern matching any
    of them (None without one) and their ids. Cached on the tokenizer."""
    cached = getattr(tokenizer, "_lad_controls", None)
    if cached is not None:
        return cached
    added = getattr(tokenizer, "added_tokens_decoder", {}) or {}
    names = {getattr(t, "content", str(t)) for t in added.values()}
    names |= set(getattr(tokenizer, "all_special_tokens", []))
    names = sorted((n for n in names if n.strip()), key=len, reverse=True)
    pattern = re.compile("|".join(map(re.escape, names))) if names else None
    controls = (pattern, frozenset(tokenizer.convert_tokens_to_ids(names)))
    with contextlib.suppress(AttributeError):
        tokenizer._lad_controls = controls
    return controls


def chat_text(
    processor: Any, text: str, num_images: int, model: str = "the model", context: int = 0
) -> str:
    """The full prompt string, ending with the chat template's generation prompt.

    Checked: one image placeholder per image and the text, both written by the template (a base
    checkpoint's template often ignores structured content and writes neither); with `context`
    pictures, that the template keeps every picture and text piece where the turn puts them (a
    template that writes all images first would put a context picture among the candidates).
    """
    parts = prompt_parts(text, num_images, context)
    prompt = render(processor, chat_messages(text, num_images, context), True, model)
    placeholder = getattr(processor, "image_token", None)
    total = num_images + context
    if placeholder and prompt.count(placeholder) != total:
        raise BackendError(
            f"{model}: its chat template writes {prompt.count(placeholder)} image placeholders "
            f"({placeholder}) for a prompt of {total} images; {_FIX}"
        )
    if context:
        _check_places(prompt, parts, placeholder, model)
    for piece in (p for p in parts if isinstance(p, str) and p.strip()):
        if piece.strip() not in prompt:
            raise BackendError(
                f"{model}: its chat template does not write the prompt's text "
                f"{piece.strip()[:60]!r}; {_FIX}"
            )
    return prompt


def _check_places(prompt: str, parts: list[Part], placeholder: str | None, model: str) -> None:
    """Each part of the user turn must appear in the rendered prompt after the one before it."""
    if not placeholder:
        raise BackendError(
            f"{model}: its processor names no image token, so lad cannot check where the chat "
            "template puts an item's context pictures; use items without context_images"
        )
    cursor = 0
    for part in parts:
        needle = part.strip() if isinstance(part, str) else placeholder
        if not needle:
            continue
        found = prompt.find(needle, cursor)
        if found < 0:
            shown = needle[:40] if isinstance(part, str) else f"{part[0]} picture {part[1] + 1}"
            raise BackendError(
                f"{model}: its chat template does not keep the pictures where the question puts "
                f"them ({shown!r} is out of place; e.g. it writes every image first), so a "
                "context picture would sit among the candidates; place the item's context "
                "pictures before the candidates (no <image> in its question) or pass a chat "
                "template that keeps the order with --chat-template FILE"
            )
        cursor = found + len(needle)


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


def adds_bos(processor: Any, texts: list[str]) -> bool:
    """Whether the tokenizer adds its special tokens to `texts`: not where the chat template
    writes the BOS itself (Gemma3), as transformers' own apply_chat_template(tokenize=True)."""
    bos = processor.tokenizer.bos_token
    return not (bos and all(t.startswith(bos) for t in texts))


def tokenised(processor: Any, texts: list[str], **options: Any) -> tuple[dict[str, Any], Any]:
    """The processor's batch of `texts` (left padded, as tensors) and each token's characters
    (B, T, 2); `options`: the pictures and processor options."""
    inputs = dict(
        processor(
            text=texts,
            add_special_tokens=adds_bos(processor, texts),
            padding=True,
            return_tensors="pt",
            return_offsets_mapping=True,
            **options,
        )
    )
    return inputs, inputs.pop("offset_mapping")


def encode(
    processor: Any,
    texts: list[str],
    images: list[list[Any]],
    options: dict[str, Any],
    image_token: int,
    markers: list[int],
    model: str = "the model",
) -> tuple[dict[str, Any], list[list[tuple[int, int]]]]:
    """Tokenise a batch (left padded) and find each image's token span [start, end).

    A span is the tokens its placeholder expanded to (all tiles and the markers the processor
    writes), less whitespace at its ends (Gemma3 wraps images in blank lines), widened by adjacent
    marker tokens the chat template writes (e.g. <|vision_start|> ... <|vision_end|>). It must hold
    the model's `image_token`; how a tokenizer file flags its tokens (special or not) plays no part.
    """
    from lad.backends.remote import transformers_major

    # transformers 4's processors (remote code's) cannot say where a placeholder expanded
    where = {"return_text_replacement_offsets": True} if transformers_major() >= 5 else {}
    inputs, offsets = tokenised(processor, texts, images=images, **where, **options)
    offsets = offsets.numpy()
    replacements = inputs.pop("text_replacement_offsets", None)
    if replacements is None and len(markers) == 2:  # each image's tokens between its markers
        ids = inputs["input_ids"].tolist()
        return inputs, [marked_spans(row, image_token, markers, model) for row in ids]
    if replacements is None:  # a processor that cannot say where each placeholder expanded
        raise BackendError(
            f"{model}: its processor {type(processor).__name__} does not report where each "
            "image placeholder expanded (return_text_replacement_offsets), so lad cannot find "
            "the images' token spans (Eq. 6)"
        )
    placeholder = getattr(processor, "image_token", None) or "the image placeholder"
    spans = []
    for b, ids in enumerate(inputs["input_ids"].tolist()):
        chars = [r["new_span"] for r in replacements[b] if r.get("type") == "image"]
        found = OffsetSpans(processor.tokenizer, ids, offsets[b], image_token, markers)
        spans.append([found.span(k, c, placeholder, model) for k, c in enumerate(chars)])
    return inputs, spans


@dataclass(frozen=True)
class Replies:
    """Each label's tokens as the model's reply and the token that ends the reply.

    labels: token ids from the end of the generation prompt through the label's last character
            (a leading space the template writes is part of them).
    end_of_answer: the special token the template writes right after the label (whitespace
                   skipped); the tokenizer's EOS where the template writes none (LLaVA-1.5).
    """

    labels: list[list[int]]
    end_of_answer: int


def reply_tokens(
    processor: Any, text: str, num_images: int, labels: list[str], model: str
) -> Replies:
    """The labels' tokens as the chat template writes an assistant turn whose content is each one.

    The turn is rendered after the user turn; its text after the generation prompt is tokenised
    together with the prompt, whose tokens must come out unchanged (the reply does not merge
    into them). Nothing about particular architectures is assumed.
    """
    user = chat_messages(text, num_images)
    prompt = render(processor, user, True, model)
    fulls = [render(processor, [*user, _assistant(label)], False, model) for label in labels]
    if all(f.startswith(prompt) for f in fulls):
        replies = [f[len(prompt) :] for f in fulls]
    else:
        replies = _replies_after_header(processor, user, prompt, fulls, labels, model)
    lead = _lead(replies, labels)
    if lead is None:
        raise BackendError(
            f"{model}: its chat template does not write the labels verbatim in an assistant turn "
            f"(it wrote {replies[0]!r} for {labels[0]!r}); {_FIX}"
        )
    tails = {r[len(lead) + len(label) :] for r, label in zip(replies, labels, strict=True)}
    if len(tails) != 1:
        raise BackendError(
            f"{model}: its chat template ends assistant turns differently per label "
            f"({sorted(tails)}); lad needs one end-of-answer for all labels"
        )
    tok = processor.tokenizer
    head = tok(prompt, add_special_tokens=False)["input_ids"]
    special = set(tok.all_special_ids) | {
        i for i, t in getattr(tok, "added_tokens_decoder", {}).items() if t.special
    }
    seqs, ends = [], set()
    for reply, label in zip(replies, labels, strict=True):
        full = prompt + reply
        enc = tok(full, add_special_tokens=False, return_offsets_mapping=True)
        ids, offsets = enc["input_ids"], enc["offset_mapping"]
        if ids[: len(head)] != head:
            raise BackendError(
                f"{model}: the reply {reply!r} changes the tokens of the prompt before it "
                f"(the tokenizer merges across the end of the generation prompt {prompt[-20:]!r})"
            )
        stop = len(prompt) + len(lead) + len(label)
        cut = next((j for j in range(len(head), len(ids)) if offsets[j][0] >= stop), len(ids))
        if cut == len(head) or offsets[cut - 1][1] != stop:
            raise BackendError(
                f"{model}: label {label!r} does not end on a token boundary in the reply "
                f"{reply!r}; lad cannot score it as a label"
            )
        seqs.append(ids[len(head) : cut])
        ends.add(_end_of_answer(tok, ids[cut:], offsets[cut:], full, special, model))
    if len(ends) != 1:
        raise BackendError(f"{model}: labels end with different tokens {sorted(ends)}")
    return Replies(seqs, ends.pop())


def _assistant(label: str) -> dict[str, Any]:
    return {"role": "assistant", "content": [{"type": "text", "text": label}]}


def _lead(replies: list[str], labels: list[str]) -> str | None:
    """The text every reply writes before its label: the shortest part of their common prefix
    after which each reply goes on with its own label ("I" and "II" share the "I" of the common
    prefix " I"); None if there is none."""
    shared = (k for k, chars in enumerate(zip(*replies, strict=False)) if len(set(chars)) > 1)
    common = replies[0][: next(shared, min(map(len, replies)))]
    for n in range(len(common) + 1):
        if all(r[n:].startswith(label) for r, label in zip(replies, labels, strict=True)):
            return common[:n]
    return None


def _replies_after_header(
    processor: Any,
    user: list[dict[str, Any]],
    prompt: str,
    fulls: list[str],
    labels: list[str],
    model: str,
) -> list[str]:
    r"""Replies where the template's assistant header is not its generation prompt.

    LLaVA-OneVision's template writes the turn as "<|im_start|>assistant \n1<|im_end|>" but
    prompts with "<|im_start|>assistant\n". Accepted where both headers end in a newline and
    agree up to whitespace: the reply is what the turn writes after the header's last newline.
    """
    closed = render(processor, user, False, model)
    if not (prompt.startswith(closed) and all(f.startswith(closed) for f in fulls)):
        raise BackendError(
            f"{model}: its chat template renders the user turn differently with and without "
            f"the assistant's reply; {_FIX}"
        )
    generation = prompt[len(closed) :]
    turns = [f[len(closed) :] for f in fulls]
    header = _lead(turns, labels) or ""
    agree = (
        generation.endswith("\n")
        and "\n" in header
        and header[: header.rindex("\n")].split() == generation[:-1].split()
    )
    if not agree:
        raise BackendError(
            f"{model}: its chat template starts an assistant turn with {header!r} but its "
            f"generation prompt is {generation!r}, so lad cannot tell where the reply starts; "
            f"{_FIX}"
        )
    start = header.rindex("\n") + 1
    return [t[start:] for t in turns]


def _end_of_answer(
    tok: Any,
    ids: list[int],
    offsets: list[tuple[int, int]],
    text: str,
    special: set[int],
    model: str,
) -> int:
    """The first token after the label that is not plain whitespace; EOS if there is none."""
    for token, (s, e) in zip(ids, offsets, strict=True):
        if token in special:
            return int(token)
        if text[s:e].strip():
            raise BackendError(
                f"{model}: its chat template writes {text[s:]!r} after the label, not an "
                f"end-of-turn token; {_FIX}"
            )
    if tok.eos_token_id is None:
        raise BackendError(f"{model}: the chat template ends no reply and there is no EOS token")
    return int(tok.eos_token_id)
