"""The unit of work: an `Item` (a query and its N candidates: pictures or texts) and a `Request`
(an item shown under one ordering). Their file format and its readers are in lad.data.items;
the orderings a run asks for in lad.data.orders."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple


@dataclass
class Item:
    """One query with its N candidate images. `answer` indexes `images` (0-based).

    question: the item's own question, asked instead of the caption template (None: a caption).
    context_images: pictures of the question that are not candidates, in the order the question
                    shows them (CONTEXT_PLACEHOLDER); never shuffled, never scored.
    """

    id: str
    query: str
    images: list[Path]
    answer: int
    extra: dict[str, Any] = field(default_factory=dict)
    question: str | None = None
    context_images: list[Path] = field(default_factory=list)
    candidates: list[str] = field(default_factory=list)  # text candidates (then `images` is [])

    @property
    def num_candidates(self) -> int:
        return len(self.candidates) if self.candidates else len(self.images)

    @property
    def is_text(self) -> bool:
        """Whether the candidates are texts (`candidates`) rather than pictures (`images`)."""
        return bool(self.candidates)

    @property
    def asked(self) -> str:
        """The text the prompt asks: the item's question if it has one, else its query."""
        return self.question if self.question is not None else self.query

    @property
    def pictures(self) -> list[Path]:
        """Every picture the item's prompts show: the candidates, then the context pictures."""
        return [*self.images, *self.context_images]


class Request(NamedTuple):
    """One prompt to make a record of: `item` shown under `order` (`order[p]` indexes the
    candidate shown at position p); `ordering` is the record's (0 is the identity for shuffles;
    the shift for cyclic requests). A plain `(item, ordering, order)` tuple does as well."""

    item: Item
    ordering: int
    order: list[int]


def repeated_option(texts: list[str]) -> tuple[int, int] | None:
    """The first two text options that read the same once their whitespace is normalised
    (`Paris` and `Paris `), or None: two such options are one answer under two labels, a hidden
    tie no method can score, so every reader and converter of items refuses them."""
    seen: dict[str, int] = {}
    for k, text in enumerate(texts):
        key = " ".join(text.split())
        if key in seen:
            return seen[key], k
        seen[key] = k
    return None
