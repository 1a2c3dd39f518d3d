"""lad.testing.tiny and .tokenizer: the locally made tokenizer, a checkpoint that loads back like a
hub one, the builders' table against lad.backends.archs."""

from __future__ import annotations

from pathlib import Path

import pytest

from lad.backends.archs import ARCHS
from lad.errors import BackendError
from lad.testing.tiny import ARCHITECTURES, TinySize, build_tiny_model
from lad.testing.tokenizer import build_tokenizer

SPECIAL = {"eos_token": "</s>", "pad_token": "<pad>"}


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer(SPECIAL, ["<image>"], words=["octagon", "Zebra"])


def _pieces(tok, text: str) -> list[str]:
    return tok.convert_ids_to_tokens(tok(text, add_special_tokens=False)["input_ids"])


def test_known_words_are_one_token_digits_split(tok) -> None:
    assert _pieces(tok, "Caption: red octagon") == ["Caption", ":", "\u2581red", "\u2581octagon"]
    assert _pieces(tok, "12") == ["1", "2"]
    assert _pieces(tok, "Zebra<image>\nthird") == ["Zebra", "<image>", "\n", "third"]


def test_unknown_words_fall_back_to_characters_and_round_trip(tok) -> None:
    text = "Given 10 images, pick XII qwzx.\nAnswer: 3"
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert tok.unk_token_id not in ids
    assert _pieces(tok, "qwzx") == ["q", "w", "z", "x"]
    assert tok.decode(ids) == text


def test_user_words_extend_the_vocabulary() -> None:
    plain = build_tokenizer(SPECIAL)
    extended = build_tokenizer(SPECIAL, words=["hexagon"])
    assert len(_pieces(plain, "hexagon")) > 1
    assert _pieces(extended, "a hexagon") == ["a", "\u2581hexagon"]


def test_checkpoint_loads_back_through_auto_classes(tmp_path: Path) -> None:
    from transformers import AutoModelForImageTextToText, AutoProcessor

    size = TinySize(text_layers=3, hidden=16, heads=2, kv_heads=1, intermediate=32)
    path = build_tiny_model("llava", tmp_path / "m", size=size, words=["octagon"], seed=3)
    model = AutoModelForImageTextToText.from_pretrained(path)
    processor = AutoProcessor.from_pretrained(path)
    assert type(model).__name__ == "LlavaForConditionalGeneration"
    assert model.config.text_config.num_hidden_layers == 3
    assert _pieces(processor.tokenizer, "an octagon")[-1] == "\u2581octagon"
    text = processor.apply_chat_template(
        [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "hi"}]}],
        add_generation_prompt=True,
        tokenize=False,
    )
    assert text == "USER: <image>\nhi ASSISTANT:"
    again = build_tiny_model("llava", tmp_path / "m2", size=size, words=["octagon"], seed=3)
    weights = AutoModelForImageTextToText.from_pretrained(again).state_dict()
    for name, value in model.state_dict().items():
        assert value.equal(weights[name]), name


def test_unknown_architecture(tmp_path: Path) -> None:
    with pytest.raises(BackendError, match="'arch' parameter must be one of"):
        build_tiny_model("gpt2", tmp_path)
    assert len(ARCHITECTURES) == 9


def test_one_builder_per_supported_architecture_with_its_markers() -> None:
    # lad.testing stays below lad.backends, so the builders' table is checked against the
    # backends' table here: each row builds a model_type lad supports, each Arch has a builder,
    # and the tokens lad counts into an image's span are special tokens of the tiny tokenizer.
    # A remote-code row runs only its checkpoint's own code: shrunk from it (lad.testing.remote).
    built_in = [a for a in ARCHS if not a.remote_code]
    for arch in built_in:
        built = [t for t in arch.model_types if t in ARCHITECTURES]
        assert len(built) == 1, arch.name
        assert set(arch.markers) <= set(ARCHITECTURES[built[0]].extra_special), arch.name
    assert sorted(ARCHITECTURES) == sorted(
        t for a in built_in for t in a.model_types if t != "smolvlm"
    )
