"""The tokenizer sanity check (lad.backends.prompting.check_round_trip): a prompt's tokens must
decode back to its text. It fires on tokenizers that lose whitespace and stays quiet on every tiny
model, the demo model and the real checkpoint files (LAD_REAL_CHECKPOINTS, as in
tests/test_real_checkpoints.py)."""

from __future__ import annotations

import json
import os
import re
import string
from pathlib import Path

import numpy as np
import pytest

from lad.backends import load_backend
from lad.backends.prompting import chat_text, check_round_trip
from lad.core.labels import LABEL_SCHEMES, get_scheme
from lad.core.prompts import TEMPLATES, render_prompt
from lad.data.items import Item
from lad.demo import demo_model_path
from lad.errors import BackendError
from lad.testing.tiny import ARCHITECTURES, build_tiny_model

ENV = "LAD_REAL_CHECKPOINTS"
PROMPTS = len(TEMPLATES) * len(LABEL_SCHEMES) * 3  # every template and label scheme, N = 2, 4, 12
PROMPT = "Given 4 images indexed from 1 to 4, pick one.\nCaption: a dog  on a sofa.\nAnswer: "


def _byte_level_over_characters():
    """A character vocabulary read through a byte-level pre-tokenizer and decoder: what a
    character-level tokenizer becomes when another transformers version loads it as byte-level
    BPE. " " and "\\n" map to bytes the vocabulary lacks, and vanish."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    chars = string.ascii_letters + string.digits + string.punctuation + " \n"
    tok = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(chars)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=tok)


def test_a_tokenizer_that_drops_whitespace_is_refused_naming_the_model():
    tok = _byte_level_over_characters()
    kept = PROMPT.replace(" ", "").replace("\n", "")
    assert tok.decode(tok(PROMPT)["input_ids"]) == kept  # the failure being guarded against
    with pytest.raises(BackendError) as e:
        check_round_trip(tok, PROMPT, "someone/char-qwen")
    message = str(e.value)
    assert message.startswith("someone/char-qwen: its tokenizer does not give the prompt back")
    assert f"a {len(PROMPT)}-character prompt made {len(kept)} tokens" in message
    assert f"decode to {len(kept)} characters, first differing at character 5" in message


def test_the_tokenizers_own_normalisation_is_allowed():
    """NFC (Qwen's normalizer) turns a decomposed é into one character: not a failure."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    chars = string.ascii_letters + " é"
    tok = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(chars)}, merges=[]))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Split(" ", behavior="isolated")
    tok.decoder = decoders.Fuse()
    tok = PreTrainedTokenizerFast(tokenizer_object=tok)
    decomposed = "cafe\u0301 au lait"
    assert tok.decode(tok(decomposed)["input_ids"]) == "caf\u00e9 au lait"
    check_round_trip(tok, decomposed, "nfc")


@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tiny")
    models = {arch: build_tiny_model(arch, root / arch) for arch in ARCHITECTURES}
    return {**models, "demo": demo_model_path()}


def _every_prompt(processor, name: str) -> int:
    """Check each template × label scheme × N in {2, 4, 12}; returns how many were checked."""
    count = 0
    for template in TEMPLATES:
        for scheme in LABEL_SCHEMES:
            for n in (2, 4, 12):
                text = render_prompt(
                    template, "a red ball  next to a blue box.", get_scheme(scheme), n
                )
                check_round_trip(processor.tokenizer, chat_text(processor, text, n), name)
                count += 1
    return count


def test_quiet_on_every_tiny_model_and_the_demo(tiny_models):
    from transformers import AutoProcessor

    for name, path in tiny_models.items():
        assert _every_prompt(AutoProcessor.from_pretrained(path), name) == PROMPTS


def _real_checkpoints() -> list[Path]:
    folders = [Path(p) for p in os.environ.get(ENV, "").split(os.pathsep) if p.strip()]
    return [
        c
        for f in folders
        if f.is_dir()
        for c in sorted(f.iterdir())
        if (c / "config.json").is_file()
    ]


@pytest.mark.skipif(not _real_checkpoints(), reason=f"{ENV} names no real checkpoint folders")
def test_quiet_on_the_real_checkpoint_files():
    """Their own tokenizer, chat template and processor files (no weights are needed)."""
    from transformers import AutoProcessor

    for path in _real_checkpoints():
        processor = AutoProcessor.from_pretrained(path)
        assert _every_prompt(processor, path.name) == PROMPTS
        # Captions from the wild: non-ASCII, a tab, double and trailing spaces.
        text = render_prompt("vanilla", "Ünïcödé café\tnaïve  “quoted” ", get_scheme("digits"), 4)
        check_round_trip(processor.tokenizer, chat_text(processor, text + " ", 4), path.name)


def test_a_tiny_qwen25_vl_loaded_as_byte_level_bpe_fails_before_any_record(tmp_path):
    """The case seen: a Qwen2 tokenizer config under transformers 5 rebuilds the tiny
    character-level vocabulary as byte-level BPE, which drops every space and newline."""
    from PIL import Image

    path = build_tiny_model("qwen2_5_vl", tmp_path / "model")
    config = json.loads((path / "tokenizer_config.json").read_text())
    (path / "tokenizer_config.json").write_text(
        json.dumps({**config, "tokenizer_class": "Qwen2Tokenizer"})
    )
    backend = load_backend(str(path), device="cpu", dtype="float32")
    images = []
    for i in range(2):
        images.append(tmp_path / f"{i}.png")
        Image.fromarray(np.full((28, 28, 3), 40 * i, dtype=np.uint8)).save(images[-1])
    request = (Item("q", "a red ball", images, 0), 0, [0, 1])
    with pytest.raises(BackendError, match="^" + re.escape(f"{path}: its tokenizer does not")):
        next(backend.records([request], scheme=get_scheme("digits")))
