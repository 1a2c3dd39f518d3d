"""`RecordSpec`: what defines a record, and the one place its fingerprint is computed.

Two records are comparable (and a calibration fits records) only if they were made by the same
model, under the same label scheme, prompt and chat template, from pictures prepared the same way,
with the same repetition penalty on the label steps. calibration.json stores the fingerprint
(`model`, `labels`, `prompt_sha256`, `preprocessing`); `Calibration.check_compatible` compares
two of them.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lad.backends.checkpoint import (
    check_repetition_penalty,
    resolve_model,
    resolve_repetition_penalty,
)
from lad.backends.engines import load_engine
from lad.backends.settings import LoadSettings
from lad.core.fingerprint import Fingerprint
from lad.core.labels import LABEL_SCHEMES, LabelScheme, get_scheme
from lad.core.methods import flag
from lad.core.prompts import (
    CAPTION,
    PromptTemplate,
    check_template,
    prompt_sha256,
    vanilla_template,
)
from lad.io.files import InputPath
from lad.io.limits import check_image_flags
from lad.run.runjson import file_digest


@dataclass(frozen=True)
class RecordSpec:
    """What defines a record (docs/formats.md, calibration.json's fingerprint); each field's help
    says what it holds.

    prompt_template: the vanilla prompt's text (lad.core.prompts; the flag names its file); None:
        the paper's caption prompt, or its question variant for items that ask a question
        (`Debiaser`).
    image_options: processor options over the architecture's defaults (max_pixels, ...).
    repetition_penalty: "model": the model's generation_config's; None: none.
    """

    model: str = flag(
        "demo",
        "hub id or local path of a supported model, or a model shipped with lad: 'demo' "
        "(pictures), 'text-demo' (text options; docs/demo-model.md)",
    )
    labels: str = flag(
        "digits", "how positions are named in the prompt and answer", choices=tuple(LABEL_SCHEMES)
    )
    prompt_template: str | None = flag(
        None,
        "your own prompt text with placeholders {query} (the question or caption), {n}, "
        "{labels}, {first}, {last}, {noun}, {single}, and {options} where text candidates are "
        "listed (required for them, refused for pictures; lad.core.prompts); default: the "
        "paper's template, its question variant for items with a 'question', or the text "
        "template for items of text candidates",
        type=InputPath,
        metavar="FILE",
    )
    chat_template: str | None = flag(
        None,
        "Jinja chat template to use instead of the checkpoint's own (e.g. for a base model "
        "whose template ignores images)",
        type=InputPath,
        metavar="FILE",
    )
    image_size: int | None = flag(
        None,
        "resize every picture to PIXELS×PIXELS (bicubic) before the processor (default: as "
        "it is; official: 336, 144 tokens per image on Qwen2.5-VL)",
        minimum=1,
        metavar="PIXELS",
    )
    image_options: Mapping[str, Any] = field(default_factory=dict)
    repetition_penalty: float | str | None = flag(
        None,
        "penalise the label steps' logits of tokens already in the sequence, as "
        "transformers' generate does with repetition_penalty P; 'model': the model's "
        "generation_config's (official: 'model', 1.05 for Qwen instruct; default: none)",
        metavar="P",
    )
    trust_remote_code: bool = flag(
        False,
        "run the modeling code a checkpoint ships (config.json auto_map), e.g. "
        "LLaVA-OneVision-1.5's, in an environment with the transformers it needs "
        "(docs/backends.md, 'Remote code'); off by default",
        action="store_true",
        flag_default=None,  # unstated
    )

    def check(self) -> RecordSpec:
        """Refuse a value out of range, before any model work; returns self."""
        _ = self.scheme
        check_repetition_penalty(self.repetition_penalty)
        if self.prompt_template is not None:
            check_template(self.prompt_template, "--prompt-template")
        check_image_flags(self.image_size, dict(self.image_options))
        return self

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> RecordSpec:
        """The spec of run.json's "arguments" (or any mapping holding its field names)."""
        names = {f.name for f in dataclasses.fields(cls)}
        given = {k: v for k, v in values.items() if k in names and v is not None}
        if "image_options" in given:
            given["image_options"] = dict(given["image_options"])
        return cls(**given)

    def replace(self, **changes: Any) -> RecordSpec:
        return dataclasses.replace(self, **changes)

    @property
    def scheme(self) -> LabelScheme:
        """The label scheme the records name candidates with (lad.core.labels)."""
        return get_scheme(self.labels)

    @property
    def template(self) -> PromptTemplate:
        """The vanilla prompt: the given text, else the paper's caption prompt."""
        return CAPTION if self.prompt_template is None else PromptTemplate(self.prompt_template)

    def for_items(self, items: Sequence[Any]) -> RecordSpec:
        """This spec with its vanilla prompt fixed for `items` (lad.core.prompts.vanilla_template):
        a given template stays (refused if it does not fit them); else the question (or text)
        template where the items need one is written out, so run.json, the calibration's
        fingerprint and every rescoring agree."""
        given = None if self.prompt_template is None else self.template
        template = vanilla_template(items, given)
        keep = given is not None or template == CAPTION
        return self if keep else self.replace(prompt_template=template.text)

    def penalty(self) -> float | None:
        """The repetition penalty as a number ("model" reads the model's generation_config)."""
        return resolve_repetition_penalty(self.repetition_penalty, self.model)

    def preprocessing(self, inputs: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """calibration.json's "preprocessing" (lad.core.calibrate.PREPROCESSING).

        The chat template is the SHA-256 of its file's bytes (None: the checkpoint's own):
        run.json's fingerprint of it where `inputs` (run.json's "inputs") holds one, so a
        finished run rescores without the file, else the file's; left out (unknown, not
        compared) when neither exists.
        """
        out: dict[str, Any] = {}
        if self.chat_template is None:
            out["chat_template_sha256"] = None
        else:
            sha = ((inputs or {}).get("chat_template") or {}).get("sha256")
            if sha is None and Path(self.chat_template).is_file():
                sha = file_digest(self.chat_template)["sha256"]
            if sha is not None:
                out["chat_template_sha256"] = sha
        out["image_size"] = self.image_size
        options = dict(self.image_options or {})
        out["image_options"] = json.loads(json.dumps(options, sort_keys=True))  # as a file has it
        penalty = self.penalty()
        if penalty is not None:  # absent: none (files from before it existed agree)
            out["repetition_penalty"] = penalty
        return out

    def fingerprint(
        self,
        num_candidates: int,
        inputs: Mapping[str, Any] | None = None,
        template: PromptTemplate | None = None,
    ) -> Fingerprint:
        """What calibration.json records of the records it was fitted on (`Calibration.fit`),
        and what `Calibration.check_compatible` compares."""
        return Fingerprint(
            model=self.model,
            labels=tuple(self.scheme.labels(num_candidates)),
            prompt_sha256=prompt_sha256(template or self.template, self.scheme, num_candidates),
            preprocessing=self.preprocessing(inputs),
        )

    def load_settings(
        self, *, device: str = "auto", dtype: str = "auto", pictures: bool = True
    ) -> LoadSettings:
        """What the model of this spec's records is loaded with, for either engine
        (lad.backends.settings); `pictures` False: text options only."""
        return LoadSettings(
            resolve_model(self.model),
            device=device,
            dtype=dtype,
            trust_remote_code=self.trust_remote_code,
            image_options=dict(self.image_options) or None,
            image_size=self.image_size,
            chat_template=self.chat_template,
            repetition_penalty=self.penalty(),
            pictures=pictures,
        )

    def load_backend(
        self, *, quiet: bool = False, threads: int | None = None, engine: str = "hf", **loading: Any
    ) -> Any:
        """The model, loaded to make records of this spec (`loading`: `load_settings`' device,
        dtype and pictures; `threads`: a resumed run's CPU thread count; `engine`: what makes the
        records, lad.backends.engines)."""
        settings = self.load_settings(**loading)
        return load_engine(engine, settings, quiet=quiet, threads=threads)
