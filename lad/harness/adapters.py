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
class PictureChoice(Choice):
    """A question whose options are pictures (lad.data.rules.Choice) as a harness document shows
    it: its candidates in presentation order (PIL images, or the dataset's undecoded {"bytes",
    "path"}), its item named as `lad data muirbench|blink` names it (shared by a circular
    variant's shifts), and:

    ordering:   the cyclic shift s of a circular variant's document (0 for the task's own).
    order:      order[p] = index, in the original document's candidate order, of the picture
                shown at p: `cyclic_shift(N, s)`, the identity for the task's own documents.
    """

    ordering: int = 0
    order: list[int] = field(default_factory=list)

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
        shift = int(doc.get("lad_shift") or 0)
        order = cyclic_shift(made.num_candidates, shift)
        choice = PictureChoice(**vars(made), ordering=shift, order=order)
        if doc.get("lad_item") is not None:
            choice.item = str(doc["lad_item"])
        return choice

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
