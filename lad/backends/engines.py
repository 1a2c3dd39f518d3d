"""The engines that make records, by name (`--engine`, `Debiaser(engine=)`): each a function
with `load_backend`'s arguments (a `LoadSettings`, lad.backends.settings, or a model and its
fields by name; `quiet`, `threads`) returning an object with `Backend.records`
(docs/backends.md)."""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

from lad.errors import BackendError

if TYPE_CHECKING:
    from lad.backends.settings import LoadSettings

ENGINES = {
    "hf": "lad.backends:load_backend",
    "vllm": "lad.backends.vllm_engine:load_vllm_backend",
}


def check_engine(engine: str) -> str:
    if engine not in ENGINES:
        raise BackendError(f"--engine must be one of {', '.join(ENGINES)}. Got {engine!r}.")
    return engine


def load_engine(engine: str, model: str | LoadSettings, **kwargs: Any) -> Any:
    """The model loaded by `engine` (hf: lad.backends.load.load_backend): a LoadSettings, or a
    model with its fields in `kwargs`, beside the engine's own (quiet, threads, engine_args)."""
    module, name = ENGINES[check_engine(engine)].split(":")
    return getattr(import_module(module), name)(model, **kwargs)
