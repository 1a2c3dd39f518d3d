"""Predictions: one method's choice for one record, `{"item", "ordering", "method", "prediction",
"scores"}` per line of a `predictions.jsonl` (docs/formats.md).

`predictions_for` turns a method's (R, N) scores into predictions, `write_predictions` /
`read_predictions` move them to and from files, `predictions_by_method` aligns them with records.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from lad.core.records import RecordSet, dumps, jsonl_objects
from lad.errors import RecordError, at
from lad.io.files import check_object, note_input, replacing


@dataclass
class Prediction:
    """One method's choice for one record. `prediction` is a position in that ordering, or -1
    for an unparseable reply (it counts as wrong). `scores` (N,) are the method's scores."""

    item: str
    ordering: int
    method: str
    prediction: int
    scores: list[float]


PREDICTION_KEYS = ("item", "ordering", "method", "prediction", "scores")


def predictions_for(
    records: RecordSet, method: str, scores: np.ndarray, prediction: np.ndarray | None = None
) -> list[Prediction]:
    """Predictions for every record from (R, N) scores (argmax unless `prediction` is given)."""
    pred = scores.argmax(axis=1) if prediction is None else np.asarray(prediction)
    scores = np.asarray(scores)
    return [
        Prediction(item, ordering, method, int(p), s)
        for (item, ordering), p, s in zip(records.keys(), pred, scores.tolist(), strict=True)
    ]


def write_predictions(path: str | Path, predictions: Iterable[Prediction]) -> None:
    with replacing(path) as tmp, tmp.open("wb") as f:
        for p in predictions:
            obj = {**vars(p), "ordering": int(p.ordering), "prediction": int(p.prediction)}
            f.write(dumps({**obj, "scores": [float(x) for x in p.scores]}) + b"\n")


def read_predictions(path: str | Path) -> list[Prediction]:
    """Read and validate a predictions file; a bad line names the file and line."""
    path = Path(path)
    if not path.is_file():
        raise RecordError(f"{path}: no such predictions file")
    note_input(path)
    return [_parse_prediction(obj, at(path, lineno)) for lineno, obj in jsonl_objects(path)]


def _parse_prediction(obj: Any, where: str) -> Prediction:
    kinds = {"item": str, "ordering": int, "method": str, "prediction": int}
    check_object(obj, kinds, where, RecordError, hint=f" (a prediction has {PREDICTION_KEYS})")
    scores = obj.get("scores", [])
    if not isinstance(scores, list) or not all(
        isinstance(x, (int, float)) and not isinstance(x, bool) and np.isfinite(x) for x in scores
    ):
        raise RecordError(f"{where}'scores' must be a list of finite numbers")
    if obj["prediction"] < -1 or (scores and obj["prediction"] >= len(scores)):
        raise RecordError(
            f"{where}'prediction' {obj['prediction']} is not a position (or -1 for unparseable)"
        )
    return Prediction(obj["item"], obj["ordering"], obj["method"], obj["prediction"], scores)


def predictions_by_method(
    records: RecordSet, predictions: Iterable[Prediction], source: object = "predictions"
) -> dict[str, np.ndarray]:
    """{method: (R,) positions (-1 = unparseable)}: exactly one prediction per record and
    method, none for a record not in `records`."""
    index = {key: i for i, key in enumerate(records.keys())}
    n = records.num_candidates
    out: dict[str, np.ndarray] = {}
    for p in predictions:
        i = index.get((p.item, p.ordering))
        if i is None:
            raise RecordError(
                f"{source}: prediction for item {p.item!r}, ordering {p.ordering} matches no record"
            )
        if not -1 <= p.prediction < n:
            raise RecordError(
                f"{source}: prediction {p.prediction} for item {p.item!r} is not in -1..{n - 1}"
            )
        arr = out.setdefault(p.method, np.full(len(records), -2, dtype=np.int64))
        if arr[i] != -2:
            raise RecordError(
                f"{source}: two '{p.method}' predictions for item {p.item!r}, ordering {p.ordering}"
            )
        arr[i] = p.prediction
    for method, arr in out.items():
        missing = np.flatnonzero(arr == -2)
        if missing.size:
            i = int(missing[0])
            item = str(records.items[i])
            raise RecordError(
                f"{source}: method '{method}' has no prediction for item {item!r}, "
                f"ordering {records.ordering[i]} ({missing.size} records lack one)"
            )
    return out
