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

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from lad.backends.checkpoint import (
    check_repetition_penalty,
    resolve_model,
    resolve_repetition_penalty,
)
from lad.core.calibrate import Calibration
from lad.core.labels import get_scheme
from lad.core.methods import MethodOptions, lad_posterior, score, selected_layers
from lad.core.prompts import PromptTemplate, prompt_sha256, vanilla_template
from lad.core.records import RecordSet, RecordWriter
from lad.data.items import Item
from lad.data.orders import cyclic_requests
from lad.errors import CalibrationError, DataError, LadError
from lad.io import limits
from lad.io.images import check_image
from lad.run.config import run_preprocessing


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

    def summary(self, images: Sequence[str | Path]) -> str:
        """A table for a person: positions 1-based, as the prompt counts them."""
        names = [_shortened(str(image), 40) for image in images]
        lw = max(len("label"), *(len(label) for label in self.labels))
        iw = max(len("image"), *(len(name) for name in names))
        lines = [
            f"{'question' if self.question else 'query'}: {self.query}",
            f"{'':2} {'pos':>3}  {'label':<{lw}}  {'image':<{iw}}  {'P before':>8}  "
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


def _shortened(text: str, width: int) -> str:
    """`text`, or its end behind an ellipsis when longer than `width` (a file's name matters
    more than its folders)."""
    return text if len(text) <= width else "…" + text[-(width - 1) :]


class Debiaser:
    """Attention-guided debiasing for one model (sklearn-like: `fit`, then `predict` many).

    `fit` runs the symmetrised calibration set (§4.2) on a few items; `predict` costs one forward
    pass per query. Fitted attributes end in `_`.

    prompt_template: the vanilla prompt for every query (lad.core.prompts); None: the paper's
    caption
        template, or its question variant for items and queries that carry a question.
    check_calibration: refuse a calibration fitted with another model, label scheme, prompt
        template, chat template, image_size or image_options (False: only N and the layer count
        are checked).
    top_k, tau, mixture, attn_mean, layer_range: as lad.core.methods.MethodOptions. obs_mean: how
    `fit` averages Eq. 1 ("prob" when None); a loaded calibration keeps its own, and stating
    another is an error. image_size, image_options: as lad.backends.load_backend.
    repetition_penalty: the label steps' logits penalised as transformers' generate does (a
    number; "model": the model's generation_config's; None: none); records and calibrations
    made with and without it are not exchanged. The official code's choices: obs_mean="logit",
    mixture="log", attn_mean="raw", layer_range=(21, 35), image_size=336,
    repetition_penalty="model" (lad.run.presets.OFFICIAL). quiet: hide transformers' progress bars
    while the model loads.
    """

    def __init__(
        self,
        model: str = "demo",
        *,
        labels: str = "digits",
        top_k: int = 2,
        tau: float = 5.0,
        obs_mean: str | None = None,
        mixture: str = "prob",
        attn_mean: str = "log",
        layer_range: tuple[int, int] | None = None,
        image_size: int | None = None,
        image_options: dict[str, Any] | None = None,
        batch_size: int = 4,
        device: str = "auto",
        dtype: str = "auto",
        quiet: bool = True,
        prompt_template: PromptTemplate | None = None,
        check_calibration: bool = True,
        chat_template: str | Path | None = None,
        repetition_penalty: float | str | None = None,
        backend: Any = None,
    ) -> None:
        self.model = model
        self.labels = labels
        self.top_k = top_k
        self.tau = tau
        self.obs_mean = obs_mean
        self.mixture = mixture
        self.attn_mean = attn_mean
        self.layer_range = layer_range
        self.image_size = image_size
        self.image_options = image_options
        self.batch_size = batch_size
        self.device = device
        self.dtype = dtype
        self.quiet = quiet
        self.prompt_template = prompt_template
        self.check_calibration = check_calibration
        self.chat_template = chat_template
        check_repetition_penalty(repetition_penalty)
        self.repetition_penalty = repetition_penalty
        self._backend = backend

    @property
    def backend(self) -> Any:
        if self._backend is None:
            from lad.backends import load_backend
            from lad.io.limits import check_image_flags

            check_image_flags(self.image_size, self.image_options)
            self._backend = load_backend(
                resolve_model(self.model),
                device=self.device,
                dtype=self.dtype,
                image_options=self.image_options,
                image_size=self.image_size,
                chat_template=self.chat_template,
                repetition_penalty=self._penalty(),
                quiet=self.quiet,
            )
        return self._backend

    def _penalty(self) -> float | None:
        """The repetition penalty as a number ("model": the model's generation_config's)."""
        return resolve_repetition_penalty(self.repetition_penalty, self.model)

    @property
    def options(self) -> MethodOptions:
        return MethodOptions(
            top_k=self.top_k,
            tau=self.tau,
            obs_mean=self._obs_mean(),
            mixture=self.mixture,
            attn_mean=self.attn_mean,
            layer_range=self.layer_range,
        )

    def _obs_mean(self) -> str:
        """Eq. 1's average: a fitted calibration's own, else the one `fit` would use."""
        fitted = getattr(self, "calibration_", None)
        return fitted.obs_mean if fitted is not None else self.obs_mean or "prob"

    def _template(self, items: Sequence[Item]) -> PromptTemplate:
        return vanilla_template(items, self.prompt_template)

    def _fingerprint(self, n: int, template: PromptTemplate) -> tuple[list[str], str]:
        scheme = get_scheme(self.labels)
        return scheme.labels(n), prompt_sha256(template, scheme, n)

    def _preprocessing(self) -> dict[str, Any]:
        """How this Debiaser prepares chat and pictures, as calibration.json records it."""
        return run_preprocessing(
            {
                "chat_template": self.chat_template,
                "image_size": self.image_size,
                "image_options": self.image_options,
                "repetition_penalty": self._penalty(),
            }
        )

    def _records(
        self, requests: list, template: PromptTemplate, path: Path | None = None
    ) -> RecordSet:
        stream = self.backend.records(
            requests,
            template=template,
            scheme=get_scheme(self.labels),
            batch_size=self.batch_size,
        )
        if path is None:
            return RecordSet.from_records(list(stream))
        path.parent.mkdir(parents=True, exist_ok=True)
        path.unlink(missing_ok=True)
        collected = []
        with RecordWriter(path) as writer:
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
        get_scheme(self.labels).labels(sizes.pop())  # N within the label scheme, before the model
        for path in dict.fromkeys(p for it in items for p in it.pictures):
            check_image(path)  # before the model loads
        template = self._template(items)
        records = self._records(
            cyclic_requests(items), template, Path(records_path) if records_path else None
        )
        return self.fit_records(records, template=template)

    def fit_records(
        self, records: RecordSet, *, template: PromptTemplate | None = None
    ) -> Debiaser:
        """Calibrate from calibration records made earlier (e.g. `calibration.jsonl`) under
        `template` (default: this Debiaser's prompt_template, else the paper's caption one) and
        this Debiaser's chat_template, image_size and image_options (recorded as made with them)."""
        template = template or vanilla_template([], self.prompt_template)
        labels, sha = self._fingerprint(records.num_candidates, template)
        self.calibration_ = Calibration(obs_mean=self.obs_mean or "prob").fit(
            records,
            model=self.model,
            labels=labels,
            prompt_sha256=sha,
            preprocessing=self._preprocessing(),
        )
        return self

    def save(self, path: str | Path) -> None:
        self._check_fitted()
        self.calibration_.save(path)

    def load(self, path: str | Path) -> Debiaser:
        """Use a calibration saved earlier (by `save`, `lad calibrate` or `lad eval`)."""
        calibration = Calibration.load(path)
        if self.obs_mean is not None and self.obs_mean != calibration.obs_mean:
            raise CalibrationError(
                f"{path} was fitted with obs_mean {calibration.obs_mean!r} (Eq. 1), not "
                f"{self.obs_mean!r}; refit it (lad calibrate --obs-mean {self.obs_mean}) or drop "
                "the option to use the file's"
            )
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
    ) -> Choice:
        """Which of `images` (in the order shown) matches `query`, or answers `question`, before
        and after debiasing. A question is asked with the question template (lad.core.prompts)."""
        if (query is None) == (question is None):
            got = "both" if question is not None else "neither"
            raise LadError(
                f"predict needs exactly one of query (a caption) and question; got {got}"
            )
        text = query if question is None else question
        return self.predict_many([(text, images)], questions=question is not None)[0]

    def predict_many(
        self,
        queries: Sequence[tuple[str, Sequence[str | Path]]],
        *,
        questions: bool = False,
    ) -> list[Choice]:
        """Debias a batch of (query, images) choices; one forward pass each. With `questions`,
        each text is a question of its own (as an item's `question`)."""
        self._check_fitted()
        if not queries:
            raise LadError("predict_many needs at least one (query, images) pair")
        options = self.options  # --top-k and --tau checked before the model loads
        if options.top_k > self.calibration_.num_layers:
            raise CalibrationError(
                f"top_k {options.top_k} is more than the {self.calibration_.num_layers} layers "
                f"of the calibration {getattr(self, '_source', '')}".rstrip()
            )
        items = []
        for i, (text, images) in enumerate(queries):
            if not isinstance(text, str) or not text.strip():
                raise LadError(f"query {i + 1}: the text to ask is empty")
            limits.QUERY.check(len(text), "--question" if questions else "--query")
            if len(images) < 2:
                raise DataError(f"query {i + 1}: needs at least 2 images, got {len(images)}")
            for image in images:
                check_image(image)
            # The true answer is unknown here; the record's answer field is not used.
            paths = [Path(p) for p in images]
            question = text if questions else None
            items.append(Item(f"query-{i}", text, paths, 0, question=question))
        sizes = {it.num_candidates for it in items}
        if len(sizes) > 1:
            raise DataError(f"predict_many needs the same N for every query; got {sorted(sizes)}")
        template = self._template(items)
        labels = self.check_calibration_for(items[0].num_candidates, template)
        requests = [(it, 0, list(range(it.num_candidates))) for it in items]
        records = self._records(requests, template)
        self.calibration_.check_compatible(records, strict=False)
        return self._choices(items, records, labels)

    def check_calibration_for(self, num_candidates: int, template: PromptTemplate) -> list[str]:
        """Refuse, before the model runs, a fitted calibration made for another N, model, label
        scheme, prompt or preprocessing than queries of `num_candidates` asked with `template`
        (the layer count is checked on the records); return the labels c_1 … c_N."""
        self._check_fitted()
        labels, sha = self._fingerprint(num_candidates, template)
        if self.calibration_.num_candidates != len(labels):
            raise CalibrationError(
                f"the calibration is for N = {self.calibration_.num_candidates} candidates but "
                f"the query has N = {len(labels)}; calibrate with items of the same N"
            )
        try:
            self.calibration_.check_compatible(
                model=self.model,
                labels=labels,
                prompt_sha256=sha,
                preprocessing=self._preprocessing(),
                strict=self.check_calibration,
                require_fingerprint=True,
                whose="this query's",
                skip="check_calibration=False",
            )
        except CalibrationError as e:
            if not hasattr(self, "_source"):
                raise
            raise CalibrationError(f"{self._source}: {e}") from None
        return labels

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
