"""What --device means, in every command and in the library: one rule, one message per refusal."""

from __future__ import annotations

import re

from lad.errors import BackendError, LadError


def resolve_device(device: str, error: type[LadError] = BackendError) -> str:
    """The device torch is to use: "cpu", or "cuda" / "cuda:N" where this machine has it; "auto"
    is CUDA where there is one, else the CPU. Anything else is `error` in one line."""
    if device == "cpu":
        return device
    if device != "auto" and not re.fullmatch(r"cuda(:\d+)?", device):
        raise error(f"--device must be auto, cpu or cuda[:N]. Got {device!r}.")
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if not torch.cuda.is_available():
        raise error(f"--device {device}: no CUDA device is available here; use --device cpu")
    count = torch.cuda.device_count()
    if int(device.partition(":")[2] or 0) >= count:
        raise error(f"--device {device}: this machine has {count} CUDA device(s)")
    return device
