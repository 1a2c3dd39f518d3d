"""Labels and prompts as each chat template writes them, on invented templates (no real files).

The reply rule (docs/backends.md "Exact labels"): a label's tokens run from the end of the
generation prompt through the label, as the template renders an assistant turn whose content is
the label, then the token the template writes after it. A template that cannot prompt (a base
checkpoint's) is an error naming the model, and `--chat-template FILE` replaces it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from lad.backends import load_backend
from lad.backends.prompting import reply_tokens
from lad.cli import main
from lad.core.labels import get_scheme
from lad.data.items import Item
from lad.data.shapes import build_shapes
from lad.errors import BackendError
from lad.testing.tiny import ARCHITECTURES, TinySize, build_tiny_model
from lad.testing.tokenizer import build_tokenizer

LABELS = ["1", "2", "10"]
# What base checkpoints often ship: content written as is, so a list of parts comes out as its repr.
BASE_TEMPLATE = "{% for message in messages %}{{ message['content'] }}{% endfor %}"


def _processor(arch: str, template: str) -> Any:
    spec = ARCHITECTURES[arch]
    tok = build_tokenizer(spec.special_tokens, spec.extra_special, (), spec.tokenizer_attrs)
    return spec.processor(tok, TinySize(), template)


def _tokens(processor: Any, text: str) -> list[int]:
    return processor.tokenizer(text, add_special_tokens=False)["input_ids"]


def _chatml(header: str, end: str) -> str:
    """A ChatML-like template whose assistant turns start with `header` (the generation prompt
    stays "<|im_start|>assistant\\n") and end with `end`."""
    return (
        "{% for m in messages %}{% if m['role'] == 'assistant' %}" + header + "{% else %}"
        "<|im_start|>{{ m['role'] }}\n{% endif %}{% for c in m['content'] %}"
        "{% if c['type'] == 'image' %}<image>{% else %}{{ c['text'] }}{% endif %}{% endfor %}"
        + end
        + "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )


def test_reply_on_a_new_line_is_the_label_alone() -> None:
    processor = _processor("llava_onevision", _chatml("<|im_start|>assistant\n", "<|im_end|>\n"))
    replies = reply_tokens(processor, "Which?", 2, LABELS, "m")
    assert replies.labels == [_tokens(processor, label) for label in LABELS]
    assert replies.end_of_answer == processor.tokenizer.convert_tokens_to_ids("<|im_end|>")


def test_header_that_differs_from_the_generation_prompt_by_whitespace() -> None:
    # LLaVA-OneVision's published template writes "<|im_start|>assistant \n" + reply.
    processor = _processor("llava_onevision", _chatml("<|im_start|>assistant \n", "<|im_end|>"))
    replies = reply_tokens(processor, "Which?", 2, LABELS, "m")
    assert replies.labels == [_tokens(processor, label) for label in LABELS]
    processor = _processor("llava_onevision", _chatml("<|im_start|>model\n", "<|im_end|>"))
    with pytest.raises(BackendError, match=r"m: its chat template starts an assistant turn with"):
        reply_tokens(processor, "Which?", 2, LABELS, "m")


def test_leading_space_is_part_of_every_label_and_eos_ends_a_bare_reply() -> None:
    # LLaVA-1.5's shape: "ASSISTANT:" prompts, the turn is "ASSISTANT: 1 " and nothing closes it.
    template = (
        "{% for m in messages %}{{ m['role'].upper() + ': ' }}{% for c in m['content'] %}"
        "{% if c['type'] == 'image' %}<image>\n{% else %}{{ c['text'] + ' ' }}{% endif %}"
        "{% endfor %}{% endfor %}{% if add_generation_prompt %}ASSISTANT:{% endif %}"
    )
    processor = _processor("llava", template)
    replies = reply_tokens(processor, "Which?", 2, LABELS, "m")
    tok = processor.tokenizer
    assert [tok.convert_ids_to_tokens(t) for t in replies.labels] == [
        ["\u2581", "1"],
        ["\u2581", "2"],
        ["\u2581", "1", "0"],
    ]
    assert replies.end_of_answer == tok.eos_token_id


def test_text_every_label_shares_is_forced_and_other_templates_are_errors() -> None:
    plain = _chatml("<|im_start|>assistant\n", "<|im_end|>")
    prefixed = plain.replace(
        "{{ c['text'] }}", "{{ 'x' if m['role'] == 'assistant' }}{{ c['text'] }}"
    )
    replies = reply_tokens(_processor("llava_onevision", prefixed), "Which?", 2, LABELS, "m")
    assert {t[0] for t in replies.labels} == {replies.labels[0][0]} and len(replies.labels[0]) == 2
    cases = [
        (_chatml("<|im_start|>assistant\n", " sure<|im_end|>"), "writes ' sure<|im_end|>' after"),
        (plain.replace("{{ c['text'] }}", "{{ c['text'] | lower }}"), "labels verbatim"),
    ]
    for template, message in cases:
        with pytest.raises(BackendError, match=f"^m: its chat template .*{message}"):
            reply_tokens(_processor("llava_onevision", template), "Which?", 2, ["I", "II"], "m")


# ----------------------------------------------------------------------------- --chat-template


@pytest.fixture(scope="module")
def base_model(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """(a tiny LLaVA as shipped, the same with a base checkpoint's template, a good template)."""
    root = tmp_path_factory.mktemp("templates")
    good = build_tiny_model("llava", root / "good")
    base = build_tiny_model("llava", root / "base")
    (base / "chat_template.jinja").write_text(BASE_TEMPLATE)
    template = root / "llava.jinja"
    template.write_text(ARCHITECTURES["llava"].chat_template)
    return good, base, template


def test_base_template_is_an_error_naming_the_model(base_model, tmp_path: Path) -> None:
    _, base, _ = base_model
    with pytest.raises(BackendError) as err:
        load_backend(str(base), device="cpu")
    assert str(err.value) == (
        f"{base}: its chat template writes 0 image placeholders (<image>) for a prompt of 2 "
        "images; pass a chat template that does with --chat-template FILE (chat_template= in "
        "Python)"
    )
    (tmp_path / "none").mkdir()
    for f in base.iterdir():
        if f.name != "chat_template.jinja":
            (tmp_path / "none" / f.name).write_bytes(f.read_bytes())
    with pytest.raises(BackendError, match="does not have a chat template"):
        load_backend(str(tmp_path / "none"), device="cpu")
    with pytest.raises(BackendError, match=r"--chat-template .*nowhere.jinja: cannot read"):
        load_backend(str(base), device="cpu", chat_template=tmp_path / "nowhere.jinja")


def test_chat_template_file_replaces_the_checkpoints(base_model, tmp_path: Path) -> None:
    from PIL import Image

    good, base, template = base_model
    paths = []
    for i in range(3):
        paths.append(tmp_path / f"{i}.png")
        Image.new("RGB", (20 + i, 20), (60 * i, 0, 0)).save(paths[-1])
    req = (Item("q", "red ball", paths, 1), 0, [2, 0, 1])
    scheme = get_scheme("digits")
    (want,) = load_backend(str(good), device="cpu").records([req], scheme=scheme)
    (got,) = load_backend(str(base), device="cpu", chat_template=template).records(
        [req], scheme=scheme
    )
    np.testing.assert_array_equal(got.logprobs, want.logprobs)
    np.testing.assert_array_equal(got.attention, want.attention)


def test_cli_takes_chat_template_and_records_it(
    base_model, tmp_path: Path, capsys, monkeypatch
) -> None:
    import hashlib

    _, base, shipped = base_model
    template = tmp_path / "mine.jinja"
    template.write_bytes(shipped.read_bytes())
    sha = hashlib.sha256(shipped.read_bytes()).hexdigest()
    kw = {"num_candidates": 3, "setting": "random", "seed": 0, "image_size": 32}
    data = build_shapes(tmp_path / "eval", items=2, split="eval", **kw)
    cal = build_shapes(tmp_path / "cal", items=1, split="calibration", **kw)
    args = ["eval", "--model", str(base), "--data", str(data), "--calibration-data", str(cal)]
    args += ["-n", "3", "--calibration-items", "1", "--num-shuffles", "1", "--quiet"]
    args += ["--device", "cpu", "--methods", "vanilla,lad"]
    assert main([*args, "--out", str(tmp_path / "base")]) == 1
    assert capsys.readouterr().err.startswith(f"Error: {base}: its chat template writes 0 image")
    # That run failed at its start, before any record: it does not block the corrected command
    # (docs/errors.md). With records made, another --chat-template is refused like any argument.
    with_template = [*args, "--chat-template", str(template)]
    assert main([*with_template, "--out", str(tmp_path / "base")]) == 0
    assert main([*args, "--out", str(tmp_path / "base")]) == 1
    assert "was made with --chat-template" in capsys.readouterr().err
    stored = json.loads((tmp_path / "base" / "run.json").read_text())["arguments"]
    assert stored["chat_template"] == str(template)
    # The calibration records the template by the SHA-256 of the file's bytes.
    made = json.loads((tmp_path / "base" / "calibration.json").read_text())["preprocessing"]
    assert made == {"chat_template_sha256": sha, "image_size": None, "image_options": {}}
    cal_out = tmp_path / "calibration.json"
    calibrate = ["calibrate", "--model", str(base), "--data", str(cal), "--items", "1"]
    calibrate += ["--device", "cpu", "--quiet", "--chat-template", str(template)]
    assert main([*calibrate, "--out", str(cal_out)]) == 0
    assert json.loads(cal_out.read_text())["preprocessing"] == made
    images = [str(p) for p in sorted((tmp_path / "eval").rglob("*.png"))[:3]]
    predict = ["predict", "--model", str(base), "--calibration", str(cal_out), "--query", "a red"]
    predict += ["--device", "cpu"]
    assert main([*predict, "--chat-template", str(template), *images]) == 0
    assert "LAD chooses" in capsys.readouterr().out
    # The same text under another path is the same template.
    assert main([*predict, "--chat-template", str(shipped), *images]) == 0
    capsys.readouterr()
    # The checkpoint's own template, or the same file with its text changed: refused before the
    # model loads, unless told to apply the calibration anyway.
    assert main([*predict, *images]) == 1
    assert "made with the checkpoint's own chat template" in capsys.readouterr().err
    template.write_text(shipped.read_text() + "{# edited #}")
    edited = hashlib.sha256(template.read_bytes()).hexdigest()
    assert main([*predict, "--chat-template", str(template), *images]) == 1
    assert capsys.readouterr().err == (
        f"Error: {cal_out}: the calibration was fitted on records made with --chat-template of "
        f"SHA-256 {sha[:12]}..., but these records are made with --chat-template of SHA-256 "
        f"{edited[:12]}...; recalibrate with the same --chat-template, or skip this check on "
        "purpose (--no-calibration-check)\n"
    )
    assert (
        main([*predict, "--chat-template", str(template), "--no-calibration-check", *images]) == 0
    )
    capsys.readouterr()
    # A finished run rescores without the model and without the template file: run.json's
    # fingerprint of it gives the calibration's.
    template.unlink()
    before = (tmp_path / "base" / "calibration.json").read_bytes()

    def no_model(*a, **k):
        raise AssertionError("rescoring must not load the model")

    monkeypatch.setattr("lad.backends.load_backend", no_model)
    assert main([*with_template, "--methods", "vanilla", "--out", str(tmp_path / "base")]) == 0
    assert (tmp_path / "base" / "calibration.json").read_bytes() == before
