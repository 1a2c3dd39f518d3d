"""`lad eval`: a run directory from items to report, resumable (DESIGN.md, "The pipeline").

The model runs once per (item, ordering) and its records are appended as they are made; every
method, metric and figure is then computed from the stored records. A run directory holds:

    run.json             the arguments that define the records (checked on every rerun)
    data/                the generated benchmark, when --data shapes
    calibration.jsonl    calibration records: each calibration item under all N cyclic shifts
    calibration.json     the fitted Calibration (§4.2)
    records.jsonl        evaluation records: each item under T shuffles
    perm_records.jsonl   each evaluation item under all N cyclic shifts (only for perm-avg)
    instruction_records.jsonl, cot_records.jsonl, sc_records.jsonl
                         the evaluation requests under each generation baseline's prompt, replies
                         in `extra` (only for instruction, cot, self-consistency)
    sofa_records.jsonl   the evaluation requests under the SoFA mask (only for sofa)
    sofa_grid/sigma*.jsonl, sofa.json
                         calibration requests under each σ of the grid (only for --sofa-sigma auto)
    predictions.jsonl    one line per (record, method)
    metrics.json         DESIGN.md's metrics format
    report/index.html    figures and tables (lad.report)
"""

from __future__ import annotations

import dataclasses
import json
import re
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from lad import rundir
from lad.calibrate import Calibration
from lad.data.items import Item, cyclic_shift, read_items, shuffle_orders
from lad.errors import CalibrationError, DataError, RunError
from lad.files import check_not_inputs, check_output_dir, read_json, write_text
from lad.images import check_image
from lad.labels import get_scheme
from lad.methods import METHODS, MethodOptions, check_layer_range, choose
from lad.metrics import compute_metrics, format_table
from lad.prompts import CAPTION, PromptTemplate, check_template, prompt_sha256, vanilla_template
from lad.records import Record, RecordSet, predictions_for, read_records, write_predictions
from lad.rundir import World

DEFAULT_METHODS = ("vanilla", "pride", "lad", "attn", "attn-purified", "perm-avg")
Request = tuple[Item, int, list[int]]
# The records file each method stage reads (lad.methods.Method.stage).
STAGE_FILES = {
    "records": "records.jsonl",
    "instruction": "instruction_records.jsonl",
    "cot": "cot_records.jsonl",
    "self-consistency": "sc_records.jsonl",
    "sofa": "sofa_records.jsonl",
}
SOFA_GRID = (0.0, 0.25, 0.5, 0.75, 1.0)
# Where the calibration items come from: held out from the evaluation items (the paper, §4.2),
# or the first |D_cal| evaluation items, scored too (the official code).
CALIBRATE_ON = ("held-out", "evaluation")
# Files `lad eval` writes in a run directory; none may be one of its inputs.
RUN_OUTPUTS = (
    "run.json",
    "calibration.jsonl",
    "calibration.json",
    "perm_records.jsonl",
    "predictions.jsonl",
    "metrics.json",
    "sofa.json",
    *STAGE_FILES.values(),
)


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
    prompt_template: str | None = None  # the vanilla template's text (lad.prompts); None: built-in
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
    )

    def __post_init__(self) -> None:
        unknown = [m for m in self.methods if m not in METHODS]
        if unknown or not self.methods:
            raise RunError(
                f"The 'methods' parameter must name methods from {sorted(METHODS)}. "
                f"Got {unknown or 'none'} instead."
            )
        if self.items is not None and self.items < 1:
            raise RunError(f"--items must be >= 1 (leave it out for all items). Got {self.items}.")
        if self.num_candidates < 2:
            raise RunError(f"--num-candidates must be >= 2. Got {self.num_candidates}.")
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
            raise RunError(
                f"The 'setting' parameter must be 'random' or 'adversarial'. Got {self.setting!r}."
            )
        if self.calibrate_on not in CALIBRATE_ON:
            raise RunError(
                f"The 'calibrate_on' parameter must be one of {list(CALIBRATE_ON)}. "
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
        """The records' prompt: the given template, else the built-in by name (lad.prompts)."""
        return "vanilla" if self.prompt_template is None else PromptTemplate(self.prompt_template)


@dataclass
class RunResult:
    run_dir: Path
    metrics: dict[str, Any]
    table: str
    report: Path | None


# ---------------------------------------------------------------- requests


def evaluation_requests(items: Sequence[Item], num_shuffles: int, seed: int) -> list[Request]:
    """Each item under T orderings: the identity first, then seeded random permutations (§5.2)."""
    return [
        (item, t, order)
        for item in items
        for t, order in enumerate(shuffle_orders(item.id, item.num_candidates, num_shuffles, seed))
    ]


def run_requests(config: EvalConfig, items: Sequence[Item]) -> list[Request]:
    """The evaluation requests of a run: each item under the orders of `config.orders` when
    given (lad.data.orders), else under T seeded shuffles."""
    if config.orders is None:
        return evaluation_requests(items, config.num_shuffles, config.seed)
    from lad.data.orders import orders_for, read_orders

    given = orders_for(items, read_orders(config.orders, config.num_candidates), config.orders)
    return [
        (item, t, order)
        for item, mine in zip(items, given, strict=True)
        for t, order in enumerate(mine)
    ]


def cyclic_requests(items: Sequence[Item]) -> list[Request]:
    """Each item under all N cyclic left-shifts: the symmetrised set of §4.2 (and of perm-avg)."""
    return [
        (item, s, cyclic_shift(item.num_candidates, s))
        for item in items
        for s in range(item.num_candidates)
    ]


# ---------------------------------------------------------------- stages


def run_stage(
    make_backend: Callable[[], Any],
    requests: Sequence[Request],
    path: Path,
    config: EvalConfig,
    desc: str,
    world: World | None = None,
    kind: Stage | None = None,
) -> RecordSet:
    """Make the records of `requests` that `path` does not hold yet (lad.rundir); return all.
    `kind` says how (default: the vanilla prompt); see `Stage`."""

    def make(todo: Sequence[Request]) -> Iterator[Record]:
        return _stage_records(make_backend(), todo, config, kind or Stage())

    return rundir.run_stage(
        path,
        requests,
        make,
        batch_size=config.batch_size,
        desc=desc,
        quiet=config.quiet,
        world=world,
    )


def _records(backend: Any, requests: Sequence[Request], config: EvalConfig) -> Iterator[Record]:
    return backend.records(
        requests,
        template=config.template,
        scheme=get_scheme(config.labels),
        batch_size=config.batch_size,
    )


@dataclass(frozen=True)
class Stage:
    """How a stage's records are made: `template` of lad.prompts ("vanilla", "instruction", "cot",
    "self-consistency"; the last three also generate replies), and `sofa_sigma` (None: the
    model's own mask; a number: the SoFA mask with that σ)."""

    template: str = "vanilla"
    sofa_sigma: float | None = None


def _stage_records(
    backend: Any, requests: Sequence[Request], config: EvalConfig, kind: Stage
) -> Iterator[Record]:
    if kind.template == "vanilla" and kind.sofa_sigma is None:
        yield from _records(backend, requests, config)
        return
    scheme = get_scheme(config.labels)
    if kind.sofa_sigma is not None:
        from lad.backends.sofa import SofaOptions, sofa_applied

        options = SofaOptions(kind.sofa_sigma, config.sofa_within_image)
        with sofa_applied(backend, options):
            made = backend.records(
                requests, template=config.template, scheme=scheme, batch_size=config.batch_size
            )
            for rec in made:
                rec.extra["sofa_sigma"] = options.sigma
                yield rec
        return
    from lad.backends.generate import generation_records

    yield from generation_records(
        backend,
        requests,
        template=kind.template,
        scheme=scheme,
        options=generation_options(config, kind.template),
        batch_size=config.batch_size,
    )


def generation_options(config: EvalConfig, template: str) -> Any:
    """Greedy decoding for instruction and cot; sampled paths for self-consistency (§5.1)."""
    from lad.backends.generate import GenerationOptions

    if template == "self-consistency":
        return GenerationOptions(
            max_new_tokens=config.max_new_tokens,
            samples=config.sc_samples,
            temperature=config.sc_temperature,
            top_k=config.sc_top_k,
            seed=config.seed,
        )
    return GenerationOptions(max_new_tokens=config.max_new_tokens)


class _LazyBackend:
    """Loads the model on first use, so a finished run is rescored without touching it."""

    def __init__(self, config: EvalConfig, device: str) -> None:
        self.config = config
        self.device = device
        self.backend: Any = None
        self.load_seconds = 0.0

    def __call__(self) -> Any:
        if self.backend is None:
            start = time.perf_counter()
            from transformers.utils import logging as hf_logging

            from lad.backends import load_backend

            if self.config.quiet:
                hf_logging.disable_progress_bar()  # transformers' "Loading weights" bars
            self.backend = load_backend(
                resolve_model(self.config.model),
                device=self.device,
                dtype=self.config.dtype,
                image_options=self.config.image_options or None,
                image_size=self.config.image_size,
                chat_template=self.config.chat_template,
            )
            # Before any record: a layer range past the model's layers would fail only at scoring.
            check_layer_range(self.config.layer_range, self.backend.num_layers)
            self.load_seconds = time.perf_counter() - start
        return self.backend


class _Clock:
    """Adds each stage's wall time in this session to run.json's "timing" (lad.rundir.add_times),
    the model's load apart as "model_load". Only a stage with records still to make counts, so a
    rerun that only rescores adds nothing; the main process writes (its time includes waiting for
    the others)."""

    def __init__(self, run_dir: Path, world: World, backend: _LazyBackend) -> None:
        self.run_dir, self.world, self.backend = run_dir, world, backend

    @contextmanager
    def __call__(self, name: str, path: Path, count: int) -> Iterator[None]:
        if not self.world.is_main or (path.is_file() and path.read_bytes().count(b"\n") >= count):
            yield
            return
        start, loaded = time.perf_counter(), self.backend.load_seconds
        try:
            yield
        finally:  # an interrupted session's time counts too: it was spent
            load = self.backend.load_seconds - loaded
            times = {"model_load": load} if load else {}
            rundir.add_times(self.run_dir, {**times, name: time.perf_counter() - start - load})


def resolve_prompt(config: EvalConfig) -> EvalConfig:
    """The run with its vanilla template fixed: --prompt-template, else the built-in question
    template when the evaluation items ask their own questions (stored in run.json, so the
    records, the calibration's fingerprint and every rescoring agree), else the paper's."""
    if config.prompt_template is not None or config.data == "shapes":
        return config
    template = vanilla_template(read_items(config.data, config.num_candidates))
    if template == CAPTION:
        return config
    return dataclasses.replace(config, prompt_template=template.text)


def run_prompt_sha256(prompt_template: str | None, scheme: Any, num_candidates: int) -> str:
    """The fingerprint of a run's vanilla prompt (`prompt_template` as in EvalConfig)."""
    template = CAPTION if prompt_template is None else PromptTemplate(prompt_template)
    return prompt_sha256(template, scheme, num_candidates)


def resolve_model(model: str) -> str:
    """`demo` is the model shipped inside the package (docs/demo-model.md)."""
    if model == "demo":
        from lad.demo import demo_model_path

        return str(demo_model_path())
    return model


# ---------------------------------------------------------------- data


def load_items(config: EvalConfig, run_dir: Path) -> tuple[list[Item], list[Item]]:
    """(evaluation items, calibration items). Held out (the default), the two never share an item
    id; with `calibrate_on` "evaluation" the calibration items are the first |D_cal| items of the
    data, which are evaluated too (the official code's choice)."""
    n = config.num_candidates
    on_eval = config.calibrate_on == "evaluation"
    if config.data == "shapes":
        from lad.data.shapes import build_shapes

        num_eval = config.items or 100
        common = {"num_candidates": n, "setting": config.setting, "seed": config.seed}
        eval_path = build_shapes(run_dir / "data/eval", items=num_eval, split="eval", **common)
        if on_eval:
            items = read_items(eval_path, n)
            return items, items[: config.calibration_items]
        cal_path = build_shapes(
            run_dir / "data/calibration",
            items=config.calibration_items,
            split="calibration",
            **common,
        )
        return read_items(eval_path, n), read_items(cal_path, n)
    items = read_items(config.data, n)
    if on_eval:
        return items[: config.items or len(items)], items[: config.calibration_items]
    if config.calibration_data:
        calibration = read_items(config.calibration_data, n)
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
    calibration = calibration[: config.calibration_items]
    overlap = {it.id for it in items} & {it.id for it in calibration}
    if overlap:
        raise DataError(
            f"calibration items must be disjoint from evaluation items; shared ids: "
            f"{sorted(overlap)[:5]}"
        )
    if config.items:
        items = items[: config.items]
    return items, calibration


# ---------------------------------------------------------------- the whole run


def fit_or_load_calibration(
    config: EvalConfig, run_dir: Path, calibration_records: RecordSet | None
) -> Calibration:
    scheme = get_scheme(config.labels)
    labels = scheme.labels(config.num_candidates)
    sha = run_prompt_sha256(config.prompt_template, scheme, config.num_candidates)
    if config.calibration:
        calibration = Calibration.load(config.calibration)
    else:
        assert calibration_records is not None
        calibration = Calibration(obs_mean=config.obs_mean).fit(
            calibration_records, model=config.model, labels=labels, prompt_sha256=sha
        )
    calibration.save(run_dir / "calibration.json")
    return calibration


def check_inputs(config: EvalConfig, run_dir: Path) -> dict[str, Any]:
    """Check every argument and input file before any model work and before the run directory
    is touched; return the inputs' fingerprints for run.json (lad.rundir.fingerprint)."""
    check_output_dir(run_dir)
    check_device(config.device)
    if config.calibration:
        calibration = check_given_calibration(config)
        check_top_k(config.top_k, calibration.num_layers, f"the calibration {config.calibration}")
    check_top_k(config.top_k, model_num_layers(resolve_model(config.model)), config.model)
    inputs = {}
    files: dict[str, str | None] = {}
    if config.data != "shapes":
        eval_items, cal_items = load_items(config, run_dir)
        check_images(eval_items + cal_items)
        from_data = eval_items + ([] if config.calibration_data else cal_items)
        files["data"] = config.data
        inputs["data"] = rundir.fingerprint(config.data, [p for it in from_data for p in it.images])
        if config.calibration_data:
            files["calibration_data"] = config.calibration_data
            images = [p for it in cal_items for p in it.images]
            inputs["calibration_data"] = rundir.fingerprint(config.calibration_data, images)
    for name in ("calibration", "orders", "chat_template"):
        if getattr(config, name) and Path(getattr(config, name)).is_file():
            files[name] = getattr(config, name)
            inputs[name] = rundir.fingerprint(getattr(config, name))
    outputs = {f"--out {run_dir}/{name}": run_dir / name for name in RUN_OUTPUTS}
    check_not_inputs(outputs, {"--" + k.replace("_", "-"): v for k, v in files.items()})
    return inputs


def check_images(items: Sequence[Item]) -> None:
    """Every image opens within lad.images' limits (header only: no pixel is decoded)."""
    for path in dict.fromkeys(p for it in items for p in it.images):
        check_image(path)


def check_device(device: str) -> None:
    if device in ("auto", "cpu"):
        return
    if not re.fullmatch(r"cuda(:\d+)?", device):
        raise RunError(f"--device must be auto, cpu, cuda or cuda:N. Got {device!r}.")
    import torch

    if not torch.cuda.is_available():
        raise RunError(f"--device {device}: no CUDA device is available here; use --device cpu")
    index = int(device.partition(":")[2] or 0)
    if index >= torch.cuda.device_count():
        raise RunError(
            f"--device {device}: this machine has {torch.cuda.device_count()} CUDA device(s)"
        )


def check_top_k(top_k: int, num_layers: int | None, what: object) -> None:
    """K of Eq. 9 cannot exceed the number of layers (an error, not a silent cut)."""
    if num_layers is not None and top_k > num_layers:
        raise RunError(f"--top-k {top_k} is more than the {num_layers} layers of {what}")


def model_num_layers(model: str) -> int | None:
    """The language decoder's layer count from a local checkpoint's config.json (None for a hub
    id: it is then checked when the records exist)."""
    path = Path(model) / "config.json"
    if not path.is_file():
        return None
    config = read_json(path, RunError, "model config")
    text = config.get("text_config") or config if isinstance(config, dict) else {}
    layers = text.get("num_hidden_layers") if isinstance(text, dict) else None
    return layers if isinstance(layers, int) else None


def evaluate(
    config: EvalConfig, run_dir: str | Path, world: World | None = None
) -> RunResult | None:
    """Run (or resume) one evaluation into `run_dir` and return its metrics.

    Under several processes (accelerate launch, torchrun) each makes its share of the records;
    the main process merges, scores and reports, and the others return None.
    """
    run_dir = Path(run_dir)
    world = world or World.from_env()
    config = resolve_prompt(config)
    if not world.is_main:
        return _evaluate(config, run_dir, world)
    inputs = check_inputs(config, run_dir)
    with rundir.RunLock(run_dir):
        return _evaluate(config, run_dir, world, inputs)


def _evaluate(
    config: EvalConfig, run_dir: Path, world: World, inputs: dict[str, Any] | None = None
) -> RunResult | None:
    if world.is_main:
        rundir.check_run_dir(run_dir, config.identity(), EvalConfig().identity(), inputs)
        load_items(config, run_dir)  # builds generated data once, before the others read it
    world.barrier()
    eval_items, cal_items = load_items(config, run_dir)
    make_backend = _LazyBackend(config, world.device(config.device))
    clock = _Clock(run_dir, world, make_backend)

    def stage(
        requests: list[Request], file: str, name: str, kind: Stage | None = None, desc: str = ""
    ) -> RecordSet:
        path = run_dir / file
        with clock(name, path, len(requests)):
            return run_stage(make_backend, requests, path, config, desc or name, world, kind)

    requests = run_requests(config, eval_items)  # a bad --orders file fails before model work
    cal_records = None
    if not config.calibration:
        cal_records = stage(cyclic_requests(cal_items), "calibration.jsonl", "calibration")
    stage(requests, "records.jsonl", "evaluation")
    if "perm-avg" in config.methods:
        stage(cyclic_requests(eval_items), "perm_records.jsonl", "perm-avg")
    for template in ("instruction", "cot", "self-consistency"):
        if template in config.methods:
            stage(requests, STAGE_FILES[template], template, Stage(template))
    if "sofa" in config.methods:
        sigma = sofa_sigma(config, run_dir, make_backend, cal_items, world, clock)
        kind = Stage(sofa_sigma=sigma)
        stage(requests, STAGE_FILES["sofa"], "sofa", kind, f"sofa σ={sigma:g}")
    if not world.is_main:
        return None
    fit_or_load_calibration(config, run_dir, cal_records)
    return score_run(
        run_dir,
        config.methods,
        config.method_options,
        quiet=config.quiet,
        check_calibration=config.calibration_check,
    )


def sofa_sigma(
    config: EvalConfig,
    run_dir: Path,
    make_backend: Callable[[], Any],
    cal_items: Sequence[Item],
    world: World,
    clock: _Clock | None = None,
) -> float:
    """σ for SoFA: the given number, or with `auto` the σ of SOFA_GRID whose vanilla readout is
    most accurate on the symmetrised calibration set (ties: the σ nearest 0.5, then the smaller);
    the choice is written to sofa.json."""
    if config.sofa_sigma != "auto":
        return float(config.sofa_sigma)
    if not cal_items:
        raise RunError("--sofa-sigma auto chooses σ on calibration items; pass --calibration-data")
    requests = cyclic_requests(cal_items)
    accuracy = {}
    for sigma in SOFA_GRID:
        path = run_dir / "sofa_grid" / f"sigma{sigma:g}.jsonl"
        path.parent.mkdir(exist_ok=True)
        kind = Stage(sofa_sigma=sigma)
        with clock("sofa grid", path, len(requests)) if clock else nullcontext():
            desc = f"sofa grid σ={sigma:g}"
            recs = run_stage(make_backend, requests, path, config, desc, world, kind)
        accuracy[sigma] = float(np.mean(recs.logprobs.argmax(axis=1) == recs.answer))
    best = max(SOFA_GRID, key=lambda s: (accuracy[s], -abs(s - 0.5), -s))
    if world.is_main:
        choice = {
            "grid": list(SOFA_GRID),
            "accuracy": [accuracy[s] for s in SOFA_GRID],
            "sigma": best,
        }
        write_text(run_dir / "sofa.json", json.dumps(choice, indent=2) + "\n")
    return best


def score_run(
    run_dir: Path,
    methods: Sequence[str],
    options: MethodOptions,
    *,
    quiet: bool = False,
    write_report: bool = True,
    check_calibration: bool = True,
) -> RunResult:
    """Predictions, metrics.json and the report, from the run directory's files alone.

    check_calibration: refuse a calibration.json of another model, label scheme or prompt.
    """
    records = read_records(run_dir / "records.jsonl")
    calibration = Calibration.load(run_dir / "calibration.json")
    arguments = json.loads((run_dir / "run.json").read_text())["arguments"]
    scheme = get_scheme(arguments["labels"])
    calibration_check(calibration, records, arguments, scheme, strict=check_calibration)
    perm_path = run_dir / "perm_records.jsonl"
    perm_records = read_records(perm_path) if "perm-avg" in methods else None
    options = dataclasses.replace(options, labels=scheme.name)

    start = time.perf_counter()
    stages = {"records": records}
    predictions, written, tokens = {}, [], {}
    for method in methods:
        stage_name = METHODS[method].stage
        if stage_name not in stages:
            stages[stage_name] = stage_records(run_dir, stage_name, records)
        stage = stages[stage_name]
        scores, predictions[method] = choose(method, stage, calibration, options, perm_records)
        written += predictions_for(records, method, scores, predictions[method])
        if METHODS[method].parse is not None:
            tokens[method] = generated_tokens_per_item(stage)
    write_predictions(run_dir / "predictions.jsonl", written)
    costs = {m: METHODS[m].forward_passes(records.num_candidates) for m in methods}
    metrics = compute_metrics(records, predictions, costs=costs)
    for method, count in tokens.items():
        metrics["methods"][method]["generated_tokens_per_item"] = count
    # Wall seconds per stage (run.json's, summed over sessions) and of this scoring.
    scoring = round(time.perf_counter() - start, 3)
    metrics["timing"] = {**rundir.stage_times(run_dir), "scoring": scoring}
    write_text(run_dir / "metrics.json", json.dumps(metrics, indent=2) + "\n")
    table = format_table(metrics)
    report = None
    if write_report:
        from lad.report import write_report as _write_report

        report = _write_report([run_dir], run_dir / "report")
    return RunResult(run_dir, metrics, table, report)


def stage_records(run_dir: Path, stage: str, records: RecordSet) -> RecordSet:
    """A method stage's records; they must answer the evaluation records' requests, in order."""
    path = run_dir / STAGE_FILES[stage]
    if not path.is_file():
        raise RunError(f"{path}: missing; rerun lad eval with --methods including {stage}")
    made = read_records(path)
    if made.keys() != records.keys() or not np.array_equal(made.order, records.order):
        raise RunError(
            f"{path}: its (item, ordering) records differ from records.jsonl; the file is "
            "from another run or incomplete. Rerun lad eval to finish it."
        )
    return made


def generated_tokens_per_item(records: RecordSet) -> float:
    """Mean, over records, of the tokens generated for a record (all its paths together)."""
    counts = [sum(extra.get("generated_tokens", [])) for extra in records.extra]
    return float(np.mean(counts)) if counts else 0.0


def check_given_calibration(config: EvalConfig) -> Calibration:
    """Refuse a --calibration of another N, Eq. 1 average, model, label scheme or prompt, or one
    that does not say which (unless --no-calibration-check), before any model work (the layer
    count is checked once records exist)."""
    calibration = Calibration.load(config.calibration)
    scheme = get_scheme(config.labels)
    n = config.num_candidates
    try:
        if calibration.num_candidates != n:
            raise CalibrationError(
                f"the calibration is for N = {calibration.num_candidates} candidates but this "
                f"run has N = {n}; calibrate with items of the same N"
            )
        if calibration.obs_mean != config.obs_mean:
            raise CalibrationError(
                f"it was fitted with Eq. 1 over {calibration.obs_mean!r} but this run asks for "
                f"--obs-mean {config.obs_mean}; pass --obs-mean {calibration.obs_mean}"
            )
        calibration.check_compatible(
            model=config.model,
            labels=scheme.labels(n),
            prompt_sha256=run_prompt_sha256(config.prompt_template, scheme, n),
            strict=config.calibration_check,
            require_fingerprint=True,
        )
    except CalibrationError as e:
        raise CalibrationError(f"{config.calibration}: {e}") from e
    return calibration


def calibration_check(
    calibration: Calibration,
    records: RecordSet,
    arguments: dict[str, Any],
    scheme: Any,
    strict: bool = True,
) -> None:
    n = records.num_candidates
    try:
        calibration.check_compatible(
            records,
            model=arguments["model"],
            labels=scheme.labels(n),
            prompt_sha256=run_prompt_sha256(arguments.get("prompt_template"), scheme, n),
            strict=strict,
        )
    except CalibrationError as e:
        raise CalibrationError(f"{arguments.get('calibration') or 'calibration.json'}: {e}") from e


def config_from_dict(values: dict[str, Any]) -> EvalConfig:
    names = {f.name for f in dataclasses.fields(EvalConfig)}
    return EvalConfig(**{k: v for k, v in values.items() if k in names})
