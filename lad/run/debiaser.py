"""The Python API: fit a calibration once, then debias many multi-image choices.

from lad import Debiaser
debiaser = Debiaser("Qwen/Qwen2.5-VL-3B-Instruct").fit(calibration_items)
debiaser.save("calibration.json")
choice = debiaser.predict("a dog on a red sofa", ["a.jpg", "b.jpg", "c.jpg", "d.jpg"])
choice.lad, choice.prob_after, choice.posterior

Multi-image questions of your own: calibrate on items that carry a `question` (e.g. from
`lad data mmiu`), then `debiaser.predict(question="Which image is forged?", images=[...])`; a
template of your own goes in `Debiaser(..., prompt_template=PromptTemplate.from_file(path))`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from lad.backends.engines import check_engine
from lad.core.calibrate import Calibration
from lad.core.methods import MethodOptions, check_top_k, lad_posterior, score, selected_layers
from lad.core.prompts import PromptTemplate, vanilla_template
from lad.core.records import RecordSet, RecordWriter
from lad.data.items import Item, check_texts
from lad.data.orders import cyclic_requests
from lad.errors import CalibrationError, DataError, LadError
from lad.io import limits
from lad.io.images import check_images
from lad.run.config import OPTION_FIELDS, SPEC_FIELDS
from lad.run.presets import with_preset
from lad.run.spec import RecordSpec


@dataclass
class Choice:
    """One debiased choice. Positions are 0-based; `labels[p]` is how the prompt named p."""

    query: str  # the text asked: the question, if one was given
    labels: list[str]
    vanilla: int  # argmax_j log P(c_j | x)
    lad: int  # argmax_j of Eq. 14
    prob_before: list[float]  # P(c_j | x)
    prob_after: list[float]  # softmax of Eq. 14's scores
    posterior: list[float]  # π, Eq. 12
    layers: list[int]  # L*, Eq. 9 (0-based decoder layers)
    question: bool = False  # `query` was asked as a question (lad.core.prompts)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def summary(self, images: Sequence[str | Path], noun: str = "image") -> str:
        """A table for a person: positions 1-based, as the prompt counts them; `noun` heads the
        candidates' column ("option" for text options)."""
        # A long path shows its end behind an ellipsis: a file's name matters more than its folders.
        names = [n if len(n) <= 40 else "…" + n[-39:] for n in map(str, images)]
        lw = max(len("label"), *(len(label) for label in self.labels))
        iw = max(len(noun), *(len(name) for name in names))
        lines = [
            f"{'question' if self.question else 'query'}: {self.query}",
            f"{'':2} {'pos':>3}  {'label':<{lw}}  {noun:<{iw}}  {'P before':>8}  "
            f"{'P after':>8}  {'π':>5}",
        ]
        for p, name in enumerate(names):
            mark = ("V" if p == self.vanilla else " ") + ("L" if p == self.lad else " ")
            lines.append(
                f"{mark} {p + 1:>3}  {self.labels[p]:<{lw}}  {name:<{iw}}  "
                f"{100 * self.prob_before[p]:7.1f}%  {100 * self.prob_after[p]:7.1f}%  "
                f"{self.posterior[p]:5.2f}"
            )
        layers = ", ".join(str(layer) for layer in self.layers)
        lines += [
            f"vanilla chooses position {self.vanilla + 1}, LAD chooses position {self.lad + 1}",
            "V, L: vanilla's and LAD's choice. P before: the model's probability of each label; "
            "P after: LAD's (Eq. 14);",
            f"π: the purified attention posterior (Eq. 12), from decoder layers {layers} "
            "(0-based). Positions count from 1 here, from 0 in --json.",
        ]
        return "\n".join(lines)


# What a Debiaser runs with, beside its spec and options: a clone keeps them.
_LOADING = ("device", "dtype", "quiet", "pictures", "engine")  # how its model is loaded
_SESSION = ("batch_size", "check_calibration", *_LOADING)


class Debiaser:
    """Attention-guided debiasing for one model (sklearn-like: `fit`, then `predict` many).

    `fit` runs the symmetrised calibration set (§4.2) on a few items; `predict` costs one forward
    pass per query. Fitted attributes end in `_`.

    model: a hub id, a local checkpoint, a shipped model ("demo", "text-demo"), or a whole
        `RecordSpec` (lad.run.spec): the model, label scheme, prompt, chat template, picture
        preparation and repetition penalty the records are made with. Its fields may also be
        given by name (`labels=`, `prompt_template=` a PromptTemplate or its text,
        `image_size=`, ...).
    options: how records are scored (lad.core.methods.MethodOptions), or its fields by name
        (`top_k=`, `tau=`, `obs_mean=`, ...). obs_mean: how `fit` averages Eq. 1 ("prob" unless
        stated); a loaded calibration keeps its own, and stating another is an error.
    preset: "official" gives the official code's choices (lad.run.presets.OFFICIAL); what is
        stated by name wins over it.
    check_calibration: refuse a calibration fitted with another model, label scheme, prompt
        template, chat template, image_size or image_options (False: only N and the layer count
        are checked). quiet: hide transformers' progress bars while the model loads.
    pictures: False when only text options will be asked (lad.backends.settings.LoadSettings:
        the chat template is then checked on a text prompt alone; a preset's picture settings
        do not apply).
    engine: what makes the records: "hf" (transformers) or "vllm" (lad.backends.engines).
    """

    def __init__(
        self,
        model: str | RecordSpec = RecordSpec.model,
        options: MethodOptions | None = None,
        *,
        preset: str = "paper",
        batch_size: int = 4,
        device: str = "auto",
        dtype: str = "auto",
        quiet: bool = True,
        check_calibration: bool = True,
        pictures: bool = True,
        engine: str = "hf",
        backend: Any = None,
        **settings: Any,
    ) -> None:
        names = (*SPEC_FIELDS, *OPTION_FIELDS)  # the record spec's and the method options'
        unknown = [k for k in settings if k not in names]
        if unknown:
            raise LadError(
                f"Debiaser got an unexpected setting {unknown[0]!r}. Settings: {', '.join(names)}."
            )
        values = with_preset(preset, settings, names, pictures)
        if isinstance(values.get("prompt_template"), PromptTemplate):
            values["prompt_template"] = values["prompt_template"].text
        spec = model if isinstance(model, RecordSpec) else RecordSpec(model=model)
        self.spec = spec.replace(**{k: v for k, v in values.items() if k in SPEC_FIELDS}).check()
        base = options or MethodOptions()
        changed = {k: v for k, v in values.items() if k in OPTION_FIELDS}
        self.obs_mean = changed.get("obs_mean", None if options is None else base.obs_mean)
        self._options = dataclasses.replace(base, **changed)
        self.batch_size, self.device, self.dtype, self.quiet = batch_size, device, dtype, quiet
        self.check_calibration, self.pictures = check_calibration, pictures
        self.engine = check_engine(engine)
        self._backend = backend

    def clone(self, **spec_changes: Any) -> Debiaser:
        """An unfitted Debiaser of the same spec (less `spec_changes`, RecordSpec fields such as
        labels= or prompt_template=), options and settings, sharing the loaded model."""
        spec = self.spec.replace(**spec_changes).check() if spec_changes else self.spec
        session = {name: getattr(self, name) for name in _SESSION}
        twin = Debiaser(spec, self._options, backend=self._backend, **session)
        twin.obs_mean = self.obs_mean
        return twin

    @property
    def model(self) -> str:
        return self.spec.model

    @property
    def labels(self) -> str:
        return self.spec.labels

    @property
    def prompt_template(self) -> PromptTemplate | None:
        text = self.spec.prompt_template
        return None if text is None else PromptTemplate(text)

    @property
    def backend(self) -> Any:
        if self._backend is None:
            loading = {name: getattr(self, name) for name in _LOADING}
            self._backend = self.spec.load_backend(**loading)
        return self._backend

    @property
    def options(self) -> MethodOptions:
        """How records are scored; Eq. 1's average is a fitted calibration's own, else the one
        `fit` would use."""
        fitted = getattr(self, "calibration_", None)
        obs_mean = fitted.obs_mean if fitted is not None else self.obs_mean or "prob"
        return dataclasses.replace(self._options, obs_mean=obs_mean)

    def _template(self, items: Sequence[Item]) -> PromptTemplate:
        return vanilla_template(items, self.prompt_template)

    def records(
        self,
        requests: list,
        template: PromptTemplate,
        path: Path | None = None,
        *,
        backend: Any = None,
    ) -> RecordSet:
        """The records of `requests` asked with `template` and this Debiaser's label scheme and
        batch size, made by `backend` (default: its own model, loaded on first use: a clone made
        before a model loaded does not share it) and, with `path`, written there as they come."""
        batches = {"scheme": self.spec.scheme, "batch_size": self.batch_size}
        made_by = self.backend if backend is None else backend
        stream = made_by.records(requests, template=template, **batches)
        if path is None:
            return RecordSet.from_records(list(stream))
        path.unlink(missing_ok=True)
        collected = []
        with RecordWriter(path) as writer:  # makes its folder
            for rec in stream:
                writer.write(rec)
                collected.append(rec)
        return RecordSet.from_records(collected)

    def fit(self, items: Sequence[Item], *, records_path: str | Path | None = None) -> Debiaser:
        """Calibrate on `items` (each shown under all N cyclic shifts)."""
        if not items:
            raise LadError("fit needs at least one calibration item")
        sizes = {it.num_candidates for it in items}
        if len(sizes) != 1:
            raise DataError(f"calibration items must all have the same N; got N in {sorted(sizes)}")
        self.spec.scheme.labels(sizes.pop())  # N within the label scheme, before the model
        check_images(items)  # before the model loads
        template = self._template(items)
        path = Path(records_path) if records_path else None
        records = self.records(cyclic_requests(items), template, path)
        made = self.spec.fingerprint(records.num_candidates, template=template)
        self.calibration_ = Calibration(obs_mean=self.obs_mean or "prob").fit(records, made)
        return self

    def save(self, path: str | Path) -> None:
        self._check_fitted()
        self.calibration_.save(path)

    def load(self, path: str | Path) -> Debiaser:
        """Use a calibration saved earlier (by `save`, `lad calibrate` or `lad eval`)."""
        calibration = Calibration.load(path)
        calibration.check_compatible(obs_mean=self.obs_mean, where=path)
        self.calibration_ = calibration
        self._source = path
        return self

    def _check_fitted(self) -> None:
        if not hasattr(self, "calibration_"):
            raise CalibrationError(
                "This Debiaser is not fitted yet. Call fit(items) or load(calibration.json) first."
            )

    def predict(
        self,
        query: str | None = None,
        images: Sequence[str | Path] = (),
        *,
        question: str | None = None,
        texts: Sequence[str] | None = None,
    ) -> Choice:
        """Which of `images` (in the order shown), or of the text options `texts`, matches
        `query`, or answers `question`, before and after debiasing. A question is asked with the
        question template (lad.core.prompts); text options with the text template, listed
        under their labels."""
        if (query is None) == (question is None):
            got = "both" if question is not None else "neither"
            raise LadError(
                f"predict needs exactly one of query (a caption) and question; got {got}"
            )
        if texts is not None and len(images):
            raise LadError("predict takes images or text options (texts), not both")
        text = query if question is None else question
        candidates = images if texts is None else texts
        asked = question is not None
        return self.predict_many([(text, candidates)], questions=asked, texts=texts is not None)[0]

    def predict_many(
        self,
        queries: Sequence[tuple[str, Sequence[Any]]],
        *,
        questions: bool = False,
        texts: bool = False,
    ) -> list[Choice]:
        """Debias a batch of (query, images) choices; one forward pass each. With `questions`,
        each text is a question of its own (as an item's `question`); with `texts`, each pair's
        candidates are text options, not picture paths (as an item's `candidates`)."""
        self._check_fitted()
        if not queries:
            raise LadError("predict_many needs at least one (query, images) pair")
        options = self.options  # --top-k and --tau checked before the model loads
        source = f"the calibration {getattr(self, '_source', '')}".rstrip()
        check_top_k(options.top_k, self.calibration_.num_layers, source)
        noun = "text options" if texts else "images"
        items = []
        for i, (text, candidates) in enumerate(queries):
            if not isinstance(text, str) or not text.strip():
                raise LadError(f"query {i + 1}: the text to ask is empty")
            limits.QUERY.check(len(text), "--question" if questions else "--query")
            if isinstance(candidates, (str, Path)) or len(candidates) < 2:
                got = 1 if isinstance(candidates, (str, Path)) else len(candidates)
                raise DataError(f"query {i + 1}: needs at least 2 {noun}, got {got}")
            if texts:
                if not all(isinstance(t, str) for t in candidates):
                    raise DataError(f"query {i + 1}: text options must be strings")
                check_texts(list(candidates), f"query {i + 1}: ", "text option")
            # The true answer is unknown here; the record's answer field is not used.
            paths, shown = ([], list(candidates)) if texts else ([Path(p) for p in candidates], [])
            asked = text if questions else None
            items.append(Item(f"query-{i}", text, paths, 0, question=asked, candidates=shown))
        check_images(items)
        sizes = {it.num_candidates for it in items}
        if len(sizes) > 1:
            raise DataError(f"predict_many needs the same N for every query; got {sorted(sizes)}")
        template = self._template(items)
        labels = self.check_calibration_for(items[0].num_candidates, template)
        requests = [(it, 0, list(range(it.num_candidates))) for it in items]
        records = self.records(requests, template)  # its L checked by `score` (lad.core.methods)
        return self._choices(items, records, labels)

    def check_calibration_for(self, num_candidates: int, template: PromptTemplate) -> list[str]:
        """Refuse, before the model runs, a fitted calibration made for another N, model, label
        scheme, prompt or preprocessing than queries of `num_candidates` asked with `template`
        (the layer count is checked on the records); return the labels c_1 … c_N."""
        self._check_fitted()
        asked = self.spec.fingerprint(num_candidates, template=template)
        self.calibration_.check_compatible(
            fingerprint=asked,
            strict=self.check_calibration,
            require_fingerprint=True,
            whose="this query's",
            where=getattr(self, "_source", None),
        )
        return list(asked.labels)

    def _choices(self, items: list[Item], records: RecordSet, labels: list[str]) -> list[Choice]:
        options = self.options
        debiased = score("lad", records, self.calibration_, options)
        posterior = lad_posterior(records, self.calibration_, options)
        layers = selected_layers(records, options)
        prob_before = np.exp(records.logprobs)
        prob_after = np.exp(debiased - debiased.max(axis=1, keepdims=True))
        prob_after /= prob_after.sum(axis=1, keepdims=True)
        return [
            Choice(
                query=it.query,
                labels=labels,
                vanilla=int(np.argmax(records.logprobs[r])),
                lad=int(np.argmax(debiased[r])),
                prob_before=prob_before[r].tolist(),
                prob_after=prob_after[r].tolist(),
                posterior=posterior[r].tolist(),
                layers=[int(x) for x in layers[r]],
                question=it.question is not None,
            )
            for r, it in enumerate(items)
        ]
