"""What `--model lad` does inside lm-evaluation-harness, without lm-eval (docs/harness.md, "What
`--model lad` does with the requests"): the questions of lad.harness.contexts scored by lad's
backend, one forward pass each (perm-avg: N), through lad's plain chat template
(lm_eval_files/plain.jinja), so a record's label log-probabilities are lm-eval's loglikelihoods
of the continuations " A", " B", ...; choice k gets the method's score of option k.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from lad.data.items import Item, read_items
from lad.errors import CalibrationError, LadError
from lad.harness.args import ModelArgs, check_model_args
from lad.harness.contexts import ContextQuestion
from lad.harness.runner import HarnessScorer
from lad.run.debiaser import Debiaser

FILES = Path(__file__).parent / "lm_eval_files"
PLAIN_CHAT_TEMPLATE = FILES / "plain.jinja"
MMLU_PROMPT = FILES / "mmlu.txt"  # lm-eval's MMLU prompt as a lad prompt template


@dataclass(frozen=True)
class ChoiceOptions(ModelArgs):
    """`--model_args` of lm-eval's `--model lad` and Inspect's `-M` (docs/harness.md)."""

    calibration_items: str | None = None  # an items file of text questions to fit on

    def __post_init__(self) -> None:
        check_model_args(self, "calibration_items", "<items file of text questions>")
        if self.calibration_items is not None and not Path(self.calibration_items).exists():
            raise LadError(f"calibration_items={self.calibration_items}: no such file")


class ContextScorer(HarnessScorer):
    """Scores lm-eval's questions with lad's backend; one instance per harness run."""

    def __init__(self, options: ChoiceOptions, backend: Any = None) -> None:
        # text options only: a multimodal model takes plain.jinja; every calibration file read
        # and checked before the model loads
        super().__init__(options, backend, pictures=False, chat_template=str(PLAIN_CHAT_TEMPLATE))
        self._items: list[Item] = []
        if options.calibration_items:
            self._items = read_items(options.calibration_items)
            pictures = next((it.id for it in self._items if not it.is_text), None)
            if pictures is not None:
                raise LadError(
                    f"calibration_items={options.calibration_items}: item {pictures!r} has "
                    "picture candidates; lm-eval's questions have text options"
                )
        self._fitted: dict[tuple[str, int, str], Debiaser | None] = {}

    def _debiaser(self, question: ContextQuestion) -> Debiaser:
        return self.base.clone(labels=question.scheme, prompt_template=question.template.text)

    def calibrated(self, question: ContextQuestion) -> Debiaser | None:
        """The Debiaser of this question's task, N and prompt: a calibration file checked
        against model, N, labels, prompt and chat template, or fitted on calibration_items."""
        key = question.key
        if key in self._fitted:
            return self._fitted[key]
        n, template = len(question.options), question.template
        debiaser: Debiaser | None = None
        if self._loaded:
            asks, into = f"task {question.task} asks questions", self._debiaser(question)
            debiaser = self.from_file(n, template, asks, into=into)
        elif self._items:
            items = [it for it in self._items if it.num_candidates == n]
            if not items:
                raise CalibrationError(
                    f"calibration_items={self.options.calibration_items} has no question of "
                    f"N = {n} options (task {question.task} asks such questions)"
                )
            _ = self.backend  # the model loads here, and the clone shares it
            debiaser = self._debiaser(question).fit(items)
        self._fitted[key] = debiaser
        return debiaser

    def score(self, questions: Sequence[ContextQuestion]) -> list[tuple[np.ndarray, int]]:
        """Per question (in order): the method's scores of its N options and the chosen one."""
        groups: dict[tuple[str, int, str], list[int]] = defaultdict(list)
        for q, question in enumerate(questions):
            groups[question.key].append(q)
        if self._loaded:  # each calibration file checked against its questions before the model
            for members in groups.values():
                self.calibrated(questions[members[0]])
        out: list[tuple[np.ndarray, int]] = [(np.zeros(0), -1)] * len(questions)
        method = self.options.method
        for members in groups.values():
            first = questions[members[0]]
            items = [questions[q].item() for q in members]
            shown = [(it, 0, list(range(it.num_candidates))) for it in items]
            debiaser = self.calibrated(first) or self._debiaser(first)
            _, _, scored = self.score_asked(shown, debiaser, [method], items, bootstrap=None)
            for row, q in enumerate(members):
                scores = np.asarray(scored.scores[method][row], dtype=np.float64)
                out[q] = (scores, int(scored.chosen[method][row]))
        return out
