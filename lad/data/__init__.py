"""Benchmarks: the items format, orderings, and builders (shapes, MS-COCO, Flickr8k)."""

from lad.data.items import Item, cyclic_shift, read_items, shuffle_orders, write_items
from lad.data.shapes import build_shapes, shapes_vocabulary

__all__ = [
    "Item",
    "build_shapes",
    "cyclic_shift",
    "read_items",
    "shapes_vocabulary",
    "shuffle_orders",
    "write_items",
]
