"""Per-task adapters: which of a harness document's pictures are the options of its question
(docs/harness.md, "Adapters").

An adapter is a pure function of one lmms-eval document (a dict; `--model lad` and the circular
variants hand its pictures over undecoded, {"bytes", "path"}) and imports no lmms-eval: a
`PictureChoice` when every option is one of the document's pictures, else None (the question is
then answered by generation). Each calls its benchmark's one rule (`choose`, registered in
lad.data.benchmarks), the rule `lad data muirbench|blink` converts with, so `lad eval` on a
converted file asks the same items in the same way; a document the rule skips or refuses is
answered by generation. Documents of lad's circular variants (lad.harness.circular) carry
`lad_item` (the original document's id) and `lad_shift` (the cyclic shift s of the options).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from lad.data.benchmarks import BENCHMARKS
from lad.data.items import cyclic_shift
from lad.data.questions import Benchmark, Row
from lad.data.rules import Choice
from lad.errors import LadError


@dataclass
class PictureChoice:
    """One question whose options are pictures, in the order the document shows them.

    item:       the item's id, as `lad data muirbench|blink` names it (shared by a circular
                variant's shifts).
    ordering:   the cyclic shift s of a circular variant's document (0 for the task's own).
    question:   the question's text (a `<image>` where it shows a context picture).
    candidates: the option pictures in presentation order (PIL images, or the dataset's
                undecoded {"bytes", "path"}).
    context:    pictures of the question that are not options (lad.data.items.Item).
    answer:     position (0-based) of the right option, None where the document gives none.
    replies:    replies[p] is what the task's own parser reads as "the option at position p".
    order:      order[p] = index, in the original document's candidate order, of the picture
                shown at p: `cyclic_shift(N, s)`, the identity for the task's own documents.
    """

    item: str
    ordering: int
    question: str
    candidates: list[Any]
    context: list[Any]
    answer: int | None
    replies: list[str]
    order: list[int] = field(default_factory=list)

    @property
    def num_candidates(self) -> int:
        return len(self.candidates)

    def original_candidates(self) -> list[Any]:
        """The option pictures in the original document's order (undoing the shift)."""
        return [self.candidates[self.order.index(i)] for i in range(self.num_candidates)]


def _adapter(benchmark: Benchmark) -> Callable[[dict[str, Any]], PictureChoice | None]:
    def adapt(doc: dict[str, Any]) -> PictureChoice | None:
        try:
            made = benchmark.choose(Row(doc, f"{benchmark.name} document: "))
        except LadError:  # the rule refuses it, as it skips a non-Choice: answered by generation
            return None
        if not isinstance(made, Choice):
            return None
        item = doc.get("lad_item")
        shift = int(doc.get("lad_shift") or 0)
        return PictureChoice(
            item=made.item if item is None else str(item),
            ordering=shift,
            question=made.question,
            candidates=list(made.candidates),
            context=list(made.context),
            answer=made.answer,
            replies=made.replies,
            order=cyclic_shift(made.num_candidates, shift),
        )

    adapt.__doc__ = (
        f"A {benchmark.title} question whose options are all pictures ({benchmark.name}'s rule)."
    )
    return adapt


# How a document is recognised: the keys its schema must have, and the adapter reading it.
ADAPTERS: dict[str, tuple[tuple[str, ...], Callable[[dict[str, Any]], PictureChoice | None]]] = {
    name: (b.harness_keys, _adapter(b)) for name, b in BENCHMARKS.items() if b.harness_keys
}
muirbench, blink = ADAPTERS["muirbench"][1], ADAPTERS["blink"][1]


def picture_choice(doc: dict[str, Any], adapter: str | None = None) -> PictureChoice | None:
    """`doc` as a picture choice by `adapter` (None: the one whose schema it has, if any)."""
    known = (name for name, (keys, _) in ADAPTERS.items() if all(k in doc for k in keys))
    name = adapter or next(known, None)
    return None if name is None else ADAPTERS[name][1](doc)


def undecoded(dataset: Any) -> Any:
    """`dataset` (a datasets.Dataset) with every picture column, or list of pictures, not
    decoded (the storage unchanged), so lad reads the very bytes `lad data muirbench|blink`
    would write out (lad.harness.pictures), and nothing is decoded just to be checked."""
    import datasets

    def plain(feature: Any) -> Any:
        if isinstance(feature, datasets.Image):
            return datasets.Image(decode=False)
        if isinstance(getattr(feature, "feature", None), datasets.Image):
            out = copy.copy(feature)
            out.feature = datasets.Image(decode=False)
            return out
        return feature

    features = dataset.features.copy()
    changed = {k: plain(f) for k, f in features.items()}
    if all(changed[k] is features[k] for k in features):
        return dataset
    return dataset.cast(datasets.Features(changed))
