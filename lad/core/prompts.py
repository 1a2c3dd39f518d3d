"""The paper's prompt templates (Appendix E, Table 9), for any label scheme, and user templates.

Images come first (one slot per candidate, in presentation order), then this text; the backend
wraps both in the model's own chat template. An item with a `question` is asked with each
template's question variant; text candidates (an item's `candidates`) with TEXT_TEMPLATES, listed
where {options} stands, each candidate's span (Eq. 6's R_k) its text's characters. An item's
context pictures come before the candidates, or where its question writes `<image>`. The
placeholders of a template of one's own (`PromptTemplate`, `--prompt-template`) and the prompt
fingerprint are docs/baselines.md's ("Prompts").
"""

from __future__ import annotations

import hashlib
import string
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from lad.core.items import Item
from lad.core.labels import LABEL_SCHEMES, LabelScheme
from lad.errors import DataError, LadError, bad_parameter
from lad.io import files, limits

# One part of the user turn: text, or a picture slot ("candidate", position) / ("context", j).
Part = str | tuple[str, int]

_TASK = (
    "Given {n} images indexed from {first} to {last}, identify the image that best matches "
    "the provided caption."
)
_ONLY = " Respond with the index {noun} only and nothing else."
_FAIR = (
    " Please note that the provided images have been randomly shuffled, so it is essential to "
    "consider them fairly and without bias. Analyze the visual content objectively and do not be "
    "influenced by the order of the images."
)
_COT = (
    " Please think step by step. First, write your reasoning inside <think> and </think> tags. "
    "Then, after the closing </think> tag, output only the final answer index (a single {single} "
    "from {first} to {last})."
)
_SC = (
    " Think step by step to analyze the content of the images. After your reasoning, provide the "
    "final answer in the exact format: \u201cThe answer is <index>\u201d."
)
_TAIL = "\nCaption: {caption}\nAnswer:"


def _four(task: str, only: str, fair: str, sc: str, tail: str) -> dict[str, str]:
    """The four prompts (vanilla and the generation baselines') from their sentences."""
    return {
        "vanilla": task + only + tail,
        "instruction": task + fair + only + tail,
        "cot": task + _COT + tail + " <think>",
        "self-consistency": task + sc + tail,
    }


TEMPLATES: dict[str, str] = _four(_TASK, _ONLY, _FAIR, _SC, _TAIL)

# The same prompts for an item's own question: only the task sentence and the tail differ.
_TASK_Q = (
    "Given {n} images indexed from {first} to {last}, answer the question about them by choosing "
    "one image."
)
_TAIL_Q = "\nQuestion: {question}\nAnswer:"
QUESTION_TEMPLATES: dict[str, str] = _four(_TASK_Q, _ONLY, _FAIR, _SC, _TAIL_Q)

# Text candidates: the same four prompts, asking to choose an option listed under its label.
_TASK_T = (
    "Given {n} options labelled from {first} to {last}, answer the question by choosing one option."
)
_ONLY_T = " Respond with the option's {noun} only and nothing else."
_FAIR_T = (
    " Please note that the options have been randomly shuffled, so it is essential to consider "
    "them fairly and without bias. Do not be influenced by the order of the options."
)
_TAIL_T = "\nQuestion: {question}\nOptions:\n{options}\nAnswer:"
_SC_T = _SC.replace("the content of the images", "the options")
TEXT_TEMPLATES: dict[str, str] = _four(_TASK_T, _ONLY_T, _FAIR_T, _SC_T, _TAIL_T)

CONTEXT_PLACEHOLDER = "<image>"  # where the asked text shows a context picture
OPTIONS = "options"  # the placeholder where text candidates are listed
QUERY_PLACEHOLDERS = ("query", "question", "caption")
PLACEHOLDERS = (*QUERY_PLACEHOLDERS, "n", "labels", "first", "last", "noun", "single", OPTIONS)


def check_template(text: str, source: str = "the prompt template") -> str:
    """`text` if it is a valid template (placeholders above, one of them the query)."""
    if not isinstance(text, str) or not text.strip():
        raise LadError(f"{source} is empty; it must hold the prompt text with a {{query}}")
    try:
        fields = [(name, spec, conv) for _, name, spec, conv in string.Formatter().parse(text)]
    except ValueError as e:
        raise LadError(f"{source}: {e} (write literal braces as {{{{ and }}}})") from None
    used = set()
    for name, spec, conv in fields:
        if name is None:
            continue
        if name not in PLACEHOLDERS or spec or conv:
            shown = "{" + name + (f"!{conv}" if conv else "") + (f":{spec}" if spec else "") + "}"
            raise LadError(
                f"{source}: unknown placeholder {shown}; the placeholders are "
                f"{', '.join('{' + p + '}' for p in PLACEHOLDERS)} (literal braces: {{{{ }}}})"
            )
        if name == OPTIONS and OPTIONS in used:
            raise LadError(f"{source} writes {{{OPTIONS}}} twice; text candidates are listed once")
        used.add(name)
    if not used & set(QUERY_PLACEHOLDERS):
        raise LadError(
            f"{source} never shows the item's question or caption; put {{query}} where it goes"
        )
    if CONTEXT_PLACEHOLDER in text:
        raise LadError(
            f"{source} holds {CONTEXT_PLACEHOLDER}, which marks an item's context pictures in its "
            "question; a template cannot show pictures of its own"
        )
    return text


@dataclass(frozen=True)
class PromptTemplate:
    """A vanilla prompt's text with the placeholders of this module, checked when made."""

    text: str

    def __post_init__(self) -> None:
        check_template(self.text)

    @classmethod
    def from_file(cls, path: str | Path) -> PromptTemplate:
        """The file's text (UTF-8), less one final newline if it ends with one."""
        path = Path(path)
        if path.is_file():
            limits.PROMPT_TEMPLATE.check(path.stat().st_size, f"--prompt-template {path}")
        text = files.read_text(path, LadError, "prompt template file")
        control = next((c for c in text if ord(c) < 32 and c not in "\t\n\r"), None)
        if control is not None:
            line = text.count("\n", 0, text.index(control)) + 1
            raise LadError(
                f"--prompt-template {path}: holds the control character {control!r} on line "
                f"{line}; a prompt template is plain text"
            )
        return cls(check_template(text.removesuffix("\n"), str(path)))

    @classmethod
    def file_text(cls, path: str | Path | None) -> str | None:
        """The text of `from_file(path)`, as settings hold a template (RecordSpec), or None."""
        return None if path is None else cls.from_file(path).text


CAPTION = PromptTemplate(TEMPLATES["vanilla"])
TEXT = PromptTemplate(TEXT_TEMPLATES["vanilla"])
QUESTION = PromptTemplate(QUESTION_TEMPLATES["vanilla"])
# The official code's vanilla prompt (github.com/brightXian/LAD): Table 9's, but ending with
# "Answer: ", a trailing space the model reads as a token of its own (`--preset official`).
OFFICIAL = PromptTemplate(TEMPLATES["vanilla"] + " ")


def _check_options(text: str, texts: bool, who: str, whose: str) -> None:
    """A template writes {options} exactly when the candidates are `texts`; `who` is the
    template as messages name it, `whose` the candidates' owner ("the items'")."""
    if texts != any(name == OPTIONS for _, name, _, _ in string.Formatter().parse(text)):
        raise LadError(
            f"{who} does not write {{{OPTIONS}}}, where {whose} text candidates are listed; add "
            "it to the template"
            if texts
            else f"{who} writes {{{OPTIONS}}}, which lists text candidates, but {whose} "
            "candidates are pictures; use a template without it"
        )


def _values(query: str, scheme: LabelScheme, num_candidates: int) -> dict[str, object]:
    labels = scheme.labels(num_candidates)
    return dict(
        n=num_candidates,
        labels=", ".join(labels),
        first=labels[0],
        last=labels[-1],
        noun=scheme.noun,
        single="integer" if scheme.name == "digits" else scheme.noun,
        **dict.fromkeys(QUERY_PLACEHOLDERS, query),
    )


@dataclass(frozen=True)
class TextPrompt:
    """The user turn of a text-candidate prompt and the characters of each candidate's text in
    it, [start, end) in position order: the spans of Eq. 6, the labels outside them."""

    text: str
    spans: list[tuple[int, int]]


def render_text_item(
    template: str | PromptTemplate, item: Item, order: Sequence[int], scheme: LabelScheme
) -> TextPrompt:
    """The prompt of an item of text candidates under `order` (position p shows order[p])."""
    return render_text(template, item.asked, [item.candidates[i] for i in order], scheme)


def check_text_labels(scheme: LabelScheme) -> None:
    """Text options cannot be named as pictures ("the first image")."""
    if scheme.name == "image-ordinals":
        raise LadError(
            "--labels image-ordinals names pictures ('the first image'); text options need "
            "labels of their own: upper, lower, digits, roman or words"
        )


def render_text(
    template: str | PromptTemplate, asked: str, options: Sequence[str], scheme: LabelScheme
) -> TextPrompt:
    """A text-candidate prompt: TEXT_TEMPLATES by name, or a PromptTemplate writing {options},
    with the line "<c_p>. <options[p]>" for each position p."""
    check_text_labels(scheme)
    text = _text_of(template, TEXT_TEMPLATES)
    _check_options(text, True, "the prompt template", "an item's")
    n = len(options)
    values, labels = _values(asked, scheme, n), scheme.labels(n)
    prompt = ""
    spans: list[tuple[int, int]] = []
    for literal, name, _, _ in string.Formatter().parse(text):
        prompt += literal
        if name == OPTIONS:
            for p, label in enumerate(labels):
                prompt += ("\n" if p else "") + f"{label}. "
                spans.append((len(prompt), len(prompt) + len(options[p])))
                prompt += options[p]
        elif name is not None:
            prompt += str(values[name])
    return TextPrompt(prompt, spans)


def render_prompt(
    template: str | PromptTemplate,
    caption: str,
    scheme: LabelScheme,
    num_candidates: int,
    *,
    question: bool = False,
) -> str:
    """The text part of the prompt for one query (of picture candidates), every placeholder
    filled: a template of TEMPLATES by name (its question variant with `question`), or a
    PromptTemplate."""
    text = _text_of(template, QUESTION_TEMPLATES if question else TEMPLATES)
    _check_options(text, False, "the prompt template", "the")
    return text.format(**_values(caption, scheme, num_candidates))


def _text_of(template: str | PromptTemplate, texts: dict[str, str]) -> str:
    """A PromptTemplate's text, or the text of the template named so among `texts`."""
    if isinstance(template, PromptTemplate):
        return template.text
    if template not in texts:
        must = f"one of {sorted(texts)} or a PromptTemplate"
        raise bad_parameter("template", must, template, instead=True)
    return texts[template]


def render_item(
    template: str | PromptTemplate, item: Item, scheme: LabelScheme, num_candidates: int
) -> str:
    """The text part of one item's prompt: its question if it has one, else its query."""
    asked = item.question is not None
    return render_prompt(template, item.asked, scheme, num_candidates, question=asked)


def prompt_parts(text: str, num_candidates: int, num_context: int = 0) -> list[Part]:
    """The user turn in order: the N candidate slots, then `text`; context pictures go at the
    text's `<image>` places when it has one per context picture, else before the candidates."""
    places = text.count(CONTEXT_PLACEHOLDER)
    candidates: list[Part] = [("candidate", p) for p in range(num_candidates)]
    if places == 0:
        return [*(("context", j) for j in range(num_context)), *candidates, text]
    if places != num_context:
        raise DataError(
            f"the prompt's text holds {places} {CONTEXT_PLACEHOLDER} places for {num_context} "
            f"context pictures: {text[:80]!r}"
        )
    parts = candidates
    for j, piece in enumerate(text.split(CONTEXT_PLACEHOLDER)):
        if j:
            parts.append(("context", j - 1))
        if piece:
            parts.append(piece)
    return parts


def shown_pictures(item: Item, order: Sequence[int]) -> tuple[list[Path], list[int]]:
    """Every picture of `item`'s prompt under `order`, in the order the prompt shows them, and
    where among them the candidates at positions 0..N-1 are (the image spans that are scored)."""
    parts = prompt_parts(item.asked, item.num_candidates, len(item.context_images))
    slots = [part for part in parts if not isinstance(part, str)]
    shown = [
        item.images[order[k]] if kind == "candidate" else item.context_images[k]
        for kind, k in slots
    ]
    return shown, [slots.index(("candidate", p)) for p in range(item.num_candidates)]


def vanilla_template(items: Sequence[Item], custom: PromptTemplate | None = None) -> PromptTemplate:
    """The vanilla prompt that `items` are asked with: `custom` if given, else the question
    template when every item has a `question`, the caption template when none has."""
    kinds = {it.is_text for it in items}
    if len(kinds) > 1:
        text = next(it.id for it in items if it.is_text)
        pictures = next(it.id for it in items if not it.is_text)
        raise DataError(
            f"items mix text candidates (e.g. {text!r}) with picture candidates (e.g. "
            f"{pictures!r}); one run asks one kind"
        )
    if custom is not None and items:
        _check_options(custom.text, kinds == {True}, "--prompt-template", "the items'")
    if custom is not None or kinds == {True}:
        return custom or TEXT
    asks = {it.question is not None for it in items}
    if len(asks) > 1:
        with_q = next(it.id for it in items if it.question is not None)
        without = next(it.id for it in items if it.question is None)
        raise DataError(
            f"items mix their own questions (e.g. {with_q!r}) with captions (e.g. {without!r}); "
            "give every item a 'question' or none, or pass one --prompt-template for all"
        )
    return QUESTION if asks == {True} else CAPTION


def prompt_sha256(template: str | PromptTemplate, scheme: LabelScheme, num_candidates: int) -> str:
    """Fingerprint of a prompt format, stored in calibration.json so a mismatch is caught; the
    paper's vanilla template keeps the one it always had, by name or as a PromptTemplate."""
    if isinstance(template, PromptTemplate) and template.text != TEMPLATES["vanilla"]:
        name, text = "template", template.text
    else:
        name = "vanilla" if isinstance(template, PromptTemplate) else template
        text = render_prompt(name, "{caption}", scheme, num_candidates)
    key = f"{name}\n{scheme.name}\n{'|'.join(scheme.labels(num_candidates))}\n{text}"
    return hashlib.sha256(key.encode()).hexdigest()


CAPTION_DESCRIPTION = "the paper's caption prompt (for captions, lad predict --query)"
QUESTION_DESCRIPTION = "the question prompt (for items with a 'question', lad predict --question)"
_KNOWN = (
    (CAPTION_DESCRIPTION, CAPTION),
    (QUESTION_DESCRIPTION, QUESTION),
    ("the official code's prompt (--preset official)", OFFICIAL),
    ("the text-candidate prompt (items with 'candidates')", TEXT),
)


def describe_prompt(sha256: str, labels: list[str] | None) -> str:
    """A prompt fingerprint (calibration.json's prompt_sha256) in words: which of lad's built-in
    prompts it is under the label scheme that gives `labels`, else a template of one's own."""
    n = len(labels or [])
    for scheme in LABEL_SCHEMES.values():
        if not 1 <= n <= scheme.max_candidates or scheme.labels(n) != labels:
            continue
        for words, template in _KNOWN:
            if prompt_sha256(template, scheme, n) == sha256:
                return words
    return f"a prompt template of one's own (--prompt-template; fingerprint {sha256[:12]}…)"
