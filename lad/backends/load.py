"""`load_backend`: a checkpoint (hub id, local folder or "demo") loaded as a `Backend`, its
language decoder's attention routed through lad's capture function (docs/backends.md)."""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from lad.backends import capture as cap
from lad.backends import remote, vision
from lad.backends import text as text_lm
from lad.backends.archs import Arch, arch_for
from lad.backends.checkpoint import (
    check_model_path,
    check_remote_code,
    load_error,
    read_chat_template,
    remote_code_note,
    resolve_model,
)
from lad.backends.hf import Backend
from lad.backends.prompting import chat_text, reply_tokens
from lad.backends.settings import LoadSettings
from lad.backends.threads import requested_threads, set_cpu_threads
from lad.errors import BackendError, check_choice
from lad.io.device import resolve_device

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def load_backend(
    model: str | LoadSettings,
    *,
    quiet: bool = False,
    threads: int | None = None,
    **settings: Any,
) -> Backend:
    """Load a hub id or local checkpoint, or "demo" (lad's embedded demo model, as everywhere
    else); its language decoder runs through the capture function.

    model: a LoadSettings (lad.backends.settings), or its model with `settings` (its fields by
    name) over the defaults. The chat template is checked before the weights load.
    quiet: no transformers progress bars ("Loading weights") while the weights load.
    threads: on a CPU, torch's thread count to keep (a resumed run's first one) unless
    LAD_NUM_THREADS is set; None: the cores free when the model has loaded (lad.backends.threads).
    The count in use and how it was chosen are the backend's `threads`.
    """
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    load = LoadSettings.of(model, **settings)
    requested_threads(os.environ)  # a bad LAD_NUM_THREADS is refused before the weights load
    dev = torch.device(resolve_device(load.device))
    check_choice("dtype", load.dtype, ["auto", *DTYPES], BackendError)
    auto = torch.bfloat16 if dev.type == "cuda" else torch.float32
    torch_dtype = {"auto": auto, **DTYPES}[load.dtype]
    ckpt = open_checkpoint(load)
    text_only, arch = ckpt.text_only, ckpt.arch
    impl: Any = {"text_config": cap.CAPTURE_IMPL, "vision_config": "sdpa", "": "sdpa"}
    if text_only:
        impl = cap.CAPTURE_IMPL
    if arch.remote_code:  # its own SDPA attention, captured by lad.backends.remote's hooks
        impl = "sdpa"
    else:
        cap.register()
    # One process with several GPUs and --device auto: spread a model too large for one GPU
    # over all of them (device_map). Under a launcher each process keeps its own GPU instead.
    spread = load.device == "auto" and torch.cuda.device_count() > 1
    spread = spread and "WORLD_SIZE" not in os.environ
    try:
        with _progress_bars(not quiet), warnings.catch_warnings():
            # torch warns of a pickle's protocol before refusing it: the refusal is the one line
            warnings.filterwarnings("ignore", "Detected pickle protocol", UserWarning)
            # remote code names its model class for AutoModelForCausalLM (config.json auto_map)
            causal = text_only or arch.remote_code
            auto = AutoModelForCausalLM if causal else AutoModelForImageTextToText
            net = auto.from_pretrained(
                ckpt.model,
                **remote.dtype_argument(torch_dtype),
                attn_implementation=impl,
                trust_remote_code=load.trust_remote_code,
                device_map="auto" if spread else None,
            )
    except Exception as e:  # e.g. a pickle torch's weights-only loader refuses (UnpicklingError)
        raise load_error(str(ckpt.model), e, weights=True) from None
    if arch.packed_vision:  # loaded with SDPA, then its vision attention routed through lad's
        vision.use_packed_vision(net)
    if arch.remote_code:
        remote.install(net)
    net = (net if spread else net.to(dev)).eval()
    backend = Backend(ckpt, net)
    if dev.type == "cpu":
        backend.threads = set_cpu_threads(threads)  # the cores free now, not all of them
    return backend


@dataclass(frozen=True)
class Checkpoint:
    """A checkpoint's files read and checked, before any weight: what a `Backend` is made of
    besides the model (lad.backends.vllm_engine builds its records from the same)."""

    model: str | Path  # the resolved folder or hub id
    settings: LoadSettings  # what it was opened with
    config: Any
    processor: Any
    arch: Arch
    options: dict[str, Any]  # the processor options in force (Arch.processor_options)
    owner: str  # what chat-template errors name
    text_only: bool


def open_checkpoint(settings: LoadSettings) -> Checkpoint:
    """The checkpoint's config and processor, its chat template tried on a prompt and a reply
    (LoadSettings' fields of the same names); a bad one, or remote code not trusted, is an
    error before any weight."""
    from transformers import AutoConfig, AutoProcessor, AutoTokenizer

    model, trust_remote_code = resolve_model(settings.model), settings.trust_remote_code
    chat_template, image_options = settings.chat_template, settings.image_options
    check_model_path(model)
    check_remote_code(model, trust_remote_code)
    template = read_chat_template(chat_template)
    try:
        config = AutoConfig.from_pretrained(model, trust_remote_code=trust_remote_code)
        text_only = text_lm.is_text_model(config)  # docs/backends.md, "Text candidates"
        if text_only:
            arch = text_lm.TEXT_ARCH
            tokenizer = AutoTokenizer.from_pretrained(model, trust_remote_code=trust_remote_code)
            processor = text_lm.TextProcessor(tokenizer)
        else:
            arch = arch_for(config)
            processor = AutoProcessor.from_pretrained(model, trust_remote_code=trust_remote_code)
    except BackendError:
        raise
    except Exception as e:  # a damaged or foreign file: whatever its reader raises
        raise load_error(model, e, note=remote_code_note(model)) from None
    remote.check_transformers(arch, str(model))
    options = arch.processor_options(image_options, processor)  # refused before the weights
    if template is not None:
        processor.chat_template = template
    processor.tokenizer.padding_side = "left"
    # A template that cannot write the prompt or a reply fails here, before the weights load.
    owner = str(model) if chat_template is None else f"--chat-template {chat_template}"
    if text_only:
        text_lm.check_text_options(image_options, settings.image_size)
    if text_only or not settings.pictures:  # a text prompt and the labels as a reply
        reply_tokens(processor, text_lm.PROBE_QUESTION, 0, ["1", "2"], owner)
    else:
        chat_text(processor, "Which image?", 2, owner)
        reply_tokens(processor, "Which image?", 2, ["1", "2"], owner)
    return Checkpoint(model, settings, config, processor, arch, options, owner, text_only)


@contextmanager
def _progress_bars(shown: bool) -> Iterator[None]:
    """transformers' progress bars off inside (if not `shown`), as they were after."""
    from transformers.utils import logging as hf_logging

    was = hf_logging.is_progress_bar_enabled()
    if not shown:
        hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was:
            hf_logging.enable_progress_bar()
