"""`--model lad` for lmms-eval (imported only by lmms-eval, through the entry point).

A generate_until request whose document is a picture question (lad.harness.adapters) is scored
by lad (lad.harness.runner) and answered with the option letter the task's own parser reads, so
the task's metric is unchanged; any other request gets the model's plain greedy generation. At
the end each (task, N) gets an audit folder under `output` (lad.harness.audit). docs/harness.md,
"What `--model lad` does with a request".
"""

from __future__ import annotations

import re
import time
from collections import defaultdict
from itertools import islice
from pathlib import Path
from typing import Any

from lmms_eval.api.instance import Instance
from lmms_eval.api.model import lmms
from loguru import logger
from tqdm import tqdm

from lad.backends.prompting import chat_messages, render
from lad.core.prompts import CONTEXT_PLACEHOLDER
from lad.errors import LadError
from lad.harness.adapters import PictureChoice, picture_choice, undecoded
from lad.harness.args import read_model_args
from lad.harness.audit import write_model_audit
from lad.harness.runner import HarnessOptions, PictureScorer

DEFAULT_MAX_NEW_TOKENS = 64


class LadModel(lmms):
    """lad's debiased multi-image choice inside lmms-eval (docs/harness.md)."""

    is_simple = True

    def __init__(self, **model_args: Any) -> None:
        super().__init__()
        self.options = read_model_args(HarnessOptions, model_args)
        self.scorer = PictureScorer(self.options)
        self._undecoded: dict[tuple[str, str], Any] = {}

    # ------------------------------------------------------------ lmms-eval's interface

    def loglikelihood(self, requests: list[Instance]) -> list[tuple[float, bool]]:
        raise NotImplementedError(
            "--model lad answers generate_until tasks (MuirBench, BLINK, …); loglikelihood "
            "tasks are not supported"
        )

    def generate_until_multi_round(self, requests: list[Instance]) -> list[str]:
        raise NotImplementedError("--model lad does not answer multi-round tasks")

    def generate_until(self, requests: list[Instance]) -> list[str]:
        replies: list[str | None] = [None] * len(requests)
        pictures: dict[tuple[str, int], list[tuple[int, PictureChoice]]] = defaultdict(list)
        others = []
        for r, request in enumerate(requests):
            _, _, _, doc_id, task, split = request.args
            doc = self._docs(task, split)[doc_id]
            if doc.get("lad_repeat"):
                raise LadError(
                    f"{task}: asks each ordering twice (a *_circular_repeat task), which measures "
                    "a sampling model's noise floor; --model lad scores greedily, so run the task "
                    "without _repeat (lad's own floor: docs/metrics.md)"
                )
            choice = picture_choice(doc, self.options.adapter)
            if choice is None:
                others.append(r)
            else:
                pictures[(task, choice.num_candidates)].append((r, choice))
        logger.info(
            f"lad: {len(requests) - len(others)} picture questions scored by lad "
            f"(method={self.options.method}), {len(others)} answered by plain generation"
        )
        results = []
        start = time.perf_counter()
        if pictures:
            _ = self.scorer.backend  # the model loads here, timed apart from the scoring
            logger.info(f"lad: model loaded in {time.perf_counter() - start:.1f} s")
            start = time.perf_counter()
        for (task, n), group in sorted(pictures.items()):
            split = requests[group[0][0]].args[5]
            debiaser, source = self.scorer.calibrated(
                task, n, self._calibration_docs(task, split, n)
            )
            choices = [c for _, c in group]
            self._say_calibration(task, n, source, choices, split)
            result = self.scorer.score(task, choices, debiaser, source)
            chosen = result.scored.chosen[self.options.method]
            for (r, choice), p in zip(group, chosen, strict=True):
                replies[r] = choice.replies[int(p)]
            results.append(result)
        if pictures:
            logger.info(f"lad: picture questions scored in {time.perf_counter() - start:.1f} s")
        for r in tqdm(others, desc="lad: plain generation", disable=not others):
            replies[r] = self._generate(requests[r])
        if results:
            path = write_model_audit(results, Path(self.options.output), self.options)
            logger.info(f"lad: audit written to {path}")
        return [str(x) for x in replies]

    # ------------------------------------------------------------ helpers

    def _generate(self, request: Instance) -> str:
        """What any lmms-eval model does for a generate_until request: the task's own prompt
        (placeholders removed) after its pictures, the model's chat template, greedy decoding,
        the reply cut before the first stop string of `until`."""
        ctx, gen_kwargs, doc_to_visual, doc_id, task, split = request.args
        visuals = doc_to_visual(self.task_dict[task][split][doc_id]) or []
        until = gen_kwargs.get("until") or []
        until = [until] if isinstance(until, str) else list(until)
        max_new = int(gen_kwargs.get("max_new_tokens") or DEFAULT_MAX_NEW_TOKENS)
        backend, images = self.scorer.backend, [im.convert("RGB") for im in visuals]
        text = re.sub(r"[ \t]*" + re.escape(CONTEXT_PLACEHOLDER) + r"[ \t]*", " ", ctx).strip()
        prompt = render(backend.processor, chat_messages(text, len(images)), True, backend.model_id)
        inputs = backend.processor(text=[prompt], images=images or None, return_tensors="pt")
        inputs = backend.to_device(dict(inputs))
        out = backend.model.generate(**inputs, max_new_tokens=max_new, do_sample=False)
        new = out[0, inputs["input_ids"].shape[1] :]  # (T_new,); generate runs without grad
        reply = backend.processor.tokenizer.decode(new, skip_special_tokens=True)
        for stop in filter(None, until):
            reply = reply.split(stop, 1)[0]
        return reply

    def _docs(self, task: str, split: str) -> Any:
        """The task's documents with their pictures undecoded (lad.harness.adapters.undecoded)."""
        key = (task, split)
        if key not in self._undecoded:
            self._undecoded[key] = undecoded(self.task_dict[task][split])
        return self._undecoded[key]

    def _calibration_docs(self, task: str, split: str, n: int) -> list[tuple[int, PictureChoice]]:
        """calibration_docs=K: the first K picture questions of N options in the task's split
        (dataset order, a circular variant's unshifted documents), with a known answer."""
        k = self.options.calibration_docs
        if not k:
            return []
        docs = self._docs(task, split)
        asked = ((d, picture_choice(docs[d], self.options.adapter)) for d in range(len(docs)))
        usable = (
            (d, c)
            for d, c in asked
            if c is not None and c.answer is not None and c.num_candidates == n and c.ordering == 0
        )
        return list(islice(usable, k))  # lazily: the first K only

    def _say_calibration(
        self, task: str, n: int, source: Any, scored: list[PictureChoice], split: str
    ) -> None:
        if source.kind == "file":
            logger.info(f"lad: {task} N={n}: calibration {source.path}")
            return
        if source.kind != "docs":
            return
        items = set(source.items)
        docs = self._docs(task, split)
        # Every document of a calibration item (a circular variant's shifts follow each other).
        last = max(source.doc_ids)
        while last + 1 < len(docs):
            choice = picture_choice(docs[last + 1], self.options.adapter)
            if choice is None or choice.item not in items:
                break
            last += 1
        source.exclude_offset = last + 1
        also = sorted({c.item for c in scored if c.item in items})
        source.also_scored = also
        fitted = (
            f"lad: {task} N={n}: calibration_docs={len(items)} fitted on documents {source.doc_ids}"
        )
        if also:
            logger.warning(
                f"{fitted} (items {sorted(items)}); {len(also)} of these items were ALSO scored. "
                f"lmms-eval cannot skip single documents; --offset {last + 1} starts the "
                "evaluation after all of them"
            )
        else:
            logger.info(f"{fitted}, none of them scored")
