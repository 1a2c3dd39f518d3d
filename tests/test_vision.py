"""lad_vision (lad.backends.vision) against transformers' own Qwen2-VL / Qwen2.5-VL vision towers.

Tiny random-init towers in float32, several images of different sizes in one batch, so windows
and images differ in length (the padded, masked layout) or are all equal (the plain layout);
Qwen2.5-VL with windowed and full-attention blocks.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import transformers

from lad.backends import load_backend
from lad.backends import vision as vis
from lad.core.labels import get_scheme
from lad.data.items import Item
from lad.testing.tiny import ARCHITECTURES, TinySize, build_tiny_model, build_tiny_parts

QWEN = ("qwen2_vl", "qwen2_5_vl")
MIXED = [[1, 8, 12], [1, 6, 6], [1, 10, 4], [2, 4, 6]]  # (t, h, w) patches; t = 2: two frames
EQUAL = [[1, 8, 8], [1, 8, 8], [1, 8, 8]]


def _model(arch: str) -> torch.nn.Module:
    config, _ = build_tiny_parts(arch, size=TinySize(vision_layers=4))
    if arch == "qwen2_5_vl":
        config.vision_config.fullatt_block_indexes = [1, 3]  # blocks 0 and 2 are windowed
    torch.manual_seed(0)
    model = getattr(transformers, ARCHITECTURES[arch].model_class)(config).eval()
    model.set_attn_implementation({"vision_config": "sdpa"})
    return model


def _tower(model: torch.nn.Module, grid: list[list[int]]) -> dict[str, torch.Tensor]:
    thw = torch.tensor(grid)
    gen = torch.Generator().manual_seed(1)
    pixels = torch.randn(int(thw.prod(-1).sum()), 3 * 2 * 14 * 14, generator=gen)
    with torch.no_grad():
        out = model.model.visual(pixels, grid_thw=thw)
    return {k: out[k] for k in ("last_hidden_state", "pooler_output")}


def _sdpa_calls(model: torch.nn.Module, grid: list[list[int]]) -> int:
    calls = []
    original = torch.nn.functional.scaled_dot_product_attention

    def counted(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    torch.nn.functional.scaled_dot_product_attention = counted
    try:
        _tower(model, grid)
    finally:
        torch.nn.functional.scaled_dot_product_attention = original
    return len(calls)


@pytest.mark.parametrize("arch", QWEN)
@pytest.mark.parametrize("grid", [MIXED, EQUAL], ids=["mixed", "equal"])
def test_packed_vision_equals_transformers(arch: str, grid: list[list[int]]) -> None:
    model = _model(arch)
    stock = _tower(model, grid)
    stock_calls = _sdpa_calls(model, grid)
    assert vis.use_packed_vision(model)
    assert model.config.vision_config._attn_implementation == vis.VISION_IMPL
    packed = _tower(model, grid)
    for name, ref in stock.items():
        torch.testing.assert_close(packed[name], ref, atol=1e-5, rtol=0, msg=name)
    depth = len(model.model.visual.blocks)
    assert _sdpa_calls(model, grid) == depth  # one call per block, however many segments
    assert stock_calls > 2 * depth  # transformers: one call per image / window


def test_segments_layout_is_exact() -> None:
    seg = vis.Segments.from_bounds([0, 3, 3, 8, 10], torch.device("cpu"))  # one empty segment
    assert (seg.count, seg.longest, seg.whole.tolist()) == (3, 5, [0, 10])
    assert seg.gather.view(3, 5).tolist() == [[0, 1, 2, 0, 0], [3, 4, 5, 6, 7], [8, 9, 0, 0, 0]]
    assert seg.keep.tolist() == [0, 1, 2, 5, 6, 7, 8, 9, 10, 11]
    assert seg.mask.view(3, 5).sum(-1).tolist() == [3, 5, 2]
    equal = vis.Segments.from_bounds([0, 4, 8], torch.device("cpu"))
    assert (equal.count, equal.longest, equal.gather, equal.mask) == (2, 4, None, None)


def test_hook_steps_aside_when_another_implementation_is_set() -> None:
    model = _model("qwen2_5_vl")
    stock = _tower(model, MIXED)
    vis.use_packed_vision(model)
    model.set_attn_implementation({"vision_config": "sdpa"})
    torch.testing.assert_close(_tower(model, MIXED)["pooler_output"], stock["pooler_output"])


def test_other_architectures_are_left_alone() -> None:
    config, _ = build_tiny_parts("llava")
    model = transformers.LlavaForConditionalGeneration(config)
    assert not vis.use_packed_vision(model)
    assert model.config.vision_config._attn_implementation != vis.VISION_IMPL


@pytest.mark.parametrize("arch", QWEN)
def test_load_backend_uses_packed_vision_and_records_match_stock(arch: str, tmp_path: Path) -> None:
    from PIL import Image

    size = TinySize(image_side=84)  # 6x6 patches: windows of Qwen2.5-VL's tiny config differ
    path = build_tiny_model(arch, tmp_path / "model", size=size)
    backend = load_backend(str(path), device="cpu", dtype="float32")
    assert backend.model.config.vision_config._attn_implementation == vis.VISION_IMPL
    rng = np.random.default_rng(0)
    images = []
    for i in range(4):
        images.append(tmp_path / f"{i}.png")
        Image.fromarray((rng.random((60 + 9 * i, 90, 3)) * 255).astype("uint8")).save(images[-1])
    items = [Item(f"q{k}", "red circle", images[k:] + images[:k], k) for k in range(3)]
    reqs = [(it, 0, [3, 1, 0, 2]) for it in items]
    digits = get_scheme("digits")
    packed = list(backend.records(reqs, scheme=digits, batch_size=3))
    backend.model.set_attn_implementation({"vision_config": "sdpa"})
    stock = list(backend.records(reqs, scheme=digits, batch_size=3))
    for p, s in zip(packed, stock, strict=True):
        np.testing.assert_allclose(p.logprobs, s.logprobs, atol=1e-5, rtol=0)
        np.testing.assert_allclose(p.attention, s.attention, atol=1e-5, rtol=0)
