"""Circular variants of the picture-option tasks, for any model (task YAMLs in
lad/harness/tasks, loaded with `--include_path`; docs/harness.md).

`process_docs` keeps a task's picture questions (lad.harness.adapters) and asks each under all N
cyclic shifts of its option pictures (lad.data.items.cyclic_shift; the answer letter moves with
its picture), each document gaining `lad_item` and `lad_shift`; the `*_docs_repeated` variants
ask every shift twice (`lad_repeat` 1), for a sampling model's noise floor. `*_results` run the
task's own process_results unchanged and add lad's audit row (lad.harness.audit), which the
`lad_*` aggregations turn into lad's metrics in lmms-eval's table.
"""

from __future__ import annotations

import string
from collections.abc import Callable
from typing import Any

from lad.core.prompts import CONTEXT_PLACEHOLDER
from lad.data.blink import PICTURE_FIELDS as BLINK_PICTURES
from lad.data.items import cyclic_shift
from lad.data.mmiu import ordinal_image
from lad.harness.adapters import PictureChoice, picture_choice, undecoded
from lad.harness.audit import pooled

# lad's metrics in each harness's results (Inspect's too: lad.harness.inspect_audit), each the
# metrics.json key it pools over N. Acc (%): accuracy per shift, averaged over the shifts; RStd:
# the std of the recall at each answer position; Cons. (%): questions whose chosen option is the
# same under every shift (for a pair: the share of agreeing judgments); flip rate (%): the share
# of pairs of shifts of a question whose choices differ; CircularEval accuracy (%): questions
# right under every shift.
AUDIT_METRICS = {
    "lad_acc": "acc",
    "lad_rstd": "rstd",
    "lad_cons": "cons",
    "lad_flip": "flip_rate",
    "lad_circular": "circular_acc",
}


def _expand(dataset: Any, adapter: str, repeats: int = 1):
    """Each picture question of `dataset` (a datasets.Dataset) under all N cyclic shifts
    (`_SHIFTED[adapter]`), each shift `repeats` times (documents in a row, `lad_repeat` 0, 1, …
    when more than once); the pictures' bytes are moved, never re-encoded."""
    shifted = _SHIFTED[adapter]
    rows = []
    for doc in undecoded(dataset):
        choice = picture_choice(doc, adapter)
        if choice is None or choice.answer is None:
            continue
        for s in range(choice.num_candidates):
            row = {**shifted(dict(doc), choice, s), "lad_item": choice.item, "lad_shift": s}
            rows += [row] if repeats == 1 else [{**row, "lad_repeat": r} for r in range(repeats)]
    return shifted_dataset(dataset, rows, repeats > 1)


def shifted_dataset(dataset: Any, rows: list[dict], repeated: bool = False) -> Any:
    """`rows` as a datasets.Dataset of `dataset`'s features and lad's (`lad_item`, `lad_shift`,
    and `lad_repeat` when `repeated`)."""
    import datasets

    features = dataset.features.copy()
    features["lad_item"] = datasets.Value("string")
    features["lad_shift"] = datasets.Value("int64")
    if repeated:
        features["lad_repeat"] = datasets.Value("int64")
    return datasets.Dataset.from_list(rows, features=features)


def _muirbench_shift(doc: dict, choice: PictureChoice, s: int) -> dict:
    n = choice.num_candidates
    q = doc["question"].count(CONTEXT_PLACEHOLDER)
    options = doc["image_list"][q:]
    order = cyclic_shift(n, s)
    doc["image_list"] = doc["image_list"][:q] + [options[i] for i in order]
    doc["answer"] = string.ascii_uppercase[order.index(choice.answer)]
    return doc


def _blink_shift(doc: dict, choice: PictureChoice, s: int) -> dict:
    # A picture question (lad.data.blink's rule): each choice names one picture, image_k.
    named = [BLINK_PICTURES[ordinal_image(c)] for c in doc["choices"]]
    keys = sorted(named, key=BLINK_PICTURES.index)  # positions: BLINK's picture order
    order = cyclic_shift(choice.num_candidates, s)
    pictures = [doc[k] for k in keys]
    doc.update({key: pictures[i] for key, i in zip(keys, order, strict=True)})
    doc["answer"] = f"({string.ascii_uppercase[named.index(keys[order.index(choice.answer)])]})"
    return doc


# Each adapter's document under the cyclic shift s of its option pictures.
_SHIFTED = {"muirbench": _muirbench_shift, "blink": _blink_shift}


def audit_row(doc: dict, positions: list[int], parsed: str) -> dict[str, Any]:
    """The row lad's metrics read, from a circular document's text fields alone (lmms-eval
    hands process_results its documents without their pictures). positions[c] is the position
    of the picture option letter c names; `parsed` is the letter the task's parser found ("" or
    anything else: none)."""
    letters = string.ascii_uppercase[: len(positions)]
    answer = str(doc["answer"]).strip().strip("()")
    prediction = positions[letters.index(parsed)] if len(parsed) == 1 and parsed in letters else -1
    row = shifted_row(doc, len(positions), positions[letters.index(answer)], prediction)
    repeat = int(doc.get("lad_repeat") or 0)
    return {**row, "repeat": repeat} if repeat else row


def shifted_row(doc: dict, n: int, answer: int, prediction: int) -> dict[str, Any]:
    """The audit row of a circular document of N options (lad.harness.audit.ROW_KEYS)."""
    return {
        "item": str(doc["lad_item"]),
        "ordering": int(doc["lad_shift"]),
        "order": cyclic_shift(n, int(doc["lad_shift"])),
        "answer": answer,
        "prediction": prediction,
    }


def blink_positions(choices: list[str]) -> list[int]:
    """positions[c]: where the picture choice c names is shown (BLINK's picture order)."""
    named = [ordinal_image(str(c)) for c in choices]
    return [sorted(named).index(k) for k in named]


def with_audit(scored: dict[str, Any], row: dict[str, Any]) -> dict[str, Any]:
    """A document's results `scored` and its audit row under each lad metric."""
    return {**scored, **{name: row for name in AUDIT_METRICS}}


def muirbench_results(doc: dict, results: list[str]) -> dict[str, Any]:
    from lmms_eval.tasks.muirbench.utils import muir_process_results

    scored = muir_process_results(doc, results)
    # The task counts a reply right when it equals the answer letter (case and spaces aside).
    parsed = str(scored["muirbench_score_overall"]["pred"]).strip().upper()
    return with_audit(scored, audit_row(doc, list(range(len(doc["options"]))), parsed))


def blink_results(doc: dict, results: list[str]) -> dict[str, Any]:
    from lmms_eval.tasks.blink.utils import blink_process_results

    scored = blink_process_results(doc, results)
    parsed = scored["blink_acc"]["pred_parsed"]
    return with_audit(scored, audit_row(doc, blink_positions(doc["choices"]), parsed))


def _yaml_function(name: str, body: Callable[..., Any], *args: Any) -> Callable[[Any], Any]:
    """The task YAMLs' `!function` `name` (so named in lmms-eval's config): `body(x, *args)`."""

    def function(x: Any) -> Any:
        return body(x, *args)

    function.__name__ = function.__qualname__ = name
    return function


# process_docs: each picture question under all N shifts (`_repeated`: each shift twice).
muirbench_docs = _yaml_function("muirbench_docs", _expand, "muirbench")
blink_docs = _yaml_function("blink_docs", _expand, "blink")
muirbench_docs_repeated = _yaml_function("muirbench_docs_repeated", _expand, "muirbench", 2)
blink_docs_repeated = _yaml_function("blink_docs_repeated", _expand, "blink", 2)
# The aggregations of AUDIT_METRICS: `pooled` of each one's metric, over every N.
lad_acc, lad_rstd, lad_cons, lad_flip, lad_circular = (
    _yaml_function(name, pooled, key) for name, key in AUDIT_METRICS.items()
)
