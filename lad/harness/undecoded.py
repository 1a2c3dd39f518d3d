"""A harness dataset with its pictures left as the dataset stores them ({"bytes", "path"}), so
lad reads the very bytes `lad data muirbench|blink` would write out (lad.harness.pictures), and
nothing is decoded just to be checked."""

from __future__ import annotations

import copy
from typing import Any


def undecoded(dataset: Any) -> Any:
    """`dataset` (a datasets.Dataset) with every picture column, or list of pictures, not
    decoded; the storage is unchanged."""
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
