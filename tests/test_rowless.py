"""A model with no Arch row (docs/backends.md, "Adding an architecture"): where its config shows
nothing a row would be needed for, lad runs it on defaults and its records are those the row
gives; where it cannot, one line names the model type."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from lad.backends import archs, load_backend
from lad.core.labels import get_scheme
from lad.data.items import Item
from lad.errors import BackendError
from lad.testing.tiny import build_tiny_model
from tests.test_backend import _images

DIGITS = get_scheme("digits")


def _without(monkeypatch: pytest.MonkeyPatch, model_type: str) -> None:
    rows = tuple(a for a in archs.ARCHS if model_type not in a.model_types)
    monkeypatch.setattr(archs, "ARCHS", rows)


@pytest.fixture(scope="module")
def llava(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model("llava", tmp_path_factory.mktemp("rowless") / "llava")


def _requests(folder: Path) -> list:
    pictures = _images(folder, 4, seed=3)
    items = [Item(f"q{k}", "red ball" if k else "a star", pictures, k) for k in range(2)]
    return [(item, 0, [2, 0, 3, 1]) for item in items]


def test_a_model_without_a_row_runs_on_defaults_as_with_it(
    llava: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    requests = _requests(tmp_path)
    with_row = list(load_backend(str(llava), device="cpu").records(requests, scheme=DIGITS))
    _without(monkeypatch, "llava")
    backend = load_backend(str(llava), device="cpu")
    assert backend.arch.name == "llava (no row)"
    without = list(backend.records(requests, scheme=DIGITS, batch_size=2))
    for a, b in zip(with_row, without, strict=True):
        assert a.extra == b.extra
        np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-6, rtol=0)
        np.testing.assert_allclose(a.attention, b.attention, atol=1e-6, rtol=0)


def test_a_rowless_model_whose_attention_cannot_be_captured_is_refused(
    llava: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _without(monkeypatch, "llava")
    backend = load_backend(str(llava), device="cpu")
    backend.model.set_attn_implementation({"text_config": "sdpa"})  # as a decoder of its own
    with pytest.raises(BackendError, match=r"^model_type 'llava': lad cannot capture its atten"):
        list(backend.records(_requests(tmp_path), scheme=DIGITS))


def test_a_rowless_model_with_mrope_is_refused_before_its_weights(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = build_tiny_model("qwen2_vl", tmp_path / "qwen")
    _without(monkeypatch, "qwen2_vl")
    with pytest.raises(BackendError, match=r"model_type 'qwen2_vl'\): it uses M-RoPE") as e:
        load_backend(str(path), device="cpu")
    assert "\n" not in str(e.value)
