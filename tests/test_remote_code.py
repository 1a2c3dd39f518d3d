"""LLaVA-OneVision-1.5, the paper's own model: remote code (its checkpoint's modeling files) run
by lad under the transformers it is written for (4.53.1), on a shrunk random-weight copy of its
real files (../shared/real-checkpoints-new/LLaVA-OneVision-1.5-8B-Instruct/SOURCES.md).

References, none of them lad's: the prompt and spans written out by hand; label probabilities
by brute force (one full forward per branching prefix of the replies the model's own chat
template writes); attention from a copy of the published code whose eager attention is made to
run (its one broken size check patched, lad.testing.remote.patch_eager) with
output_attentions=True. Runs where transformers is 4.x and LAD_REAL_CHECKPOINTS names the
folder (CI: .ci/.venv-remote); skipped, saying why, elsewhere.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import transformers

from lad.backends.archs import ARCHS
from lad.core.labels import get_scheme
from lad.core.prompts import render_prompt
from lad.data.items import Item
from lad.errors import BackendError

NAME = "LLaVA-OneVision-1.5-8B-Instruct"
DIGITS = get_scheme("digits")
SYSTEM = "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
PROMPT = SYSTEM + "<|im_start|>user\n{images}{text}<|im_end|>\n<|im_start|>assistant\n"
IMAGE, START, END, PAD = "<|image_pad|>", 151652, 151653, 151655

if int(transformers.__version__.split(".")[0]) >= 5:
    pytest.skip(
        f"transformers {transformers.__version__}: {NAME}'s code runs under 4.53.1 "
        "(.ci/run's .venv-remote; docs/backends.md, 'Remote code')",
        allow_module_level=True,
    )

from tests import test_real_checkpoints as real_checkpoints  # noqa: E402


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The shrunk checkpoint (in a folder of the hub id's name) and its eager-patched twin."""
    from lad.testing.remote import patch_eager, save_shrunk_remote

    source = real_checkpoints._source(NAME)
    tiny = save_shrunk_remote(source, tmp_path_factory.mktemp("remote") / NAME)
    twin = tmp_path_factory.mktemp("remote-eager") / "llava15_eager_reference"
    shutil.copytree(tiny, twin)
    return tiny, patch_eager(twin)


@pytest.fixture(scope="module")
def real(folders: tuple[Path, Path]) -> Any:
    from transformers import AutoModelForCausalLM

    from lad.backends import load_backend

    tiny, twin = folders
    backend = load_backend(
        str(tiny), device="cpu", dtype="float32", trust_remote_code=True, quiet=True
    )
    reference = AutoModelForCausalLM.from_pretrained(
        twin, torch_dtype=torch.float32, attn_implementation="eager", trust_remote_code=True
    ).eval()
    assert reference.config.get_text_config()._attn_implementation == "eager"
    return real_checkpoints.Real(NAME, backend, reference, None, 12)


images = real_checkpoints.images  # the same twelve pictures of varied sizes


def _no_cache_logits(model: Any, inputs: dict[str, Any], prefix: list[int]) -> torch.Tensor:
    """Next-token logits after the prompt and `prefix`: one full forward, no cache (the remote
    forward takes no logits_to_keep)."""
    from tests.full_forward import extend_inputs

    return model(**extend_inputs(inputs, prefix), use_cache=False).logits[0, -1]


def test_the_row_and_its_refusals(real: Any, images: list[Path]) -> None:
    from lad.backends.remote import check_transformers

    assert real.backend.arch.name == "LLaVA-OneVision-1.5" and real.backend.arch.remote_code
    for arch in (a for a in ARCHS if not a.remote_code):  # built-in rows need transformers 5
        with pytest.raises(BackendError, match=r"needs transformers>=5\.0; this environment"):
            check_transformers(arch, "m")
    with pytest.raises(BackendError, match="capture='fast'"):  # its published eager is broken
        list(real.backend.records([real_checkpoints._request(images, 2)], scheme=DIGITS,
                                  capture="eager"))  # fmt: skip


def test_trust_remote_code_is_needed(folders: tuple[Path, Path]) -> None:
    from lad.backends import load_backend

    with pytest.raises(BackendError, match="pass --trust-remote-code"):
        load_backend(str(folders[0]), device="cpu")


@pytest.mark.parametrize("n", [2, 12])
def test_prompt_and_spans_as_written_by_hand(real: Any, images: list[Path], n: int) -> None:
    """The model's own template (Qwen2.5-VL's, its default system prompt) and each picture's
    span: <|vision_start|>, (H/28)(W/28) image tokens after the processor's resize (RICE-ViT's
    14 px patches merged 2 x 2), <|vision_end|>."""
    backend = real.backend
    req = real_checkpoints._request(images, n)
    texts, imgs = backend.build_prompts([req], "vanilla", DIGITS)
    text = render_prompt("vanilla", req[0].query, DIGITS, n)
    image = "<|vision_start|><|image_pad|><|vision_end|>"
    assert texts[0] == PROMPT.format(images=image * n, text=text)
    inputs, spans = backend.encode([req], texts, imgs)
    ids = inputs["input_ids"][0].tolist()
    counts = [(p.height // 28) * (p.width // 28) for p in imgs[0]]  # 56..112 px: no resize
    run = "".join(f"<|vision_start|>{IMAGE * c}<|vision_end|>" for c in counts)
    tok = backend.processor.tokenizer
    assert ids == tok(PROMPT.format(images=run, text=text))["input_ids"]
    starts = [i for i, t in enumerate(ids) if t == START]
    assert spans[0] == [(s, s + c + 2) for s, c in zip(starts, counts, strict=True)]
    assert all(ids[e - 1] == END and set(ids[s + 1 : e - 1]) == {PAD} for s, e in spans[0])


def test_tokens_per_picture_at_lads_default(real: Any) -> None:
    """28 px per token, at least 56 x 56 px and at most 256 tokens (lad's budget, as Qwen2.5-VL)."""
    from PIL import Image

    processor = real.backend.processor
    for size, tokens in (((64, 48), 4), ((384, 384), 196), ((640, 480), 234), ((4000, 3000), 234)):
        out = processor(
            text=[IMAGE], images=[[Image.new("RGB", size)]], **real.backend.image_options
        )
        assert list(out["input_ids"][0]).count(PAD) == tokens, size


@pytest.mark.parametrize("n", [2, 4, 12])
@torch.no_grad()
def test_left_padded_batch_equals_references(real: Any, images: list[Path], n: int) -> None:
    """Two prompts of different lengths in one left-padded batch: label log-probabilities equal
    the brute-force reference, and each layer's span attention the patched eager copy's
    output_attentions (last prompt token's row, head-averaged, summed over each span), 1e-5."""
    from PIL import Image

    backend = real.backend
    reqs = [real_checkpoints._request(images, n, k) for k in (1, 2)]
    records = list(backend.records(reqs, scheme=DIGITS, batch_size=2))
    assert records[0].extra["prompt_tokens"] != records[1].extra["prompt_tokens"]  # padded
    for req, record in zip(reqs, records, strict=True):
        reference, _, _ = real_checkpoints._brute_force(real, req, "digits", n, _no_cache_logits)
        np.testing.assert_allclose(record.logprobs, reference, atol=1e-5, rtol=0)
        assert np.abs(reference - np.log(1 / n)).max() > 1e-3  # it discriminates
        item, _, order = req
        text = render_prompt("vanilla", item.query, DIGITS, n)
        prompt = PROMPT.format(images="<|vision_start|><|image_pad|><|vision_end|>" * n, text=text)
        pictures = [Image.open(item.images[i]).convert("RGB") for i in order]
        inputs = backend.processor(
            text=[prompt], images=[pictures], return_tensors="pt", **backend.image_options
        )
        ids = inputs["input_ids"][0].tolist()
        starts = [i for i, t in enumerate(ids) if t == START]
        ends = [i + 1 for i, t in enumerate(ids) if t == END]
        out = real.reference(**inputs, output_attentions=True, use_cache=False)
        rows = [a[0, :, -1].double().mean(0) for a in out.attentions]
        expected = [[float(row[s:e].sum()) for s, e in zip(starts, ends, strict=True)]
                    for row in rows]  # fmt: skip
        assert len(rows) == backend.num_layers == 2
        np.testing.assert_allclose(record.attention, expected, atol=1e-5, rtol=0)


def test_debiaser_and_the_cli(
    folders: tuple[Path, Path], images: list[Path], tmp_path: Path, capsys: Any
) -> None:
    """Debiaser(trust_remote_code=True) fits and predicts; `lad predict --trust-remote-code`
    gives the same choice from the calibration it saved."""
    from lad.cli import main
    from lad.run.debiaser import Debiaser

    model = str(folders[0])
    items = [Item(f"c{k}", "a red ball", images[k : k + 3], 0) for k in range(2)]
    debiaser = Debiaser(model, trust_remote_code=True, device="cpu", dtype="float32")
    debiaser.fit(items)
    chosen = debiaser.predict("a kite", [str(p) for p in images[:3]])
    debiaser.save(tmp_path / "cal.json")
    args = ["predict", "--model", model, "--trust-remote-code", "--calibration"]
    args += [str(tmp_path / "cal.json"), "--query", "a kite", "--json", "--device", "cpu", "-q"]
    assert main([*args, *map(str, images[:3])]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert (printed["lad"], printed["layers"]) == (chosen.lad, chosen.layers)
    np.testing.assert_allclose(printed["prob_after"], chosen.prob_after, atol=1e-9, rtol=0)


def test_table1_runs_the_papers_model_beside_its_row(
    folders: tuple[Path, Path], tmp_path: Path
) -> None:
    """table1 with the folder (named as the hub id) as its model and trust_remote_code (what
    `lad suite run table1 --model <folder> --trust-remote-code` runs) on the fixture COCO: the
    folder is the paper's LLaVA-OneVision-8B, whose row is laid beside lad's, and the cell is a
    `lad eval` run directory made with trust_remote_code."""
    import dataclasses

    from lad.evaluate import run_suite
    from lad.suites import load_suite
    from tests.data_fixtures import write_coco

    write_coco(tmp_path / "COCO")
    suite = load_suite("table1")
    coco = dataclasses.replace(
        suite.benchmarks["coco"],
        paths={"images": "images", "captions": "captions.json", "instances": "instances.json"},
    )
    cell = "coco random N=4"
    settings = {"methods": ("vanilla", "pride", "lad"), "items": 3, "num_shuffles": 1}
    suite = dataclasses.replace(
        suite,
        benchmarks={**suite.benchmarks, "coco": coco},
        cells=[c for c in suite.cells if c.id == cell],
        settings={**settings, "device": "cpu"},
    )
    said: list[str] = []
    result = run_suite(suite, tmp_path / "out", data_roots=[str(tmp_path)],
                       model=str(folders[0]), trust_remote_code=True, say=said.append)  # fmt: skip
    assert said == [f"[1/1] LLaVA-OneVision-8B · {cell}: running"]
    run = result.runs["LLaVA-OneVision-8B"][cell]
    arguments = json.loads((run / "run.json").read_text())["arguments"]
    assert arguments["trust_remote_code"] is True and arguments["model"] == str(folders[0])
    lad = json.loads((run / "metrics.json").read_text())["methods"]["lad"]
    rows = {r.source: r.values for r in result.rows if (r.cell, r.method) == (cell, "lad")}
    assert rows["lad LLaVA-OneVision-8B"] == pytest.approx(
        [lad[k] for k in ("acc", "acc_std", "rstd", "cons")]
    )
    paper = suite.paper["LLaVA-OneVision-8B"][cell]["lad"]
    assert rows["paper LLaVA-OneVision-8B"] == [
        paper[k] for k in ("acc", "acc_std", "rstd", "cons")
    ]
    assert f"{cell}" in result.table and "LLaVA-OneVision-8B" in result.table
