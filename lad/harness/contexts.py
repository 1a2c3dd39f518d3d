"""lm-evaluation-harness's multiple-choice requests as lad questions, without lm-eval
(docs/harness.md, "What `--model lad` does with the requests").

lad scores the `multiple_choice` tasks that list their options in the context and answer with a
label, as MMLU's prompt does ("<question>\nA. <option 1>\nB. <option 2>\n...\nAnswer:",
continuations " A", " B", ...). The requests of one document become one `ContextQuestion`, asked
as a lad item of text candidates under the template "{question}\n{options}<tail>" whose rendering
is checked to give the context back character for character, so the model reads exactly the
prompt lm-eval built. A task of any other shape is refused with the document it failed on, never
guessed at.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from lad.core.items import Item, repeated_option
from lad.core.labels import LABEL_SCHEMES, get_scheme
from lad.core.prompts import PromptTemplate, TextPrompt, render_text_item
from lad.errors import LadError

# The scheme that names a task's labels when two would (none do today), and the label part of
# an option's line as lad.core.prompts lists text candidates: "<label>. <text>".
SCHEMES = ("upper", "digits", "lower", "roman", "words")
DELIMITER = " "  # lm-eval's default target_delimiter, between "Answer:" and the label


@dataclass(frozen=True)
class ContextQuestion:
    """One document of a multiple-choice task: its context split around its options."""

    task: str
    doc_id: int
    context: str
    scheme: str  # the lad label scheme of the continuations
    question: str  # the context before the options (the task's description and few-shot too)
    options: tuple[str, ...]
    tail: str  # the context after the last option, e.g. "\nAnswer:"

    @property
    def key(self) -> tuple[str, int, str]:
        """What the records of one calibration share: task, N and the prompt's template."""
        return self.task, len(self.options), self.template.text

    @property
    def template(self) -> PromptTemplate:
        tail = self.tail.replace("{", "{{").replace("}", "}}")
        return PromptTemplate("{question}\n{options}" + tail)

    def item(self) -> Item:
        """The lad item (its answer unknown to the model's side: recorded as 0)."""
        extra = {"task": self.task, "doc_id": self.doc_id}
        return Item(
            f"{self.task}-{self.doc_id}",
            self.question,
            [],
            0,
            extra,
            question=self.question,
            candidates=list(self.options),
        )

    def prompt(self) -> TextPrompt:
        order = list(range(len(self.options)))
        return render_text_item(self.template, self.item(), order, get_scheme(self.scheme))


def _where(task: str, doc_id: int) -> str:
    return f"lm-eval task {task!r}, document {doc_id}"


def label_scheme(task: str, doc_id: int, continuations: Sequence[str]) -> tuple[str, list[str]]:
    """The lad label scheme whose first N labels the continuations are (after the delimiter),
    and those labels."""
    wanted = [c[len(DELIMITER) :] for c in continuations]
    if all(c.startswith(DELIMITER) for c in continuations):
        for name in SCHEMES:
            scheme = LABEL_SCHEMES[name]
            if len(wanted) <= scheme.max_candidates and scheme.labels(len(wanted)) == wanted:
                return name, wanted
    shown = ", ".join(repr(c) for c in continuations[:5])
    raise LadError(
        f"{_where(task, doc_id)}: its choices are {shown}, not option labels after a space "
        "(' A', ' B', ... or ' 1', ' 2', ...). --model lad scores tasks that list their options "
        "in the prompt and answer with a label (MMLU's form); a cloze task, whose choices are "
        "the option texts themselves, shows no options to attend to"
    )


def _from_doc(doc: Any, n: int) -> list[str] | None:
    """The options a document lists under MMLU's `choices` (or `options`), if it does."""
    if not isinstance(doc, dict):
        return None
    for key in ("choices", "options"):
        value = doc.get(key)
        if isinstance(value, list) and len(value) == n and all(isinstance(v, str) for v in value):
            return value
    return None


def _split(
    where: str, context: str, labels: list[str], known: list[str] | None
) -> tuple[int, int, list[str]]:
    """Where the options' lines start and end in `context`, and their texts: the document's
    own options listed verbatim if it names them, else the last lines "<label>. <text>"."""
    if known is not None:
        block = "\n".join(f"{label}. {text}" for label, text in zip(labels, known, strict=True))
        start = context.rfind("\n" + block)
        if start >= 0:
            return start, start + 1 + len(block), known
    end, starts = len(context), []
    for label in reversed(labels):
        start = context.rfind(f"\n{label}. ", 0, end)
        if start < 0:
            raise LadError(
                f"{where}: its prompt does not list option {label!r} on a line of its own as "
                f"'{label}. <text>' (MMLU's form), so lad cannot tell where the options are"
            )
        starts.insert(0, start)
        end = start
    texts = []
    for k, (label, start) in enumerate(zip(labels, starts, strict=True)):
        begin = start + len(f"\n{label}. ")
        stop = starts[k + 1] if k + 1 < len(starts) else context.find("\n", begin)
        texts.append(context[begin : len(context) if stop < 0 else stop])
    return starts[0], begin + len(texts[-1]), texts


def parse_question(
    task: str, doc_id: int, context: str, continuations: Sequence[str], doc: Any = None
) -> ContextQuestion:
    """The lad question of one document's requests (its continuations in choice order)."""
    where = _where(task, doc_id)
    if len(continuations) < 2:
        raise LadError(f"{where}: {len(continuations)} choice; a question needs at least 2")
    scheme, labels = label_scheme(task, doc_id, continuations)
    start, end, texts = _split(where, context, labels, _from_doc(doc, len(labels)))
    question = ContextQuestion(
        task, doc_id, context, scheme, context[:start], tuple(texts), context[end:]
    )
    if not question.question.strip():
        raise LadError(f"{where}: its prompt has no question before the options")
    empty = next((labels[k] for k, text in enumerate(texts) if not text.strip()), None)
    if empty is not None:
        raise LadError(f"{where}: option {empty!r} is empty")
    repeated = repeated_option(list(texts))
    if repeated is not None:
        a, b = (labels[k] for k in repeated)
        raise LadError(
            f"{where}: options {a!r} and {b!r} are the same text ({texts[repeated[0]]!r}): one "
            "answer under two labels is a tie no method can score, so lad does not score it"
        )
    if question.prompt().text != context:
        raise LadError(
            f"{where}: lad's rendering of its question and options does not give its prompt back "
            "character for character, so it is not scored (e.g. an option's line is written "
            "otherwise than '<label>. <text>')"
        )
    return question


@dataclass(frozen=True)
class Grouped:
    """A document's requests: their positions in lm-eval's list, in choice order."""

    question: ContextQuestion
    requests: tuple[int, ...]


def questions(requests: Sequence[Any]) -> list[Grouped]:
    """lm-eval's loglikelihood requests regrouped per document (task, doc_id and context), each
    document's choices in their `idx` order, each present once."""
    groups: dict[tuple[str, int, str], dict[int, tuple[int, Any]]] = {}
    for r, request in enumerate(requests):
        key = (str(request.task_name), int(request.doc_id), request.args[0])
        if request.idx in groups.setdefault(key, {}):
            raise LadError(
                f"{_where(*key[:2])}: choice {request.idx} requested twice for one context"
            )
        groups[key][request.idx] = (r, request)
    out = []
    for (task, doc_id, context), by_idx in groups.items():
        if sorted(by_idx) != list(range(len(by_idx))):
            raise LadError(
                f"{_where(task, doc_id)}: its choices are requests {sorted(by_idx)}, not 0..N-1 "
                "(a task that adds requests of its own, e.g. acc_mutual_info's, is not supported)"
            )
        if not context.strip():
            raise LadError(f"{_where(task, doc_id)}: a request with an empty context")
        ordered = [by_idx[i] for i in range(len(by_idx))]
        continuations = [request.args[1] for _, request in ordered]
        question = parse_question(task, doc_id, context, continuations, ordered[0][1].doc)
        out.append(Grouped(question, tuple(r for r, _ in ordered)))
    return out
