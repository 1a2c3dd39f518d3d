"""Benchmarks: the items format, orderings, and builders (shapes, MS-COCO, Flickr8k)."""

from lad.data.items import Item, cyclic_shift, read_items, shuffle_orders, write_items

__all__ = ["Item", "cyclic_shift", "read_items", "shuffle_orders", "write_items"]
