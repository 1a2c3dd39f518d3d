"""What `lad eval` takes: `EvalConfig`, checked when it is made, and the few facts every part of a
run derives from it (the prompt's fingerprint, the preprocessing, the model's path)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from lad.backends.engines import ENGINES, check_engine
from lad.core.methods import METHODS, MethodOptions, broken_bound, flag
from lad.core.prompts import PromptTemplate
from lad.data.builders import SETTINGS  # the shapes benchmark's settings
from lad.errors import RunError
from lad.io import limits
from lad.io.files import InputPath
from lad.run.presets import with_preset
from lad.run.spec import RecordSpec

DEFAULT_METHODS = ("vanilla", "pride", "blank", "lad", "attn", "attn-purified", "perm-avg")
# Where the calibration items come from: held out from the evaluation items (the paper, §4.2),
# or the first |D_cal| evaluation items, scored too (the official code).
CALIBRATE_ON = ("held-out", "evaluation")
DEFAULT_CALIBRATION_ITEMS = 5  # |D_cal| of the paper (§4.2)


# A field that only changes how stored records are scored (or what is printed): it may differ on
# a rerun. Every other field defines the records and is kept in run.json's "arguments".
SCORING = {"scoring": True}


@dataclass(frozen=True)
class EvalConfig:
    """Everything `lad eval` takes: the record spec (`spec`, lad.run.spec.RecordSpec), the plan
    of the run (which items under which orderings, in which batches), and how stored records are
    scored (`options`, lad.core.methods.MethodOptions). Each field of the spec and the options
    reads as the config's own (`config.model`, `config.top_k`); `eval_config` makes one from
    them all by name. `RECORD_FIELDS` are the fields that define the records."""

    spec: RecordSpec = field(default_factory=RecordSpec)
    # The plan.
    data: str = flag("shapes", "items .jsonl file, or 'shapes'")
    num_candidates: int = flag(
        4,
        "N candidates per query (images or text options)",
        flags=("--num-candidates", "-n"),
        minimum=2,
    )
    setting: str = flag("random", "shapes benchmark setting (for --data shapes)", choices=SETTINGS)
    items: int | None = flag(None, "evaluation items (default: all; 100 for shapes)", minimum=1)
    calibration_data: str | None = flag(None, "items file for calibration", type=InputPath)
    calibration: str | None = flag(None, "a saved calibration.json", type=InputPath)
    # |D_cal|; None: 5, or all the items of a smaller calibration file (resolve_calibration_items)
    calibration_items: int | None = flag(
        None,
        "|D_cal| (default: 5, or all a smaller calibration file holds); calibration.jsonl "
        "keeps them all, so lad ablate can draw subsets",
        minimum=1,
    )
    num_shuffles: int = flag(5, "T orderings per item", minimum=1, limit=limits.SHUFFLES)
    seed: int = flag(0, "seed of the shuffles and of the shapes benchmark", type=int)
    batch_size: int = flag(4, "prompts per forward pass", minimum=1, limit=limits.BATCH)
    device: str = flag("auto", "auto, cpu, cuda or cuda:N")
    dtype: str = flag(
        "auto",
        "weights' dtype (auto: bfloat16 on a GPU, float32 on a CPU)",
        choices=("auto", "bfloat16", "float16", "float32"),
    )
    engine: str = flag(  # what makes the records (lad.backends.engines)
        "hf",
        "what makes the records: hf (transformers) or vllm (docs/backends.md)",
        choices=tuple(ENGINES),
    )
    max_new_tokens: int = flag(
        1024,
        "reply length limit (instruction, cot, self-consistency)",
        minimum=1,
        limit=limits.NEW_TOKENS,
    )
    sc_samples: int = flag(10, "self-consistency paths", minimum=1, limit=limits.SC_SAMPLES)
    sc_temperature: float = flag(0.7, "self-consistency sampling temperature, > 0", above=0.0)
    sc_top_k: int = flag(40, "self-consistency top-k (0: all tokens)", minimum=0)
    sofa_sigma: float | str = flag(
        0.5, "SoFA weight σ of future image tokens, or 'auto' (grid on calibration items)"
    )
    sofa_within_image: bool = flag(
        False,
        "SoFA also opens later tokens of the same image (else across images only)",
        action="store_true",
    )
    orders: str | None = flag(
        None,
        "jsonl of {item, order}: evaluate exactly these orderings (a records.jsonl works)",
        type=InputPath,
        metavar="FILE",
    )
    calibrate_on: str = flag(
        "held-out",
        "calibration items held out from --data (paper; default) or the first "
        "--calibration-items evaluation items, scored too (official code; warns)",
        choices=CALIBRATE_ON,
    )
    # How stored records are scored (obs_mean also how calibration.json is fitted); its labels
    # are always the spec's.
    options: MethodOptions = field(default_factory=MethodOptions, metadata=SCORING)
    methods: tuple[str, ...] = field(default=DEFAULT_METHODS, metadata=SCORING)
    quiet: bool = field(default=False, metadata=SCORING)
    check_calibration: bool = flag(  # refuse a calibration of another model, scheme, prompt
        True,
        "use a calibration made with another model, label scheme or prompt template, or "
        "one that does not say which (N and the layer count are still checked)",
        flags=("--no-calibration-check",),
        action="store_false",
        **SCORING,
    )

    def __getattr__(self, name: str) -> Any:
        """A field of the spec (or its label scheme) or of the options, as the config's own."""
        part = "spec" if name in (*SPEC_FIELDS, "scheme") else None
        part = "options" if name in OPTION_FIELDS else part
        if part is None:
            raise AttributeError(name)
        return getattr(object.__getattribute__(self, part), name)

    def replace(self, **changes: Any) -> EvalConfig:
        """The config with `changes`, each a field of the config, its spec or its options."""
        return _make(changes, self)

    def __post_init__(self) -> None:
        check_methods(self.methods)
        for f in dataclasses.fields(self):  # the bounds its flags declare, as the CLI checks them
            value = getattr(self, f.name)
            flag = f.metadata.get("flags", ("--" + f.name.replace("_", "-"),))[0]
            broken = broken_bound(value, f.metadata)
            if broken:
                noun = "" if broken.startswith(">=") else "a number "
                raise RunError(f"{flag} must be {noun}{broken}. Got {value}.")
            if "limit" in f.metadata:  # a setting that sizes the model work (lad.io.limits)
                f.metadata["limit"].check(value, f"{flag} {value}")
        self.scheme.labels(self.num_candidates)  # N beyond the scheme: before work
        if self.data == "shapes":  # drawn into the run, after begin
            cal_items = 1 if self.calibration_items is None else self.calibration_items
            drawn = None if self.calibration_data or self.calibration else cal_items
            for option, value in (("--items", self.items), ("--calibration-items", drawn)):
                if value is not None:
                    limits.GENERATED_ITEMS.check(value, f"{option} {value}")
        sigma = self.sofa_sigma
        if sigma != "auto" and not (
            isinstance(sigma, (int, float)) and not isinstance(sigma, bool) and 0 <= sigma <= 1
        ):
            raise RunError(f"--sofa-sigma must be a number in [0, 1] or 'auto'. Got {sigma!r}.")
        for flag, value, allowed in (
            ("--setting", self.setting, SETTINGS),
            ("--calibrate-on", self.calibrate_on, CALIBRATE_ON),
        ):
            if value not in allowed:
                raise RunError(f"{flag} must be one of {', '.join(allowed)}. Got {value!r}.")
        # Only the HF backend generates replies or changes the attention mask (SoFA).
        check_engine(self.engine)
        needs_model = [m for m in self.methods if METHODS[m].stage != "records"]
        if self.engine != "hf" and needs_model:
            raise RunError(
                f"--engine {self.engine} makes records only; --methods {', '.join(needs_model)} "
                "need --engine hf"
            )
        if self.calibrate_on == "evaluation" and (self.calibration_data or self.calibration):
            raise RunError(
                "--calibrate-on evaluation calibrates on the first evaluation items; it cannot "
                "be combined with --calibration-data or --calibration"
            )
        self.spec.check()
        if self.options.labels != self.spec.labels:  # replies are parsed in the spec's labels
            synced = dataclasses.replace(self.options, labels=self.labels)
            object.__setattr__(self, "options", synced)

    def identity(self) -> dict[str, Any]:
        """run.json's "arguments": the fields that define the records, in run.json's order."""
        return {name: getattr(self, name) for name in RECORD_FIELDS}

    @property
    def template(self) -> str | PromptTemplate:
        """The records' prompt: the given template, else the built-in by name (lad.core.prompts)."""
        return "vanilla" if self.prompt_template is None else PromptTemplate(self.prompt_template)


def check_methods(methods: tuple[str, ...]) -> tuple[str, ...]:
    """Names of lad.core.methods.METHODS, one at least (--methods, as parsed or as given)."""
    unknown = [m for m in methods if m not in METHODS]
    if unknown or not methods:
        got = ", ".join(unknown) if unknown else "none"
        raise RunError(f"--methods must name methods of {', '.join(METHODS)}. Got {got}.")
    return methods


SPEC_FIELDS = tuple(f.name for f in dataclasses.fields(RecordSpec))
OPTION_FIELDS = tuple(f.name for f in dataclasses.fields(MethodOptions) if f.name != "labels")
PLAN_FIELDS = tuple(
    f.name for f in dataclasses.fields(EvalConfig) if f.name not in ("spec", "options")
)
DEFAULTS = EvalConfig()  # every setting's default, declared once in the dataclasses above
# Every setting of `lad eval` by name, and those that define the records (run.json's order).
FIELDS = (*SPEC_FIELDS, *PLAN_FIELDS, *OPTION_FIELDS)
SCORING_FIELDS = {f.name for f in dataclasses.fields(EvalConfig) if f.metadata.get("scoring")}
RECORD_FIELDS = (*SPEC_FIELDS, *(name for name in PLAN_FIELDS if name not in SCORING_FIELDS))


def _make(changes: dict[str, Any], base: EvalConfig | None = None) -> EvalConfig:
    """An EvalConfig of `base` (default: lad's defaults) with `changes` by setting name."""
    unknown = [k for k in changes if k not in FIELDS]
    if unknown:
        raise RunError(f"EvalConfig has no setting {unknown[0]!r}; settings: {', '.join(FIELDS)}")
    base = base or DEFAULTS
    spec = base.spec.replace(**{k: v for k, v in changes.items() if k in SPEC_FIELDS})
    options = {k: v for k, v in changes.items() if k in OPTION_FIELDS}
    if options.get("layer_range") is not None:
        options["layer_range"] = tuple(options["layer_range"])
    options = dataclasses.replace(base.options, **options)
    plan = {k: v for k, v in changes.items() if k in PLAN_FIELDS}
    return dataclasses.replace(base, spec=spec, options=options, **plan)


def eval_config(preset: str = "paper", pictures: bool = True, **stated: Any) -> EvalConfig:
    """An EvalConfig of the settings stated by name (None: not stated) over a preset's
    (lad.run.presets.with_preset: a stated setting wins; `pictures` False: data of text
    candidates)."""
    return _make(with_preset(preset, stated, FIELDS, pictures))
