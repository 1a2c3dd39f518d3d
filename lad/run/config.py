"""What `lad eval` takes: `EvalConfig`, checked when it is made, and the few facts every part of a
run derives from it (the prompt's fingerprint, the preprocessing, the model's path)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lad.backends.checkpoint import check_repetition_penalty
from lad.core.labels import get_scheme
from lad.core.methods import METHODS, MethodOptions
from lad.core.prompts import CAPTION, PromptTemplate, check_template, prompt_sha256
from lad.errors import RunError
from lad.io.limits import check_image_flags

DEFAULT_METHODS = ("vanilla", "pride", "lad", "attn", "attn-purified", "perm-avg")
# Where the calibration items come from: held out from the evaluation items (the paper, §4.2),
# or the first |D_cal| evaluation items, scored too (the official code).
CALIBRATE_ON = ("held-out", "evaluation")


@dataclass(frozen=True)
class EvalConfig:
    """Everything `lad eval` takes. Fields in `RECORD_FIELDS` define the records; the rest only
    change how stored records are scored, so they may differ on a rerun."""

    model: str = "demo"
    data: str = "shapes"
    num_candidates: int = 4
    setting: str = "random"
    items: int | None = None
    calibration_data: str | None = None
    calibration: str | None = None
    calibration_items: int = 5
    num_shuffles: int = 5
    seed: int = 0
    labels: str = "digits"
    batch_size: int = 4
    device: str = "auto"
    dtype: str = "auto"
    methods: tuple[str, ...] = DEFAULT_METHODS
    top_k: int = 2
    tau: float = 5.0
    quiet: bool = False
    image_options: dict[str, Any] = field(default_factory=dict)
    max_new_tokens: int = 1024
    sc_samples: int = 10
    sc_temperature: float = 0.7
    sc_top_k: int = 40
    sofa_sigma: float | str = 0.5
    sofa_within_image: bool = False
    prompt_template: str | None = (
        None  # the vanilla template's text (lad.core.prompts); None: built-in
    )
    calibration_check: bool = True  # refuse a calibration of another model, scheme or prompt
    # How records are made (docs/methods.md, "The official code's variants").
    image_size: int | None = None  # every picture resized to this square first (official: 336)
    orders: str | None = None  # jsonl of (item, order): the orderings to evaluate, not shuffles
    calibrate_on: str = "held-out"  # or "evaluation": the first |D_cal| evaluation items
    # How stored records are scored (MethodOptions; obs_mean also how calibration.json is fitted).
    obs_mean: str = "prob"
    mixture: str = "prob"
    attn_mean: str = "log"
    layer_range: tuple[int, int] | None = None
    chat_template: str | None = None  # a Jinja file replacing the checkpoint's chat template
    # The label steps' logits penalised as `generate` does (docs/methods.md); "model": the
    # model's generation_config's (resolve_repetition_penalty), None: no penalty.
    repetition_penalty: float | str | None = None

    RECORD_FIELDS = (
        "model",
        "data",
        "num_candidates",
        "setting",
        "items",
        "calibration_data",
        "calibration",
        "calibration_items",
        "num_shuffles",
        "seed",
        "labels",
        "batch_size",
        "device",
        "dtype",
        "image_options",
        "max_new_tokens",
        "sc_samples",
        "sc_temperature",
        "sc_top_k",
        "sofa_sigma",
        "sofa_within_image",
        "prompt_template",
        "image_size",
        "orders",
        "calibrate_on",
        "chat_template",
        "repetition_penalty",
    )

    def __post_init__(self) -> None:
        unknown = [m for m in self.methods if m not in METHODS]
        if unknown or not self.methods:
            raise RunError(
                f"--methods must name methods of {', '.join(METHODS)}. "
                f"Got {', '.join(unknown) if unknown else 'none'}."
            )
        if self.items is not None and self.items < 1:
            raise RunError(f"--items must be >= 1 (leave it out for all items). Got {self.items}.")
        if self.num_candidates < 2:
            raise RunError(f"--num-candidates must be >= 2. Got {self.num_candidates}.")
        get_scheme(self.labels).labels(self.num_candidates)  # N beyond the scheme: before work
        if self.num_shuffles < 1 or self.calibration_items < 1 or self.batch_size < 1:
            raise RunError("--num-shuffles, --calibration-items and --batch-size must be >= 1")
        if self.max_new_tokens < 1 or self.sc_samples < 1 or self.sc_top_k < 0:
            raise RunError("--max-new-tokens and --sc-samples must be >= 1, --sc-top-k >= 0")
        if not self.sc_temperature > 0:
            raise RunError(f"--sc-temperature must be > 0. Got {self.sc_temperature}.")
        sigma = self.sofa_sigma
        if sigma != "auto" and not (
            isinstance(sigma, (int, float)) and not isinstance(sigma, bool) and 0 <= sigma <= 1
        ):
            raise RunError(f"--sofa-sigma must be a number in [0, 1] or 'auto'. Got {sigma!r}.")
        if self.prompt_template is not None:
            check_template(self.prompt_template, "--prompt-template")
        if self.setting not in ("random", "adversarial"):
            raise RunError(f"--setting must be random or adversarial. Got {self.setting!r}.")
        if self.calibrate_on not in CALIBRATE_ON:
            raise RunError(
                f"--calibrate-on must be one of {', '.join(CALIBRATE_ON)}. "
                f"Got {self.calibrate_on!r}."
            )
        if self.calibrate_on == "evaluation" and (self.calibration_data or self.calibration):
            raise RunError(
                "--calibrate-on evaluation calibrates on the first evaluation items; it cannot "
                "be combined with --calibration-data or --calibration"
            )
        size = self.image_size
        if size is not None and (not isinstance(size, int) or isinstance(size, bool) or size < 1):
            raise RunError(f"--image-size must be a positive number of pixels. Got {size!r}.")
        check_repetition_penalty(self.repetition_penalty)
        check_image_flags(size, self.image_options)
        _ = self.method_options  # MethodOptions checks the scoring options before any work

    def identity(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.RECORD_FIELDS}

    @property
    def method_options(self) -> MethodOptions:
        return MethodOptions(
            top_k=self.top_k,
            tau=self.tau,
            obs_mean=self.obs_mean,
            mixture=self.mixture,
            attn_mean=self.attn_mean,
            layer_range=None if self.layer_range is None else tuple(self.layer_range),
            labels=self.labels,
        )

    @property
    def template(self) -> str | PromptTemplate:
        """The records' prompt: the given template, else the built-in by name (lad.core.prompts)."""
        return "vanilla" if self.prompt_template is None else PromptTemplate(self.prompt_template)


def config_from_dict(values: dict[str, Any]) -> EvalConfig:
    names = {f.name for f in dataclasses.fields(EvalConfig)}
    return EvalConfig(**{k: v for k, v in values.items() if k in names})


def run_prompt_sha256(prompt_template: str | None, scheme: Any, num_candidates: int) -> str:
    """The fingerprint of a run's vanilla prompt (`prompt_template` as in EvalConfig)."""
    template = CAPTION if prompt_template is None else PromptTemplate(prompt_template)
    return prompt_sha256(template, scheme, num_candidates)


def run_preprocessing(
    arguments: Mapping[str, Any], inputs: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """calibration.json's "preprocessing" (lad.core.calibrate.PREPROCESSING) of records made with
    `arguments`' chat_template, image_size and image_options (EvalConfig.identity(), run.json's
    "arguments", a Debiaser's settings).

    The chat template is the SHA-256 of its file's bytes (None: the checkpoint's own): run.json's
    fingerprint of it where `inputs` (run.json's "inputs") holds one, so a finished run rescores
    without the file, else the file's; left out (unknown, not compared) when neither exists.
    """
    out: dict[str, Any] = {}
    template = arguments.get("chat_template")
    if template is None:
        out["chat_template_sha256"] = None
    else:
        sha = ((inputs or {}).get("chat_template") or {}).get("sha256")
        if sha is None and Path(template).is_file():
            sha = hashlib.sha256(Path(template).read_bytes()).hexdigest()
        if sha is not None:
            out["chat_template_sha256"] = sha
    out["image_size"] = arguments.get("image_size")
    options = dict(arguments.get("image_options") or {})
    out["image_options"] = json.loads(json.dumps(options, sort_keys=True))  # as the file holds it
    penalty = arguments.get("repetition_penalty")
    if penalty is not None and penalty != 1:  # absent: none (files from before it existed agree)
        out["repetition_penalty"] = penalty
    return out
