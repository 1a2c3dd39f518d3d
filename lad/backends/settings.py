"""`LoadSettings`: what defines a loaded model, the one object both engines load from
(lad.backends.engines: `load_backend`, `load_vllm_backend`; `lad serve`'s `engine_setup`) and
`lad.backends.load.open_checkpoint` reads the checkpoint's files by. `RecordSpec.load_settings`
is where a run, `Debiaser`, the harnesses and `lad serve` build it."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class LoadSettings:
    """model: a hub id, a local checkpoint folder or a shipped model ("demo").
    device: auto / cpu / cuda (cuda:K); dtype: auto / bfloat16 / float16 / float32.
    trust_remote_code: the checkpoint's own code may run (config.json auto_map).
    image_options: processor options over the architecture's defaults (Arch.processor_options);
    image_size: every picture resized to this square (bicubic) before the processor.
    chat_template: a Jinja file used instead of the checkpoint's own chat template.
    repetition_penalty: applied to the label steps' logits as `generate` would (Backend).
    pictures: whether picture candidates will be asked; False (text options only): the chat
    template is checked on a text prompt alone (lad.backends.load.open_checkpoint), so a
    multimodal model may take one that writes no pictures (lad's plain template, as lm-eval
    prompts).
    """

    model: str
    device: str = "auto"
    dtype: str = "auto"
    trust_remote_code: bool = False
    image_options: Mapping[str, Any] | None = None
    image_size: int | None = None
    chat_template: str | Path | None = None
    repetition_penalty: float | None = None
    pictures: bool = True

    @classmethod
    def of(cls, model: str | LoadSettings, **fields: Any) -> LoadSettings:
        """`model`'s settings (a LoadSettings as it is, or a hub id or folder with the defaults),
        with `fields` (LoadSettings' field names) changed."""
        base = model if isinstance(model, LoadSettings) else cls(model)
        return dataclasses.replace(base, **fields) if fields else base
