"""Text candidates: text-only causal LMs behind the same Backend, and prompts whose candidates are
texts (an item's `candidates`, lad.data.items) for any model, text-only or multimodal.

A text-only checkpoint (AutoModelForCausalLM: Qwen2/2.5/3, Llama, Gemma, SmolLM, ...) gets its
tokenizer wrapped in `TextProcessor`, which answers what the backend asks of a processor. A
candidate's span (Eq. 6's R_k) is the tokens of its text, found from the tokenizer's offsets
mapping over the characters lad.core.prompts.render_text_item says the text occupies; the label
before it is outside the span (docs/backends.md, "Text candidates").
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from lad.backends.archs import ARCHS, Arch
from lad.backends.batches import check_context
from lad.backends.prompting import (
    adds_bos,
    check_data_text,
    check_round_trip,
    control_in,
    control_tokens,
    render,
    tokenised,
)
from lad.core.labels import LabelScheme
from lad.core.prompts import PromptTemplate, TextPrompt, render_text, render_text_item
from lad.errors import BackendError

if TYPE_CHECKING:
    from lad.core.items import Item, Request

TEXT_ARCH = Arch("text-only causal LM", ())
PROBE_QUESTION = "Which of these animals can fly?"
PROBE_OPTIONS = ("a dog that runs on the beach", "a red kite above the trees", "a cat", "a fish")


def is_text_model(config: Any) -> bool:
    """A config lad's multimodal table does not name, of a causal LM transformers loads with
    AutoModelForCausalLM, without a vision tower."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    model_type = getattr(config, "model_type", None)
    if any(model_type in arch.model_types for arch in ARCHS):
        return False
    return model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES and not hasattr(config, "vision_config")


class TextProcessor:
    """A text-only model's tokenizer, as the backend uses a processor: `tokenizer`,
    `chat_template`, `apply_chat_template` (a message's text parts joined into the string content
    text chat templates expect) and the call (text only; left padding, a pad token)."""

    image_token = None

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        if tokenizer.pad_token is None:  # Llama 3: padding is masked out, any token will do
            tokenizer.pad_token = tokenizer.eos_token

    @property
    def chat_template(self) -> Any:
        return self.tokenizer.chat_template

    @chat_template.setter
    def chat_template(self, text: Any) -> None:
        self.tokenizer.chat_template = text

    def apply_chat_template(self, messages: list[dict[str, Any]], **options: Any) -> Any:
        return self.tokenizer.apply_chat_template([_flat(m) for m in messages], **options)

    def __call__(self, text: Any = None, images: Any = None, **options: Any) -> Any:
        if images and any(images):
            raise BackendError("a text-only model cannot be shown pictures")
        return self.tokenizer(text, **options)


def _flat(message: dict[str, Any]) -> dict[str, Any]:
    content = message["content"]  # lad writes every message as parts (prompting.chat_messages)
    if any(part.get("type") != "text" for part in content):
        raise BackendError("a text-only model's prompt cannot hold pictures")
    return {**message, "content": "".join(part["text"] for part in content)}


def check_text_options(image_options: dict[str, Any] | None, image_size: int | None) -> None:
    """Picture options mean nothing to a text-only model: refused, not ignored."""
    if image_options or image_size is not None:
        raise BackendError(
            "the model is a text-only causal LM: it takes no image options (--image-option, "
            "--image-size, --min-pixels, --max-pixels)"
        )


def check_text_tokenizer(
    processor: Any, template: str | PromptTemplate, scheme: LabelScheme, n: int, model: str
) -> None:
    """A text-candidate prompt's tokens must decode back to its text (check_round_trip)."""
    options = [PROBE_OPTIONS[k % len(PROBE_OPTIONS)] for k in range(n)]
    prompt = render_text(template, PROBE_QUESTION, options, scheme)
    chat, _, _ = _locate(processor, prompt, "the probe", model)
    check_round_trip(processor.tokenizer, chat, model)


def check_item_text(
    processor: Any, item: Item, template: str | PromptTemplate, scheme: LabelScheme, model: str
) -> None:
    """Before any record: an item whose text holds a control token is tokenised as text
    (`as_text`) on a text-only model, or refused (lad.backends.prompting.check_data_text)."""
    if not (item.is_text and isinstance(processor, TextProcessor)):
        check_data_text(processor.tokenizer, item)
    elif control_in(processor.tokenizer, item):
        order = list(range(item.num_candidates))
        chat, _, turn = chat_prompt(processor, item, order, template, scheme, model)
        as_text(processor.tokenizer, chat, turn, adds_bos(processor, [chat]), item)


def chat_prompt(
    processor: Any,
    item: Item,
    order: list[int],
    template: str | PromptTemplate,
    scheme: LabelScheme,
    model: str,
) -> tuple[str, list[tuple[int, int]], tuple[int, int]]:
    """The chat template's prompt for one text-candidate item, each candidate's characters in it
    (position order), and those of the user turn's text, which must appear in it once, verbatim."""
    if not isinstance(processor, TextProcessor):  # a picture model's processor tokenises it whole
        check_data_text(processor.tokenizer, item)
    return _locate(processor, render_text_item(template, item, order, scheme), item.id, model)


def _locate(
    processor: Any, prompt: TextPrompt, item_id: str, model: str
) -> tuple[str, list[tuple[int, int]], tuple[int, int]]:
    messages = [{"role": "user", "content": [{"type": "text", "text": prompt.text}]}]
    chat = render(processor, messages, True, model)
    if chat.count(prompt.text) != 1:
        raise BackendError(
            f"{model}: its chat template does not write the prompt's text once, verbatim (it is "
            f"found {chat.count(prompt.text)} times), so lad cannot tell where each option is; "
            "pass a chat template that does with --chat-template FILE"
        )
    placeholder = getattr(processor, "image_token", None)
    if placeholder and placeholder in chat:
        raise BackendError(
            f"item {item_id!r}: its text holds {placeholder!r}, the model's picture placeholder, "
            "which the processor would expand into a picture's tokens"
        )
    start = chat.index(prompt.text)
    spans = [(start + s, start + e) for s, e in prompt.spans]
    return chat, spans, (start, start + len(prompt.text))


def as_text(
    tokenizer: Any, chat: str, turn: tuple[int, int], special: bool, item: Item
) -> tuple[list[int], list[tuple[int, int]]]:
    """The prompt's ids and character offsets with the user turn's text tokenised as text: the
    tokenizer's own ids of the prompt, its turn's tokens replaced by those of the turn's text
    alone with its special tokens split (split_special_tokens), so `Paris<|im_end|>` is the
    text, never the token. Exact where the turn's text alone tokenises as it does in the prompt
    (no token crosses its ends) and its split ids hold no control token (a token the tokenizer
    matches even so): checked on every such prompt, else refused."""
    lo, hi = turn
    full = tokenizer(chat, add_special_tokens=special, return_offsets_mapping=True)
    ids, offsets = list(full["input_ids"]), [tuple(o) for o in full["offset_mapping"]]
    inside = [t for t, (s, e) in enumerate(offsets) if e > s and s < hi and e > lo]
    alone = tokenizer(chat[lo:hi], add_special_tokens=False)["input_ids"]
    split = tokenizer(chat[lo:hi], add_special_tokens=False, split_special_tokens=True,
                      return_offsets_mapping=True)  # fmt: skip
    i, j = inside[0], inside[-1] + 1
    controls = control_tokens(tokenizer)[1]
    exact = offsets[i][0] >= lo and offsets[j - 1][1] <= hi and ids[i:j] == list(alone)
    if not exact or controls & set(split["input_ids"]):
        why = "its tokens merge with the chat template's"
        if exact:
            why = "the tokenizer reads it as that token even with special tokens split"
        raise BackendError(
            f"item {item.id!r}: its text holds {control_in(tokenizer, item)!r}, a control token "
            f"of the model's tokenizer, which lad cannot tokenise as text here ({why}); remove "
            "it from the item"
        )
    moved = [(s + lo, e + lo) for s, e in split["offset_mapping"]]
    return ids[:i] + list(split["input_ids"]) + ids[j:], offsets[:i] + moved + offsets[j:]


def encode_text(
    processor: Any,
    batch: list[Request],
    template: str | PromptTemplate,
    scheme: LabelScheme,
    model: str,
    max_context: int,
) -> tuple[dict[str, Any], list[list[tuple[int, int]]]]:
    """A batch of text-candidate prompts tokenised (left padded) and each candidate's token span
    [start, end): the tokens overlapping its text's characters (offsets mapping), which may
    reach past the text only over whitespace (a space or newline merged into a word)."""
    prompts = [chat_prompt(processor, it, list(o), template, scheme, model) for it, _, o in batch]
    texts, chars, turns = (list(column) for column in zip(*prompts, strict=True))
    hostile = isinstance(processor, TextProcessor) and any(
        control_in(processor.tokenizer, item) for item, _, _ in batch
    )
    if hostile:  # an item's text holds a control token: its turn tokenised as text (as_text)
        special = adds_bos(processor, texts)
        inputs, offsets = _padded(processor.tokenizer, texts, turns, batch, special)
    else:
        inputs, offsets = tokenised(processor, texts)
        offsets = offsets.tolist()
    lengths = inputs["attention_mask"].sum(-1).tolist()
    spans = []
    for b, (item, _, _) in enumerate(batch):
        spans.append([_span(texts[b], offsets[b], c, item, k) for k, c in enumerate(chars[b])])
        check_context(item, lengths[b], max_context)
    return inputs, spans


def _padded(
    tokenizer: Any,
    texts: list[str],
    turns: list[tuple[int, int]],
    batch: list[Request],
    special: bool,
) -> tuple[dict[str, Any], list[list[tuple[int, int]]]]:
    """encode_text's batch, each prompt tokenised alone (as_text where its item's text holds a
    control token), padded by the tokenizer as its batch call pads (offsets (0, 0) there)."""
    rows, offsets = [], []
    for chat, turn, (item, _, _) in zip(texts, turns, batch, strict=True):
        if control_in(tokenizer, item):
            ids, spans = as_text(tokenizer, chat, turn, special, item)
        else:
            enc = tokenizer(chat, add_special_tokens=special, return_offsets_mapping=True)
            ids, spans = list(enc["input_ids"]), [tuple(o) for o in enc["offset_mapping"]]
        rows.append(ids)
        offsets.append(spans)
    inputs = dict(tokenizer.pad({"input_ids": rows}, padding=True, return_tensors="pt"))
    width = inputs["input_ids"].shape[1]
    left = tokenizer.padding_side == "left"
    padded = [[(0, 0)] * (width - len(o)) + o if left else o + [(0, 0)] * (width - len(o))
              for o in offsets]  # fmt: skip
    return inputs, padded


def _span(
    text: str, offsets: list[list[int]], chars: tuple[int, int], item: Item, k: int
) -> tuple[int, int]:
    lo, hi = chars
    where = f"item {item.id!r}, option at position {k + 1}"
    if lo == hi:  # an empty option (the blank prompt, lad.data.blank): no token, Eq. 6 sums 0
        after = next((t for t, (s, e) in enumerate(offsets) if e > s and s >= lo), len(offsets))
        return after, after
    inside = [t for t, (s, e) in enumerate(offsets) if e > s and s < hi and e > lo]
    if not inside:
        raise BackendError(f"{where}: no token of the prompt holds the option's text")
    for t in inside:
        s, e = offsets[t]
        if text[s:lo].strip() or text[hi:e].strip():
            raise BackendError(
                f"{where}: the token {text[s:e]!r} holds both the option's text and its "
                "surroundings (the label or the next line), so its span has no token boundary; "
                "e.g. start the option with a letter or digit"
            )
    return inside[0], inside[-1] + 1
