"""Records as Parquet: columns item, ordering, order, answer, logprobs, attention
(list<list<double>>), extra (a JSON string per row).

This module moves the columns; `lad.core.records` builds and validates the RecordSet from them,
so `read_records` / `write_records` stay the one way in and out.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import orjson

from lad.errors import RecordError


def row_where(path: Path):
    """The prefix of a message about one row (0-based `i`) of the file."""
    return lambda i: f"{path}: row {i + 1}: "


def write_parquet(path: Path, records: Any) -> None:  # a lad.core.records.RecordSet
    import pyarrow as pa
    import pyarrow.parquet as pq

    r, n, nl = len(records), records.num_candidates, records.num_layers

    def lists(values: pa.Array, rows: int, width: int) -> pa.ListArray:
        offsets = pa.array(np.arange(0, rows * width + 1, width, dtype=np.int32))
        return pa.ListArray.from_arrays(offsets, values)

    layer_rows = lists(pa.array(records.attention.reshape(-1)), r * nl, n)  # (R*L) lists of N
    extra = [orjson.dumps(e, option=orjson.OPT_SERIALIZE_NUMPY).decode() for e in records.extra]
    table = pa.table(
        {
            "item": pa.array(records.items.tolist(), type=pa.string()),
            "ordering": records.ordering,
            "order": lists(pa.array(records.order.reshape(-1)), r, n),
            "answer": records.answer,
            "logprobs": lists(pa.array(records.logprobs.reshape(-1)), r, n),
            "attention": lists(layer_rows, r, nl),
            "extra": pa.array(extra, type=pa.string()),
        }
    )
    pq.write_table(table, path)


def read_columns(path: Path, columns: tuple[str, ...]) -> dict[str, Any] | None:
    """The RecordSet fields of a parquet records file with these `columns`, as arrays (None for
    no rows); lengths are checked here, values by `lad.core.records.validate`."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except (pa.ArrowInvalid, OSError) as e:
        raise RecordError(f"{path}: not a readable parquet file ({e})") from None
    missing = [k for k in columns if k not in table.column_names]
    if missing:
        raise RecordError(f"{path}: parquet records lack column(s) {missing}")
    if table.num_rows == 0:
        return None

    def fixed(name: str, depth: int) -> tuple[np.ndarray, list[int]]:
        """Flatten a (nested) list column, checking every row has the same length per level."""
        col = table.column(name).combine_chunks()
        widths = []
        for _ in range(depth):
            if col.null_count:
                raise RecordError(f"{row_where(path)(0)}{name!r} has missing values")
            lengths = np.diff(col.offsets.to_numpy())
            bad = np.flatnonzero(lengths != lengths[0])
            if bad.size:
                raise RecordError(f"{path}: {name!r} lists differ in length (entry {bad[0] + 1})")
            widths.append(int(lengths[0]))
            col = col.flatten()
        return col.to_numpy(zero_copy_only=False), widths

    order, (n,) = fixed("order", 1)
    logprobs, (n2,) = fixed("logprobs", 1)
    attention, (nl, n3) = fixed("attention", 2)
    if not n == n2 == n3:
        raise RecordError(f"{path}: 'order', 'logprobs' and 'attention' disagree on N")
    try:
        extra = [orjson.loads(s) if s else {} for s in table.column("extra").to_pylist()]
    except orjson.JSONDecodeError as e:
        raise RecordError(f"{path}: column 'extra' must hold JSON objects ({e})") from None
    return {
        "items": np.array(table.column("item").to_pylist(), dtype=str),
        "ordering": table.column("ordering").to_numpy().astype(np.int64),
        "order": order.astype(np.int64).reshape(-1, n),
        "answer": table.column("answer").to_numpy().astype(np.int64),
        "logprobs": logprobs.astype(np.float64).reshape(-1, n),
        "attention": attention.astype(np.float64).reshape(-1, nl, n),
        "extra": extra,
    }
