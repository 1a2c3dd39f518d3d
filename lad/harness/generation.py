"""Plain generation for the harness's other questions: the task's own prompt and pictures, the
model's chat template, greedy decoding (what any lmms-eval model does for a generate_until
request), so a whole task runs under `--model lad`."""

from __future__ import annotations

import re
from typing import Any

import torch

from lad.backends.prompting import chat_messages, render
from lad.harness.adapters import IMAGE_PLACEHOLDER


@torch.no_grad()
def generate_reply(
    backend: Any, text: str, images: list[Any], max_new_tokens: int, until: list[str]
) -> str:
    """The model's greedy reply to `images` then `text` (placeholders removed), cut before the
    first stop string of `until`."""
    text = re.sub(r"[ \t]*" + re.escape(IMAGE_PLACEHOLDER) + r"[ \t]*", " ", text).strip()
    images = [im.convert("RGB") for im in images]
    prompt = render(backend.processor, chat_messages(text, len(images)), True, backend.model_id)
    inputs = backend.processor(text=[prompt], images=images or None, return_tensors="pt")
    inputs = backend.to_device(dict(inputs))
    out = backend.model.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False)
    new = out[0, inputs["input_ids"].shape[1] :]  # (T_new,)
    reply = backend.processor.tokenizer.decode(new, skip_special_tokens=True)
    for stop in until:
        if stop and stop in reply:
            reply = reply[: reply.index(stop)]
    return reply
