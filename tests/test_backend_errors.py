"""Errors of the HF backend: each names what is wrong and where (one tiny architecture suffices)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import lad.backends.hf as hf
from lad.backends import load_backend
from lad.backends.hf import Backend
from lad.core.labels import get_scheme
from lad.data.items import Item
from lad.errors import BackendError, DataError
from lad.testing.tiny import build_tiny_model

DIGITS = get_scheme("digits")


@pytest.fixture(scope="module")
def backend(tmp_path_factory: pytest.TempPathFactory) -> Backend:
    path = build_tiny_model("qwen2_vl", tmp_path_factory.mktemp("qwen") / "model")
    return load_backend(str(path), device="cpu", dtype="float32")


@pytest.fixture
def item(tmp_path: Path) -> Item:
    from PIL import Image

    rng = np.random.default_rng(0)
    paths = []
    for i in range(3):
        paths.append(tmp_path / f"{i}.png")
        Image.fromarray((rng.random((30, 30, 3)) * 255).astype("uint8")).save(paths[-1])
    return Item("q0", "red ball", paths, 2)


def _run(backend: Backend, item: Item, **kw) -> list:
    return list(backend.records([(item, 0, [2, 0, 1])], scheme=DIGITS, **kw))


def test_record_fields(backend: Backend, item: Item) -> None:
    (rec,) = _run(backend, item)
    assert (rec.item, rec.ordering, rec.order, rec.answer) == ("q0", 0, [2, 0, 1], 0)
    assert len(rec.logprobs) == 3
    assert np.array(rec.attention).shape == (backend.num_layers, 3)
    assert rec.extra["prompt_tokens"] > sum(rec.extra["image_tokens"])


def test_corrupt_and_missing_images_are_named(backend: Backend, item: Item) -> None:
    item.images[1].write_bytes(b"not a png at all")
    with pytest.raises(DataError, match=r"1\.png: cannot read image"):
        _run(backend, item)
    item.images[1].unlink()
    with pytest.raises(DataError, match=r"1\.png"):
        _run(backend, item)


def test_non_finite_output_is_refused_before_any_record(
    backend: Backend, item: Item, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = hf.evidence
    monkeypatch.setattr(hf, "evidence", lambda rows, spans: real(rows, spans) * float("nan"))
    with pytest.raises(BackendError, match=r"item 'q0', ordering 0: .*NaN or infinite"):
        _run(backend, item)


def test_image_span_count_mismatch(
    backend: Backend, item: Item, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = hf.encode

    def drop_one(*args, **kwargs):
        inputs, spans = real(*args, **kwargs)
        return inputs, [s[:-1] for s in spans]

    monkeypatch.setattr(hf, "encode", drop_one)
    with pytest.raises(BackendError, match="item 'q0': the prompt has 2 image spans but the item"):
        _run(backend, item)


def test_prompt_longer_than_context(
    backend: Backend, item: Item, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(backend, "max_context", 20)
    with pytest.raises(
        BackendError,
        match=r"the prompt has \d+ tokens \(\d+ for the images, \d+ for the text\), more than "
        r"the model's context of 20",
    ):
        _run(backend, item)


def test_a_long_caption_is_blamed_not_the_images(
    backend: Backend, item: Item, monkeypatch: pytest.MonkeyPatch
) -> None:
    item.query = "red ball " * 400
    (rec,) = _run(backend, item)
    monkeypatch.setattr(backend, "max_context", rec.extra["prompt_tokens"] - 1)
    with pytest.raises(BackendError, match=r"for the text\), more .*; shorten the query"):
        _run(backend, item)


def test_attention_that_bypasses_capture(backend: Backend, item: Item) -> None:
    backend.model.set_attn_implementation({"text_config": "sdpa"})
    try:
        with pytest.raises(BackendError, match="model_type 'qwen2_vl': lad cannot capture its"):
            _run(backend, item)
    finally:
        backend.model.set_attn_implementation({"text_config": "lad_capture"})
    assert len(_run(backend, item)) == 1


def test_bad_arguments(backend: Backend, item: Item) -> None:
    with pytest.raises(BackendError, match="'capture' parameter must be one of"):
        _run(backend, item, capture="slow")
    with pytest.raises(BackendError, match="'batch_size' parameter must be >= 1"):
        _run(backend, item, batch_size=0)
    with pytest.raises(BackendError, match=r"order \[0, 0, 1\] is not a permutation"):
        list(backend.records([(item, 0, [0, 0, 1])], scheme=DIGITS))


def test_unsupported_architecture_names_its_class(tmp_path: Path) -> None:
    # A Llama causal LM is supported since text candidates (a text-only model, lad.backends.text);
    # an encoder-decoder is neither a supported multimodal model nor a causal LM.
    from transformers import T5Config

    T5Config(architectures=["T5ForConditionalGeneration"]).save_pretrained(tmp_path)
    with pytest.raises(
        BackendError, match="Unsupported model architecture T5ForConditionalGeneration"
    ):
        load_backend(str(tmp_path), device="cpu")


def test_missing_model_and_bad_options(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for path in (tmp_path / "nowhere", "./nowhere", "runs/a/model", "~/model"):
        with pytest.raises(BackendError, match=f"--model {path}: no such model folder$"):
            load_backend(str(path), device="cpu")
    with pytest.raises(BackendError, match="cannot load model"):
        load_backend(str(tmp_path), device="cpu")  # a folder, but no checkpoint in it
    # A hub id with no such local folder is looked for in the cache; offline here, the hub is
    # not asked (HF_HUB_OFFLINE) and the error says so at once.
    monkeypatch.chdir(tmp_path)
    hub = r"--model no-org/no-model: not a local folder and not in the Hugging Face cache .*OFFLINE"
    with pytest.raises(BackendError, match=hub):
        load_backend("no-org/no-model", device="cpu")
    with pytest.raises(BackendError, match="'dtype' parameter must be one of"):
        load_backend(str(tmp_path), device="cpu", dtype="int8")


def test_an_image_option_the_processor_does_not_take_is_refused_before_the_weights() -> None:
    """transformers ignores a key its processor does not take (a warning at most): refused."""
    from lad.backends.checkpoint import resolve_model
    from lad.backends.load import open_checkpoint
    from lad.backends.settings import LoadSettings

    demo = resolve_model("demo")
    with pytest.raises(BackendError, match=r"^--image-option max_patches: the model's processor "
                       r"\(Qwen2VLProcessor\) takes no such option; it takes crop_size, .*, "
                       r"do_resize, .*temporal_patch_size$"):  # fmt: skip
        open_checkpoint(LoadSettings(demo, image_options={"max_patches": 6, "do_resize": True}))
    with pytest.raises(BackendError, match=r"^--image-option return_tensors: "):  # lad's own
        open_checkpoint(LoadSettings(demo, image_options={"return_tensors": "np"}))
    taken = {"do_resize": True, "max_pixels": 6000}  # max_pixels: lad's own, the processor's size
    assert open_checkpoint(LoadSettings(demo, image_options=taken)).options["do_resize"] is True


def test_image_span_not_found_names_model_placeholder_token_and_fix(
    backend: Backend, item: Item, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A processor whose placeholder expands to tokens other than the config's image token (a
    mismatched checkpoint) is refused naming the model, the placeholder, the id and the fix."""
    monkeypatch.setattr(backend, "image_token", 7)  # an id no image expands to
    with pytest.raises(BackendError) as e:
        _run(backend, item)
    message = str(e.value)
    assert backend.model_id in message and "<|image_pad|>" in message
    assert "(id 7, the config's image_token_id)" in message and "--chat-template" in message
    assert "image 1's placeholder" in message


def test_remote_code_is_refused_without_trust_remote_code(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(
        '{"model_type": "made_up_vlm", "auto_map": {"AutoConfig": "configuration_x.XConfig"}}'
    )
    with pytest.raises(BackendError, match=r"model_type 'made_up_vlm' .*--trust-remote-code") as e:
        load_backend(str(tmp_path), device="cpu")
    assert "\n" not in str(e.value)


@pytest.mark.parametrize(
    "device, message",
    [
        ("gpu", r"^--device must be auto, cpu or cuda\[:N\]\. Got 'gpu'\.$"),
        ("cuda:abc", r"^--device must be auto, cpu or cuda\[:N\]\. Got 'cuda:abc'\.$"),
        ("cuda:0x", r"^--device must be auto, cpu or cuda\[:N\]\. Got 'cuda:0x'\.$"),
    ],
)
def test_every_reader_of_device_refuses_it_by_one_rule(tmp_path, device, message):
    """load_backend and the CLIP embedder of lad data coco|flickr8k refuse a --device as lad
    eval's preflight does, one message, before anything loads (junk reached torch before)."""
    from lad.data.clip import ClipEmbedder

    with pytest.raises(BackendError, match=message):
        load_backend(str(tmp_path), device=device)
    with pytest.raises(BackendError, match=message):
        ClipEmbedder(str(tmp_path), device=device)


def test_a_cuda_device_the_machine_lacks_is_one_line(tmp_path, monkeypatch):
    """cuda:N past the machine's GPUs (or any CUDA without one) is refused naming what there is."""
    import torch

    from lad.io.device import resolve_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(BackendError, match=r"^--device cuda: no CUDA device is available here"):
        load_backend(str(tmp_path), device="cuda")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert resolve_device("cuda:0") == "cuda:0"
    with pytest.raises(BackendError, match=r"^--device cuda:1: this machine has 1 CUDA device"):
        load_backend(str(tmp_path), device="cuda:1")
