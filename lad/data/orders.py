"""The unit of work, `Request` (an item under one ordering), and the orderings a run asks for:
lad's seeded shuffles (§5.2), the N cyclic shifts of calibration and perm-avg (§4.2), or
explicit orderings (`lad eval --orders FILE`, docs/formats.md), exactly the image orders another
tool used: one jsonl line per (item, ordering), `{"item", "order"}` and optionally `"ordering"`;
other keys are ignored, so a lad `records.jsonl` is itself an orders file.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lad.core.items import Item, Request
from lad.data.items import cyclic_shift, json_lines, shuffle_orders
from lad.errors import DataError


def shuffled_requests(items: Sequence[Item], num_shuffles: int, seed: int) -> list[Request]:
    """Each item under T orderings: the identity first, then seeded random permutations (§5.2)."""
    return _requests(
        items, [shuffle_orders(it.id, it.num_candidates, num_shuffles, seed) for it in items]
    )


def cyclic_requests(items: Sequence[Item]) -> list[Request]:
    """Each item under all N cyclic left-shifts: the symmetrised set of §4.2 (and of perm-avg)."""
    sizes = [it.num_candidates for it in items]
    return _requests(items, [[cyclic_shift(n, s) for s in range(n)] for n in sizes])


def given_requests(items: Sequence[Item], path: str | Path, num_candidates: int) -> list[Request]:
    """Each item under the orderings an orders file gives it (`lad eval --orders FILE`); every
    item must have some, and all the same number T (Acc is per ordering index, §5.2). Orders of
    items not evaluated are ignored."""
    orders = read_orders(path, num_candidates)
    missing = [it.id for it in items if it.id not in orders]
    if missing:
        raise DataError(
            f"{path}: no orders for {len(missing)} evaluation item(s), e.g. {missing[:3]}; "
            "its 'item' values must be the items' ids"
        )
    counts = {len(orders[it.id]) for it in items}
    if len(counts) > 1:
        few = min(items, key=lambda it: len(orders[it.id]))
        raise DataError(
            f"{path}: items have different numbers of orderings ({sorted(counts)}; e.g. "
            f"{few.id!r} has {len(orders[few.id])}); every evaluation item needs the same T"
        )
    return _requests(items, [orders[it.id] for it in items])


def _requests(items: Sequence[Item], orders: Sequence[list[list[int]]]) -> list[Request]:
    """Each item under its orders, numbered in their order."""
    return [
        Request(item, t, order)
        for item, mine in zip(items, orders, strict=True)
        for t, order in enumerate(mine)
    ]


def read_orders(path: str | Path, num_candidates: int) -> dict[str, list[list[int]]]:
    """{item id: its orders, by ordering number}; every order is a permutation of 0..N-1."""
    path = Path(path)
    numbered: dict[str, dict[int, list[int]]] = {}
    has_ordering: set[bool] = set()
    for _, where, obj in json_lines(path, "orders file"):
        item, ordering, order = _parse_line(obj, where, num_candidates)
        has_ordering.add(ordering is not None)
        if len(has_ordering) > 1:
            raise DataError(
                f"{where}give an 'ordering' on every line or on none "
                "(without it an item's orderings are numbered in file order)"
            )
        mine = numbered.setdefault(item, {})
        ordering = len(mine) if ordering is None else ordering
        if ordering in mine:
            raise DataError(f"{where}item {item!r} has ordering {ordering} twice")
        mine[ordering] = order
    if not numbered:
        raise DataError(f"{path}: the orders file is empty")
    for item, mine in numbered.items():
        if sorted(mine) != list(range(len(mine))):
            raise DataError(
                f"{path}: item {item!r} has orderings {sorted(mine)}; they must be 0..T-1"
            )
    return {item: [mine[t] for t in sorted(mine)] for item, mine in numbered.items()}


def _parse_line(
    obj: dict[str, Any], where: str, num_candidates: int
) -> tuple[str, int | None, list[int]]:
    for key in ("item", "order"):
        if key not in obj:
            raise DataError(f"{where}missing key {key!r}")
    item, order, ordering = obj["item"], obj["order"], obj.get("ordering")
    if not isinstance(item, str):
        raise DataError(f"{where}'item' must be an item id (a string), got {item!r}")
    if not (
        isinstance(order, list)
        and all(isinstance(i, int) and not isinstance(i, bool) for i in order)
        and sorted(order) == list(range(num_candidates))
    ):
        raise DataError(
            f"{where}'order' {order!r} is not a permutation of 0..{num_candidates - 1} "
            f"(N = {num_candidates})"
        )
    if ordering is not None and (type(ordering) is not int or ordering < 0):
        raise DataError(f"{where}'ordering' must be an integer >= 0, got {ordering!r}")
    return item, ordering, order
