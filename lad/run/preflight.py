"""Checks made before any model work: every argument and input file of a run, and whether a
calibration fits the records it is applied to. A refused run leaves nothing behind."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any, NamedTuple

from lad.backends.archs import attention_layers
from lad.backends.checkpoint import SHIPPED_MODELS, local_config, resolve_model
from lad.backends.text import check_text_options, is_text_model
from lad.backends.threads import requested_threads
from lad.core.calibrate import Calibration
from lad.core.methods import check_top_k
from lad.core.prompts import check_text_labels
from lad.data.items import Item
from lad.errors import RunError
from lad.io.device import resolve_device
from lad.io.files import check_not_inputs, check_output_dir
from lad.io.images import check_images
from lad.run.config import EvalConfig
from lad.run.rundir import RUN_OUTPUTS, RunDir
from lad.run.runjson import file_digest, folder_digest


class Checked(NamedTuple):
    """What `check_inputs` passed: the inputs' digests for run.json (lad.run.runjson.file_digest)
    and the --calibration it read and checked (None: the run fits its own), used as read."""

    inputs: dict[str, Any]
    calibration: Calibration | None


def check_inputs(
    config: EvalConfig, run_dir: Path, items: Sequence[Sequence[Item]] | None
) -> Checked:
    """Check every argument and input file before any model work and before the run directory
    is touched.

    items: the run's (evaluation, calibration) items from an items file (lad.run.inputs.RunItems);
    None for generated data.
    """
    check_output_dir(run_dir)
    if config.device != "auto":  # auto is always usable: torch is not imported for it yet
        resolve_device(config.device, RunError)
    requested_threads(os.environ)  # LAD_NUM_THREADS
    calibration = None
    if config.calibration:
        # Refuse one of another N, Eq. 1 average, model, label scheme, prompt, chat template or
        # image preprocessing, or one that does not say which model, labels and prompt (unless
        # --no-calibration-check); its layer count is checked once records exist.
        calibration = Calibration.load(config.calibration)
        calibration.check_compatible(
            fingerprint=config.spec.fingerprint(config.num_candidates),
            obs_mean=config.obs_mean,
            strict=config.check_calibration,
            require_fingerprint=True,
            where=config.calibration,
        )
        check_top_k(config.top_k, calibration.num_layers, f"the calibration {config.calibration}")
    check_top_k(config.top_k, model_num_layers(resolve_model(config.model)), config.model)
    inputs = {}
    pictures: list[Path] = []  # of every item, context pictures too
    if items is not None:
        eval_items, cal_items = items[:2]
        check_kind(config, eval_items + cal_items)
        check_images(eval_items + cal_items)
        listed = {"data": eval_items + ([] if config.calibration_data else cal_items)}
        if config.calibration_data:
            listed["calibration_data"] = cal_items
        for name, its in listed.items():
            of = [p for it in its for p in it.pictures]
            inputs[name] = file_digest(getattr(config, name), of)
            pictures += of
    for name in ("calibration", "orders", "chat_template"):
        if getattr(config, name) and Path(getattr(config, name)).is_file():
            inputs[name] = file_digest(getattr(config, name))
    files = {name: getattr(config, name) for name in inputs}
    inputs.update(model_digest(config.model))
    outputs = {f"--out {run_dir}/{name}": run_dir / name for name in RUN_OUTPUTS}
    check_not_inputs(outputs, {"--" + k.replace("_", "-"): v for k, v in files.items()})
    run = RunDir(run_dir)
    for path in [*files.values(), *pictures]:
        if run.writes(path):
            raise RunError(
                f"{path}: is a file lad eval writes in its run directory {run_dir} (its records, "
                "metrics or report), so it cannot be one of the run's inputs; move it elsewhere"
            )
    return Checked(inputs, calibration)


def model_digest(model: str) -> dict[str, Any]:
    """run.json's "inputs" entry of a local --model folder (lad.run.runjson.folder_digest), so
    a rerun after its weights or configs changed is refused; none for a shipped model (its
    identity is lad's version) or a hub id (its name)."""
    if model in SHIPPED_MODELS or not Path(model).is_dir():
        return {}
    return {"model": folder_digest(model)}


def check_kind(config: EvalConfig, items: Sequence[Item]) -> None:
    """Text options need text labels; picture candidates and picture options need a model that
    sees pictures (a local checkpoint's config.json says; a hub id is checked when it loads)."""
    if any(it.is_text for it in items):
        check_text_labels(config.scheme)
    fields = local_config(resolve_model(config.model), RunError)
    if not fields or not is_text_model(SimpleNamespace(**fields)):
        return
    pictures = next((it.id for it in items if not it.is_text), None)
    if pictures is not None:
        raise RunError(
            f"--model {config.model} is a text-only causal LM ({fields.get('model_type')}), but "
            f"item {pictures!r} of the data has picture candidates; give items with text "
            "'candidates' or a multimodal model"
        )
    check_text_options(dict(config.image_options), config.image_size)


def model_num_layers(model: str) -> int | None:
    """The language decoder's layer count (of layers with softmax attention, a record's rows:
    lad.backends.archs.attention_layers) from a local checkpoint's config.json (None for a hub
    id: it is then checked when the records exist)."""
    config = local_config(model, RunError) or {}
    text = config.get("text_config") or config
    layers = text.get("num_hidden_layers") if isinstance(text, dict) else None
    return len(attention_layers(text)) if isinstance(layers, int) else None
