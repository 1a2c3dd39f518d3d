"""Benchmark items files (docs/formats.md, the format's one description): one JSON object per
line, `{"id", "query", "images" or "candidates", "answer"}` with the optional `question` and
`context_images` (pictures of the question that are never candidates: `answer`, N and every
ordering are about the candidates alone). The reader, its rules (`check_item`, which converters
apply before writing), the writer, and the orderings each item is shown in.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from lad.core.items import Item, repeated_option
from lad.core.labels import MAX_CANDIDATES
from lad.core.prompts import CONTEXT_PLACEHOLDER
from lad.errors import DataError, LadError, at
from lad.io import limits
from lad.io.files import check_object, loads_json, note_input, read_text, replacing


def read_items(path: str | Path, num_candidates: int | None = None) -> list[Item]:
    """Read and validate an items file; relative image paths resolve against its folder, and
    every image must exist. With `num_candidates`, every item must have exactly that many."""
    path = Path(path)
    items: list[Item] = []
    seen: set[str] = set()
    first: dict[bool, int] = {}  # the first line of each kind of item (text or picture)
    for lineno, where, obj in json_lines(path, "items file"):
        items.append(_parse_item(obj, path, where, num_candidates, seen))
        first.setdefault(items[-1].is_text, lineno)
    if not items:
        raise DataError(f"{path}: the items file is empty")
    if len(first) > 1:  # one prompt, one backend load and one calibration kind per file
        raise DataError(
            f"{path}: mixes items of text candidates (first on line {first[True]}) with items "
            f"of picture candidates (first on line {first[False]}); give each kind its own file"
        )
    for image in {p for it in items for p in it.images}:
        note_input(image)
    return items


def json_lines(path: Path, what: str) -> Iterator[tuple[int, str, dict[str, Any]]]:
    """(line number, `where` naming it, its object) of each non-blank line of an items or orders
    file: a JSON object, else a DataError naming the line."""
    for lineno, line in enumerate(read_text(path, DataError, what).split("\n"), 1):
        if not line.strip():
            continue
        where = at(path, lineno)
        try:
            obj = loads_json(line, DataError, where)
        except json.JSONDecodeError as e:
            raise DataError(f"{where}not valid JSON ({e.msg})") from None
        check_object(obj, {}, where, DataError)
        yield lineno, where, obj


# A lone UTF-16 surrogate: JSON allows "\\ud800", UTF-8 cannot write it.
_SURROGATE = re.compile("[\ud800-\udfff]")


def _parse_item(
    obj: dict[str, Any], path: Path, where: str, num_candidates: int | None, seen: set[str]
) -> Item:
    kind_key = _candidates_key(obj, where)
    check_object(obj, {"id": str, "query": str, kind_key: list, "answer": int}, where, DataError)
    check_item(obj, where, num_candidates)
    if obj["id"] in seen:
        raise DataError(f"{where}duplicate item id {obj['id']!r}")
    seen.add(obj["id"])
    extra = {k: v for k, v in obj.items() if k not in ITEM_KEYS}
    if kind_key == "candidates":
        texts, question = obj["candidates"], obj.get("question")
        return Item(obj["id"], obj["query"], [], obj["answer"], extra, question, [], texts)
    images = _resolve_images(obj["images"], path, where)
    context = _resolve_images(obj.get("context_images", []), path, where, "context image")
    return Item(obj["id"], obj["query"], images, obj["answer"], extra, obj.get("question"), context)


class ItemRuleError(DataError):
    """An item that breaks a rule of the items format; `reason` names the rule briefly (how a
    converter counts the questions it skips for it)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def check_item(obj: dict[str, Any], where: str = "", num_candidates: int | None = None) -> None:
    """The items format's rules for one item's JSON object (its keys of the right types), as the
    reader applies them and as converters apply them before writing one: ItemRuleError."""
    kind_key = "candidates" if "candidates" in obj else "images"
    textual, images = kind_key == "candidates", obj[kind_key]
    noun = "texts" if textual else "images"
    if len(images) < 2 or not all(isinstance(p, str) for p in images):
        raise ItemRuleError(
            "fewer than 2 texts" if textual else "fewer than 2 pictures",
            f"{where}{kind_key!r} must be a list of at least 2 {'texts' if textual else 'paths'}",
        )
    texts = [("id", obj["id"]), ("query", obj["query"]), *((kind_key, p) for p in images)]
    if isinstance(obj.get("question"), str):
        texts.append(("question", obj["question"]))
    for key, text in texts:
        if _SURROGATE.search(text):
            raise ItemRuleError(
                "not valid text",
                f"{where}{key!r} holds a lone surrogate escape, not valid text: {text!r}",
            )
    if len(images) > MAX_CANDIDATES:
        raise ItemRuleError(
            f"more than {MAX_CANDIDATES} candidates",
            f"{where}item {obj['id']!r} has {len(images)} candidate {noun}; no label scheme names "
            f"more than {MAX_CANDIDATES}",
        )
    if num_candidates is not None and len(images) != num_candidates:
        raise DataError(
            f"{where}item {obj['id']!r} has {len(images)} {noun} but --num-candidates is "
            f"{num_candidates}"
        )
    if not 0 <= obj["answer"] < len(images):
        raise ItemRuleError(
            "answer not a candidate",
            f"{where}'answer' {obj['answer']} is not an index into its {len(images)} {noun}",
        )
    question = obj.get("question")
    if question is not None and (not isinstance(question, str) or not question.strip()):
        raise ItemRuleError(
            "empty question", f"{where}'question' must be a non-empty string, got {question!r}"
        )
    for key in ("query", "question"):
        if isinstance(obj.get(key), str):
            _check_length(obj[key], f"{where}{key!r}", "question too long")
    if textual:
        check_texts(images, where)
    _context_images(obj, where)


ITEM_KEYS = ("id", "query", "images", "answer", "question", "context_images", "candidates")


def _candidates_key(obj: dict[str, Any], where: str) -> str:
    """ "candidates" for an item of text candidates, else "images"; never both, and a text item
    has no context pictures (its prompt is text only)."""
    if "candidates" not in obj:
        return "images"
    if "images" in obj:
        raise DataError(
            f"{where}an item gives either 'images' (pictures) or 'candidates' (texts), not both"
        )
    if obj.get("context_images"):
        raise DataError(f"{where}an item of text 'candidates' cannot have 'context_images'")
    return "candidates"


def _check_length(text: str, what: str, reason: str) -> None:
    """`text` within the query's length limit (lad.io.limits), else ItemRuleError(reason)."""
    if len(text) > limits.QUERY.value:
        try:
            limits.QUERY.check(len(text), what)
        except LadError as e:
            raise ItemRuleError(reason, str(e)) from None


def check_texts(texts: list[str], where: str, name: str = "'candidates'") -> None:
    """Each text candidate: non-blank, within the query's length limit, no picture place, and
    no two of them the same text (lad.core.items.repeated_option); `name` k is how an error
    names the k-th (0-based)."""
    for k, text in enumerate(texts):
        if not text.strip():
            raise ItemRuleError(
                "option blank", f"{where}{name} {k} is blank; a text candidate needs text"
            )
        if CONTEXT_PLACEHOLDER in text:
            raise ItemRuleError(
                f"option holding {CONTEXT_PLACEHOLDER}",
                f"{where}{name} {k} holds {CONTEXT_PLACEHOLDER}, which marks a picture; "
                "a text candidate is text only",
            )
        _check_length(text, f"{where}{name} {k}", "option too long")
    repeated = repeated_option(texts)
    if repeated is not None:
        a, b = repeated
        raise ItemRuleError(
            "repeated option",
            f"{where}{name} {a} and {b} are the same text ({texts[a]!r}, {texts[b]!r}): "
            "one answer under two labels is a tie no method can score; give distinct options",
        )


def _context_images(obj: dict[str, Any], where: str) -> None:
    """The item's context picture paths, checked against the `<image>` places of its text."""
    context = obj.get("context_images", [])
    if not isinstance(context, list) or not all(isinstance(p, str) for p in context):
        raise DataError(f"{where}'context_images' must be a list of paths, got {context!r}")
    for p in context:
        if _SURROGATE.search(p):
            raise ItemRuleError(
                "not valid text", f"{where}'context_images' holds a lone surrogate escape: {p!r}"
            )
    key = "question" if obj.get("question") is not None else "query"
    places = obj[key].count(CONTEXT_PLACEHOLDER)
    if places not in (0, len(context)):
        raise ItemRuleError(
            f"{CONTEXT_PLACEHOLDER} places not one per context picture",
            f"{where}{key!r} holds {places} {CONTEXT_PLACEHOLDER} places but the item has "
            f"{len(context)} context_images; give one {CONTEXT_PLACEHOLDER} per context picture "
            "(or none: they are then shown before the candidates)",
        )


def _resolve_images(paths: list[str], path: Path, where: str, what: str = "image") -> list[Path]:
    """Paths made absolute against the items file's folder; each must be a file."""
    resolved = [p if Path(p).is_absolute() else path.parent / p for p in map(Path, paths)]
    for p in resolved:
        if p.is_dir():
            raise DataError(f"{where}{what} {p} is a folder, not an image file")
        if not p.is_file():
            raise DataError(f"{where}{what} not found: {p}")
    return resolved


def write_items(path: str | Path, items: Iterable[Item]) -> None:
    """Write items with image paths relative to the file's folder where possible."""
    path = Path(path)
    base = path.parent.resolve()
    with replacing(path) as tmp, tmp.open("w", encoding="utf-8") as f:
        for it in items:
            f.write(json.dumps(item_object(it, base)) + "\n")


def item_object(it: Item, base: Path) -> dict[str, Any]:
    """The JSON object `write_items` writes for `it`, picture paths relative to `base` (the items
    file's folder, resolved) where they lie below it."""
    images = [_relative(p, base) for p in it.images]
    obj: dict[str, Any] = {"id": it.id, "query": it.query, "images": images, "answer": it.answer}
    if it.is_text:
        del obj["images"]
        obj = {**obj, "candidates": list(it.candidates)}
    if it.question is not None:
        obj["question"] = it.question
    if it.context_images:
        obj["context_images"] = [_relative(p, base) for p in it.context_images]
    return {**obj, **it.extra}


def _relative(path: str | Path, base: Path) -> str:
    p = Path(path).resolve()
    return str(p.relative_to(base)) if p.is_relative_to(base) else str(p)


def cyclic_shift(num_candidates: int, shift: int) -> list[int]:
    """Left shift by `shift`: position p shows image (p + shift) mod N (§4.2)."""
    return [(p + shift) % num_candidates for p in range(num_candidates)]


def seeded_rng(seed: int, *keys: object) -> np.random.Generator:
    """A generator keyed by the seed and names, so independent parts never share a stream."""
    text = "\0".join(str(k) for k in (seed, *keys))
    digest = hashlib.sha256(text.encode()).digest()
    return np.random.default_rng(int.from_bytes(digest[:8], "little"))


def shuffle_orders(
    item_id: str, num_candidates: int, num_shuffles: int, seed: int
) -> list[list[int]]:
    """T orderings of one item: the identity first, then distinct random permutations.

    Seeded by (seed, item id), so an item's orderings do not depend on which other items run.
    When T exceeds N! the permutations cannot all be distinct; later ones then repeat.
    """
    rng = seeded_rng(seed, item_id)
    orders = [list(range(num_candidates))]
    distinct = math.factorial(num_candidates)
    while len(orders) < num_shuffles:
        perm = rng.permutation(num_candidates).tolist()
        if perm in orders and len(orders) < distinct:
            continue
        orders.append(perm)
    return orders
