"""What the fast capture adds inside each decoder layer: a few kernels, no read-back to the host.

Every aten op the capture issues during a real prefill (tiny models, a left-padded batch, float32
and bfloat16) is recorded with a TorchDispatchMode: per layer at most 5 ops that launch kernels,
none of them a host read (`.item()`, `.tolist()`, `int(tensor)`, a copy to the CPU); the mask's
last row is turned into a bias once per forward, not per layer.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from lad.backends import capture as cap
from lad.backends import load_backend
from lad.core.labels import get_scheme
from lad.data.items import Item
from lad.testing.tiny import build_tiny_model

# Ops that only make views or allocate: no kernel is launched for them.
NO_KERNEL = {
    "select", "slice", "view", "_unsafe_view", "alias", "transpose", "t", "expand", "unsqueeze",
    "permute", "detach", "new_empty", "empty",
}  # fmt: skip
# Python-level calls that read a tensor back to the host (a device sync on a GPU).
HOST_READS = {"item", "tolist", "cpu", "numpy", "__int__", "__bool__", "__float__", "__index__"}


class _Ops(TorchDispatchMode):
    """aten ops, i.e. what reaches the device."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(func.overloadpacket.__name__)
        out = func(*args, **(kwargs or {}))
        if isinstance(out, torch.Tensor):
            self.largest = max(getattr(self, "largest", 0), out.numel())
        return out


class _Calls(TorchFunctionMode):
    """Python-level torch calls, where host reads show (`.to` with a CPU device included)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", str(func))
        to_host = name == "to" and "cpu" in str([*args[1:], *(kwargs or {}).values()])
        self.calls.append("cpu" if to_host else name)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("arch", ["llava", "qwen2_5_vl", "qwen3_vl", "qwen3_5"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_capture_adds_few_kernels_and_no_host_reads(
    arch: str, dtype: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from PIL import Image

    backend = load_backend(str(build_tiny_model(arch, tmp_path / "m")), device="cpu", dtype=dtype)
    image = tmp_path / "x.png"
    Image.fromarray(np.zeros((20, 20, 3), dtype="uint8")).save(image)
    short = Item("a", "star", [image] * 2, 0)
    long = Item("b", "a red circle next to a blue square", [image] * 2, 1)
    reqs = [(short, 0, [0, 1]), (long, 0, [1, 0])]
    texts, images = backend.build_prompts(reqs, "vanilla", get_scheme("digits"))
    inputs, _ = backend.encode(reqs, texts, images)
    assert not bool(inputs["attention_mask"].all())  # left padded: the mask is used

    per_layer: list[tuple[list[str], list[str]]] = []
    largest: list[float] = []
    bias_calls = []
    real_row, real_bias = cap.last_row_attention, cap.mask_bias

    def recorded_row(*args, **kwargs):
        with _Calls() as calls, _Ops() as ops:
            out = real_row(*args, **kwargs)
        per_layer.append((ops.ops, calls.calls))
        largest.append(ops.largest / args[1].numel())  # against the layer's keys (B, H_kv, T, D)
        return out

    def counted_bias(*args, **kwargs):
        bias_calls.append(1)
        return real_bias(*args, **kwargs)

    monkeypatch.setattr(cap, "last_row_attention", recorded_row)
    monkeypatch.setattr(cap, "mask_bias", counted_bias)
    pre = backend.prefill(inputs, "fast", keep_cache=False)

    assert len(per_layer) == backend.num_layers and pre.rows.shape[1] == backend.num_layers
    assert len(bias_calls) == 1  # one mask, one bias for all layers
    for ops, calls in per_layer:
        kernels = [name for name in ops if name not in NO_KERNEL]
        assert len(kernels) <= 5, kernels
        assert "baddbmm" in kernels and "softmax" in str(kernels)
        assert not HOST_READS & set(calls), calls
        assert "_to_copy" not in ops or dtype == "bfloat16"  # float32 needs no conversion
    # O(T) per layer: nothing the capture makes is larger than the layer's keys (a float32 copy
    # of them in bfloat16); a T x T map would be T / D times larger.
    b, t = inputs["attention_mask"].shape
    assert pre.rows.shape == (b, backend.num_layers, t) and max(largest) <= 1.0
