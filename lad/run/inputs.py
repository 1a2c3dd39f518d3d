"""A run's inputs, read and checked once and handed down: the items of --data and
--calibration-data (`read_data`: each file parsed once), the settings decided from them (|D_cal|,
the vanilla prompt, the repetition penalty: `resolved`), the evaluation and calibration items
(`load_items`) and the requests: `run_items`, made once and handed down to the stages."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np

from lad.data.items import Item, read_items
from lad.data.orders import Request, given_requests, shuffled_requests
from lad.data.shapes import build_shapes
from lad.errors import DataError
from lad.run.config import DEFAULT_CALIBRATION_ITEMS, EvalConfig
from lad.run.rundir import RunDir


@dataclass(frozen=True)
class RunData:
    """A run's input items, each file parsed and checked once (lad.data.items.read_items), then
    handed down: --data's (None: generated shapes) and --calibration-data's (None: none given,
    or a path that is no file, which `load_items` names)."""

    items: list[Item] | None = None
    calibration: list[Item] | None = None


def read_data(config: EvalConfig, items: list[Item] | None = None) -> RunData:
    """The items of --data and --calibration-data, each file read once (`items`: --data's, read
    already)."""
    if items is None and config.data != "shapes":
        items = read_items(config.data)
    source = config.calibration_data
    return RunData(items, read_items(source) if source and Path(source).is_file() else None)


def _with_n(items: list[Item] | None, n: int, path: str) -> list[Item]:
    """`items` (None: unread), each of N candidates; else the file is read to name what is not."""
    fits = items is not None and all(it.num_candidates == n for it in items)
    return items if fits else read_items(path, n)


class RunItems(NamedTuple):
    """A run's evaluation and calibration items (`load_items`) and its evaluation requests: each
    item under the orders of --orders when given (lad.data.orders), else under T seeded
    shuffles. Made once, so the orders file is read once, and a bad one refused with the items."""

    items: list[Item]
    calibration: list[Item]
    requests: list[Request]


def run_items(config: EvalConfig, run_dir: Path, data: RunData | None = None) -> RunItems:
    items, calibration = load_items(config, run_dir, data)
    if config.orders is None:
        requests = shuffled_requests(items, config.num_shuffles, config.seed)
    else:
        requests = given_requests(items, config.orders, config.num_candidates)
    return RunItems(items, calibration, requests)


def resolve_calibration_items(config: EvalConfig, data: RunData) -> tuple[EvalConfig, str | None]:
    """The run with |D_cal| decided: as given (a file holding fewer is then refused), else 5, or
    all the items of a smaller calibration file, which the note returned says."""
    if config.calibration_items is not None:
        return config, None
    on_eval = config.calibrate_on == "evaluation"
    source = config.data if on_eval else config.calibration_data
    items = data.items if on_eval else data.calibration  # None: 'shapes', or a file refused later
    of_n = Counter(it.num_candidates for it in items or ()).values()
    held = min(of_n, default=DEFAULT_CALIBRATION_ITEMS)  # of each N
    if held >= DEFAULT_CALIBRATION_ITEMS:
        return config.replace(calibration_items=DEFAULT_CALIBRATION_ITEMS), None
    note = f"Note: {source} holds {held} calibration items: calibrating on {held}"
    return config.replace(calibration_items=held), note


def resolved(config: EvalConfig, data: RunData) -> EvalConfig:
    """The run of one N with |D_cal| decided, its vanilla template fixed for its evaluation items
    (RecordSpec.for_items), and its repetition penalty a number or None: "model" (--preset
    official) becomes the model's generation_config's, stored in run.json so records, calibration
    and every rescoring agree (RecordSpec.penalty)."""
    config = resolve_calibration_items(config, data)[0]
    if data.items is not None:
        items = _with_n(data.items, config.num_candidates, config.data)
        config = config.replace(prompt_template=config.spec.for_items(items).prompt_template)
    return config.replace(repetition_penalty=config.spec.penalty())


# ---------------------------------------------------------------- data


def load_items(
    config: EvalConfig, run_dir: Path, data: RunData | None = None
) -> tuple[list[Item], list[Item]]:
    """(evaluation items, calibration items). Held out (the default), the two never share an item
    id; with `calibrate_on` "evaluation" the calibration items are the first |D_cal| items of the
    data, which are evaluated too (the official code's choice)."""
    n = config.num_candidates
    on_eval = config.calibrate_on == "evaluation"
    if config.data == "shapes":
        common = {"num_candidates": n, "setting": config.setting, "seed": config.seed}
        folder = RunDir(run_dir).data_folder
        eval_path = build_shapes(folder("eval"), items=config.items or 100, split="eval", **common)
        if on_eval:
            items = read_items(eval_path, n)
            return items, items[: config.calibration_items]
        size = config.calibration_items
        cal_path = build_shapes(folder("calibration"), items=size, split="calibration", **common)
        return read_items(eval_path, n), read_items(cal_path, n)
    data = read_data(config) if data is None else data
    items = _with_n(data.items, n, config.data)
    noun = "evaluation items"  # what --items counts (run.json records the count)
    if on_eval:
        _enough(items, config.calibration_items, config.data)
        evaluated = stated_items(items, config.items, config.data, noun)
        return evaluated, items[: config.calibration_items]
    if config.calibration_data:
        calibration = _with_n(data.calibration, n, config.calibration_data)
        _enough(calibration, config.calibration_items, config.calibration_data)
        _same_kind(items, calibration, config)
    elif config.calibration:
        calibration = []
    else:
        # No separate calibration file: hold out a seeded choice of items from the data.
        if len(items) <= config.calibration_items:
            raise DataError(
                f"{config.data}: {len(items)} items leave none for evaluation after holding out "
                f"--calibration-items {config.calibration_items}; pass --calibration-data"
            )
        rng = np.random.default_rng(config.seed)
        held = set(rng.choice(len(items), config.calibration_items, replace=False).tolist())
        calibration = [it for i, it in enumerate(items) if i in held]
        items = [it for i, it in enumerate(items) if i not in held]
        noun += " left after holding out the calibration items"
    calibration = calibration[: config.calibration_items]
    overlap = {it.id for it in items} & {it.id for it in calibration}
    if overlap:
        raise DataError(
            f"calibration items must be disjoint from evaluation items; shared ids: "
            f"{sorted(overlap)[:5]}"
        )
    return stated_items(items, config.items, config.data, noun), calibration


def stated_items(
    items: list[Item], stated: int | None, path: object, noun: str, default: int | None = None
) -> list[Item]:
    """The first --items `stated` of `items` (unstated: `default`, None: all); a stated count is
    what is used, never silently fewer (lad eval, lad calibrate)."""
    if stated and len(items) < stated:
        unstated = f"up to {default}" if default else "all of them"
        raise DataError(
            f"{path}: holds {len(items)} {noun} but --items asks for {stated}; pass --items "
            f"{len(items)}, or leave it out for {unstated}"
        )
    return items[: stated or default]


def _enough(items: Sequence[Item], wanted: int, path: object) -> None:
    """--calibration-items is what the run calibrates on, never silently fewer."""
    if len(items) < wanted:
        raise DataError(
            f"{path}: holds {len(items)} items but --calibration-items asks for {wanted}; pass "
            f"--calibration-items {len(items)} or a file with more items"
        )


def _same_kind(items: Sequence[Item], calibration: Sequence[Item], config: EvalConfig) -> None:
    """Question items are asked their own question, caption items the caption prompt: a
    calibration of the other kind is fitted under another prompt than the one evaluated."""
    kind = {True: "question items", False: "caption items"}
    asked = {it.question is not None for it in items}
    calibrated = {it.question is not None for it in calibration}
    if len(asked) == 1 and asked != calibrated:  # (mixed --data is refused with its template)
        held = kind[calibrated.pop()] if len(calibrated) == 1 else "question and caption items"
        raise DataError(
            f"--calibration-data {config.calibration_data} holds {held} but --data "
            f"{config.data} holds {kind[asked.pop()]}; calibrate with items of the same kind, "
            "asked with the same prompt"
        )
