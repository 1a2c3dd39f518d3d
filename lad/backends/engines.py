"""The engines that make records, by name (`--engine`, `Debiaser(engine=)`): each a function
of a `LoadSettings` (lad.backends.settings) and `load_backend`'s `quiet` and `threads`, returning
an object with `Backend.records` (docs/backends.md)."""

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


def load_engine(
    engine: str, settings: LoadSettings, *, quiet: bool = False, threads: int | None = None
) -> Any:
    """The model of `settings` loaded by `engine` (hf: lad.backends.load.load_backend)."""
    module, name = ENGINES[check_engine(engine)].split(":")
    return getattr(import_module(module), name)(settings, quiet=quiet, threads=threads)
