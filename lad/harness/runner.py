"""What `--model lad` does with a task's picture questions, without lmms-eval: for each (task, N),
lad items (pictures as files, lad.harness.pictures) asked in the order the document shows them,
one forward pass per question (perm-avg: N); every method is a pure function of those records,
so vanilla and LAD come from the same passes and are reported side by side.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lad.core.calibrate import FORMAT as CALIBRATION_FORMAT
from lad.core.calibrate import Calibration
from lad.core.labels import get_scheme
from lad.core.prompts import PromptTemplate, vanilla_template
from lad.core.records import RecordSet
from lad.core.scoring import Scored, score_records
from lad.data.items import Item
from lad.data.orders import cyclic_requests
from lad.errors import CalibrationError, LadError
from lad.harness.adapters import PictureChoice
from lad.harness.args import ModelArgs, check_model_args
from lad.harness.pictures import PictureFiles
from lad.run.debiaser import Debiaser


@dataclass(frozen=True)
class HarnessOptions(ModelArgs):
    """`--model_args` of lmms-eval's `--model lad` (docs/harness.md): ModelArgs and these."""

    calibration_docs: int | None = None  # fit on the first K picture questions of each task
    labels: str = "upper"  # the tasks' option letters
    prompt_template: str | None = None  # a file (lad.core.prompts); None: lad's question template
    output: str = "lad-harness"  # audit folders and the pictures' files
    image_size: int | None = None
    adapter: str | None = None  # force one of lad.harness.adapters.ADAPTERS; None: by schema

    def __post_init__(self) -> None:
        get_scheme(self.labels)
        if self.calibration_docs is not None and self.calibration_docs < 1:
            raise LadError(f"calibration_docs must be >= 1. Got {self.calibration_docs}.")
        check_model_args(self, "calibration_docs", "K (fit on K documents of each task)")


@dataclass
class CalibrationSource:
    """Where a (task, N)'s calibration came from, as the audit reports it."""

    kind: str  # "file" | "docs" | "none"
    path: str | None = None
    doc_ids: list[int] = field(default_factory=list)  # calibration_docs: the documents fitted on
    items: list[str] = field(default_factory=list)
    also_scored: list[str] = field(default_factory=list)  # calibration items that were scored too
    exclude_offset: int | None = None  # lmms-eval --offset that leaves every one of them out

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if v not in (None, [])}


@dataclass
class TaskResult:
    """One (task, N): the records, each method's chosen positions, the calibration used."""

    task: str
    records: RecordSet
    scored: Scored  # each method's scores, chosen positions, predictions and metrics
    calibration: Calibration | None
    source: CalibrationSource
    stages: dict[str, RecordSet] = field(default_factory=dict)  # perm-avg's shifts, by stage
    answers_known: bool = True  # every document gave its answer (else no audit: unknown)


class HarnessScorer:
    """What the picture and text scorers share: the options, the base Debiaser whose model both
    ask (loaded on first use), the calibration files read and checked before it loads, and the
    scoring of one N's requests."""

    def __init__(self, options: ModelArgs, backend: Any, **spec: Any) -> None:
        self.options = options
        self.base = options.debiaser(backend, **spec)
        self._loaded: dict[int, Debiaser] = {}
        if options.calibration:
            self._loaded = load_calibrations(Path(options.calibration), self.base)

    @property
    def backend(self) -> Any:
        return self.base.backend

    def from_file(
        self, n: int, template: PromptTemplate, asks: str, advice: str = "", into: Any = None
    ) -> Debiaser:
        """calibration='s Debiaser of N (or `into` with its file loaded), checked on `template`."""
        if n not in self._loaded:
            raise CalibrationError(
                f"calibration={self.options.calibration} has no calibration for N = {n} "
                f"({asks} of {n} options; it holds N = {sorted(self._loaded)}){advice}"
            )
        debiaser = self._loaded[n] if into is None else into.load(self._loaded[n]._source)
        debiaser.check_calibration_for(n, template)
        return debiaser

    def score_asked(
        self,
        requests: list,
        debiaser: Debiaser,
        methods: list[str],
        perm_items: list[Item],
        **score: Any,
    ) -> tuple[RecordSet, dict[str, RecordSet], Scored]:
        """The records of `requests` from this scorer's backend, asked with `debiaser`'s labels
        and prompt (and, for perm-avg, of `perm_items` under all N cyclic shifts), checked
        against its calibration if it has one, and `methods` scored on them."""
        template = vanilla_template(perm_items, debiaser.prompt_template)
        shown = debiaser.records(requests, template, backend=self.backend)
        calibration = getattr(debiaser, "calibration_", None)
        if calibration is not None:
            calibration.check_compatible(shown, strict=False)
        stages: dict[str, RecordSet] = {}
        if self.options.method == "perm-avg":  # its extra stage: each item's N shifts
            shifted = cyclic_requests(perm_items)
            stages["perm-avg"] = debiaser.records(shifted, template, backend=self.backend)
        options = debiaser.options
        scored = score_records(shown, methods, calibration, options, stages=stages, **score)
        return shown, stages, scored


class PictureScorer(HarnessScorer):
    """Scores picture questions with lad's backend; one instance per harness run."""

    def __init__(self, options: HarnessOptions, backend: Any = None) -> None:
        super().__init__(
            options,
            backend,
            labels=options.labels,
            prompt_template=PromptTemplate.file_text(options.prompt_template),
            image_size=options.image_size,
        )
        self.files = PictureFiles(Path(options.output) / "pictures")

    def item(self, choice: PictureChoice) -> Item:
        """The lad item a picture question asks (its candidates in the original order); an
        unknown answer is recorded as 0 and reported as unknown by the audit."""
        paths = [self.files.path(im) for im in choice.original_candidates()]
        answer = 0 if choice.answer is None else choice.order[choice.answer]
        item = Item(choice.item, choice.question, paths, answer, question=choice.question)
        item.context_images = [self.files.path(im) for im in choice.context]
        return item

    def calibrated(
        self, task: str, n: int, calibration_docs: Sequence[tuple[int, PictureChoice]]
    ) -> tuple[Debiaser | None, CalibrationSource]:
        """The Debiaser whose calibration answers task's questions of N candidates, checked
        against model, N, labels, prompt and preprocessing before any record is made."""
        if self.options.calibration:
            asks = f"task {task} asks picture questions"
            advice = f"; add one made by lad calibrate -n {n}"
            question = Item("q", "q", [], 0, question="q")  # its template: a picture question's
            template = vanilla_template([question], self.base.prompt_template)
            debiaser = self.from_file(n, template, asks, advice)
            return debiaser, CalibrationSource("file", path=str(debiaser._source))
        if not self.options.calibration_docs:
            return None, CalibrationSource("none")
        if not calibration_docs:
            raise CalibrationError(
                f"calibration_docs={self.options.calibration_docs}: task {task} has no picture "
                f"question of N = {n} with a known answer to calibrate on"
            )
        _ = self.backend  # the model loads here, and the clone shares it
        items = [self.item(c) for _, c in calibration_docs]
        debiaser = self.base.clone().fit(items)
        return debiaser, CalibrationSource(
            "docs", doc_ids=[i for i, _ in calibration_docs], items=[it.id for it in items]
        )

    def score(
        self,
        task: str,
        choices: Sequence[PictureChoice],
        debiaser: Debiaser | None,
        source: CalibrationSource,
    ) -> TaskResult:
        """Records of `choices` (one N) and every harness method's positions."""
        items = [self.item(c) for c in choices]
        requests = [(it, c.ordering, list(c.order)) for it, c in zip(items, choices, strict=True)]
        unique = list({it.id: it for it in items}.values())  # a circular variant's shifts share one
        lad = ["lad"] if debiaser is not None else []  # beside the chosen method, if calibrated
        methods = list(dict.fromkeys(["vanilla", self.options.method, *lad]))
        records, stages, scored = self.score_asked(requests, debiaser or self.base, methods, unique)
        known = all(c.answer is not None for c in choices)
        calibration = debiaser.calibration_ if debiaser is not None else None
        return TaskResult(task, records, scored, calibration, source, stages, known)


def load_calibrations(path: Path, base: Debiaser) -> dict[int, Debiaser]:
    """calibration=: one file, or a folder whose calibration files ("format":
    "lad-calibration/1"; other .json files are passed over) give one per N; each a clone of
    `base` with that calibration loaded."""
    files = (
        sorted(p for p in path.glob("*.json") if _is_calibration(p)) if path.is_dir() else [path]
    )
    loaded: dict[int, Debiaser] = {}
    for file in files:
        debiaser = base.clone().load(file)
        n = debiaser.calibration_.num_candidates
        if n in loaded:
            raise CalibrationError(
                f"{path}: two calibrations for N = {n} ({loaded[n]._source}, {file})"
            )
        loaded[n] = debiaser
    if not loaded:
        raise CalibrationError(f"{path}: holds no calibration .json file")
    return loaded


def _is_calibration(path: Path) -> bool:
    try:
        obj = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return False
    return isinstance(obj, dict) and obj.get("format") == CALIBRATION_FORMAT
