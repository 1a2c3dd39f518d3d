"""The stages of a run: each a records file made by the model from a list of requests (the vanilla
prompt, perm-avg's shifts, a generation baseline's prompt, SoFA's mask), resumable through
lad.run.resume; the model is loaded only when some stage still has records to make."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from lad.backends.text import check_item_text
from lad.backends.threads import record_choice, resumed_threads
from lad.core.methods import check_layer_range, check_top_k
from lad.core.records import Record, RecordSet
from lad.data.items import Item
from lad.data.orders import Request, cyclic_requests
from lad.errors import RunError
from lad.run import resume
from lad.run.config import EvalConfig
from lad.run.resume import World
from lad.run.rundir import RunDir
from lad.run.runjson import summed_times

SOFA_GRID = (0.0, 0.25, 0.5, 0.75, 1.0)


def acc_label_for(kind: Stage) -> str | None:
    """What the argmax of a stage's records is: vanilla's or SoFA's choice; nothing for the
    generation baselines, whose choice is the parsed reply."""
    if kind.template != "vanilla":
        return None
    return "vanilla acc" if kind.sofa_sigma is None else "sofa acc"


def _records(backend: Any, requests: Sequence[Request], config: EvalConfig) -> Iterator[Record]:
    return backend.records(
        requests, template=config.template, scheme=config.scheme, batch_size=config.batch_size
    )


@dataclass(frozen=True)
class Stage:
    """How a stage's records are made: `template` of lad.core.prompts ("vanilla", "instruction",
    "cot", "self-consistency"; the last three also generate replies), and `sofa_sigma` (None: the
    model's own mask; a number: the SoFA mask with that σ)."""

    template: str = "vanilla"
    sofa_sigma: float | None = None


def _stage_records(
    backend: Any, requests: Sequence[Request], config: EvalConfig, kind: Stage
) -> Iterator[Record]:
    if kind.template != "vanilla":
        from lad.backends.generate import GenerationOptions, generation_records

        # Greedy decoding for instruction and cot; sampled paths for self-consistency (§5.1).
        sampled = {}
        if kind.template == "self-consistency":
            sampled = {
                "samples": config.sc_samples,
                "temperature": config.sc_temperature,
                "top_k": config.sc_top_k,
                "seed": config.seed,
            }
        options = GenerationOptions(max_new_tokens=config.max_new_tokens, **sampled)
        made = {"template": kind.template, "scheme": config.scheme, "batch_size": config.batch_size}
        yield from generation_records(backend, requests, options=options, **made)
        return
    sofa = None
    if kind.sofa_sigma is not None:
        from lad.backends.sofa import SofaOptions, sofa_applied

        sofa = SofaOptions(kind.sofa_sigma, config.sofa_within_image)
    with nullcontext() if sofa is None else sofa_applied(backend, sofa):
        for rec in _records(backend, requests, config):
            if sofa is not None:
                rec.extra["sofa_sigma"] = sofa.sigma
            yield rec


@dataclass
class LazyBackend:
    """Loads the model on first use, so a finished run is rescored without touching it.

    shared: models loaded already, by what they were loaded with, for runs one after another in
    one process (a mixed run's parts, a suite's cells): the model does not depend on N."""

    config: EvalConfig
    device: str
    run: RunDir
    shared: dict | None = None
    items: Sequence[Item] = ()  # the run's items: their text checked once the model loads
    backend: Any = None
    load_seconds: float = 0.0
    recorded: Any = None  # run.json's "threads" when the model loaded, None before records

    def __post_init__(self) -> None:
        self.shared = {} if self.shared is None else self.shared
        # False: text options only (lad.backends.settings.LoadSettings)
        self.pictures = not all(it.is_text for it in self.items)

    def __call__(self) -> Any:
        if self.backend is None:
            self.run.check_records_version()  # new records must match the old ones
            start = time.perf_counter()
            if self.run.made_records():  # a resumed run keeps its thread count
                self.recorded = self.run.threads()
            spec = dataclasses.replace(self.config.spec, labels="digits", prompt_template=None)
            key = (repr(spec), self.device, self.config.dtype, self.pictures, self.config.engine)
            if key not in self.shared:
                self.shared[key] = spec.load_backend(
                    device=self.device,
                    dtype=self.config.dtype,
                    quiet=self.config.quiet,
                    threads=resumed_threads(self.recorded, self.run.run_file),
                    pictures=self.pictures,
                    engine=self.config.engine,
                )
            self.backend = self.shared[key]
            # Before any record: K or a layer range past the model's layers (a hub model's, which
            # preflight cannot read) would fail only at scoring, a control token in an item's
            # text at its batch (check_item_text).
            check_top_k(self.config.top_k, self.backend.num_layers, self.config.model)
            check_layer_range(self.config.layer_range, self.backend.num_layers)
            processor = getattr(self.backend, "processor", None)
            spec = self.config.spec.for_items(self.items)
            owner = getattr(self.backend, "template_owner", self.config.model)
            for item in self.items if hasattr(processor, "tokenizer") else ():
                check_item_text(processor, item, spec.template, spec.scheme, owner)
            self.load_seconds = time.perf_counter() - start
        return self.backend


class Clock:
    """Makes the stages of the backend's run in this process (`stage`), and adds each stage's
    wall time in this session to run.json's "timing", the model's load apart as "model_load", and
    the CPU threads of the session that loaded it. Only a stage with records still to make counts,
    so a rerun that only rescores adds nothing; the main process writes (its time includes
    waiting for the others)."""

    def __init__(self, world: World, backend: LazyBackend) -> None:
        self.run, self.world, self.backend = backend.run, world, backend

    def stage(
        self,
        requests: Sequence[Request],
        path: Path,
        name: str,
        kind: Stage | None = None,
        desc: str = "",
        acc_label: str | None = None,
    ) -> RecordSet:
        """lad.run.resume.run_stage of a `Stage` (`kind`, default the vanilla prompt) into
        `path`, timed as `name`; the progress bar says `desc` (default `name`) and its running
        accuracy `acc_label` (default: what the stage's records predict)."""
        kind, config = kind or Stage(), self.backend.config
        how = {"batch_size": config.batch_size, "quiet": config.quiet, "world": self.world}
        how["acc_label"] = acc_label or acc_label_for(kind)

        def make(todo: Sequence[Request]) -> Iterator[Record]:
            return _stage_records(self.backend(), todo, config, kind)

        with self(name, path, len(requests)):
            return resume.run_stage(path, requests, make, desc=desc or name, **how)

    @contextmanager
    def __call__(self, name: str, path: Path, count: int) -> Iterator[None]:
        if not self.world.is_main or RunDir.made(path, count):
            yield
            return
        start, loaded = time.perf_counter(), self.backend.load_seconds
        try:
            yield
        finally:  # an interrupted session's time counts too: it was spent
            load = self.backend.load_seconds - loaded
            times = {"model_load": load} if load else {}
            times[name] = time.perf_counter() - start - load
            self.run.update("timing", lambda timing: summed_times(timing, times))
            # The decoder layers of the records' attention rows, in order (all but in a hybrid
            # model; lad.backends.archs.attention_layers).
            layers = getattr(self.backend.backend, "attention_layers", None)
            if load and layers is not None:
                self.run.update("attention_layers", lambda _: list(layers))
            choice = getattr(self.backend.backend, "threads", None)  # None on an accelerator
            if load and choice is not None:
                threads = record_choice(self.backend.recorded, choice)
                self.run.update("threads", lambda _: dict(threads))


def sofa_sigma(clock: Clock, cal_items: Sequence[Item]) -> float:
    """σ for SoFA of the clock's run: the given number, or with `auto` the σ of SOFA_GRID whose
    vanilla readout is most accurate on the symmetrised calibration set (ties: the σ nearest 0.5,
    then the smaller); the choice is written to sofa.json."""
    given = clock.backend.config.sofa_sigma
    if given != "auto":
        return float(given)
    if not cal_items:
        raise RunError("--sofa-sigma auto chooses σ on calibration items; pass --calibration-data")
    requests = cyclic_requests(cal_items)
    accuracy = {}
    for sigma in SOFA_GRID:
        kind = Stage(sofa_sigma=sigma)
        recs = clock.stage(
            requests, clock.run.sofa_grid_file(sigma), "sofa grid", kind, f"sofa grid σ={sigma:g}"
        )
        accuracy[sigma] = float(np.mean(recs.logprobs.argmax(axis=1) == recs.answer))
    best = max(SOFA_GRID, key=lambda s: (accuracy[s], -abs(s - 0.5), -s))
    if clock.world.is_main:
        choice = {"grid": list(SOFA_GRID), "accuracy": [accuracy[s] for s in SOFA_GRID]}
        clock.run.write_sofa_choice({**choice, "sigma": best})
    return best
