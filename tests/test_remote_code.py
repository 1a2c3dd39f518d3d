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
import os
import re
import shutil
import subprocess
import sys
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
def folders(llava15_tiny: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The shrunk checkpoint (tests/conftest.py) and its eager-patched twin."""
    from lad.testing.remote import patch_eager

    tiny = llava15_tiny
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


def test_trust_remote_code_is_needed(
    folders: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from lad.backends import load_backend
    from lad.cli import main

    with pytest.raises(BackendError, match="pass --trust-remote-code"):
        load_backend(str(folders[0]), device="cpu")
    argv = ["eval", "--model", str(folders[0]), "--data", "shapes", "--items", "2"]
    assert main([*argv, "--device", "cpu", "--quiet", "--out", str(tmp_path / "run")]) == 1
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("Error: --model ") and "pass --trust-remote-code" in line


def test_the_saved_tokenizer_is_the_one_built_from_vocab_and_merges(
    folders: tuple[Path, Path],
) -> None:
    """The shrunk copy's tokenizer.json (lad.testing.remote.save_fast_tokenizer) tokenizes as the
    tokenizer transformers builds from the real folder's vocab.json and merges.txt."""
    from transformers import AutoTokenizer

    built = AutoTokenizer.from_pretrained(real_checkpoints._source(NAME))
    saved = AutoTokenizer.from_pretrained(folders[0])
    assert (folders[0] / "tokenizer.json").is_file() and type(saved) is type(built)
    assert saved.get_vocab() == built.get_vocab()
    assert saved.added_tokens_decoder == built.added_tokens_decoder
    text = PROMPT.format(
        images="<|vision_start|><|image_pad|><|vision_end|>" * 2, text="naïve 東京"
    )
    assert saved(text)["input_ids"] == built(text)["input_ids"]


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


def _lad(*argv: Any) -> subprocess.CompletedProcess[str]:
    """`python -m lad ARGV` in a fresh process of this environment."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    command = [sys.executable, "-m", "lad", *map(str, argv)]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)


def test_lad_eval_with_trust_remote_code(folders: tuple[Path, Path], tmp_path: Path) -> None:
    """`lad eval --model <folder> --trust-remote-code` on the shapes benchmark: a finished run
    whose run.json records trust_remote_code and whose metrics hold every method."""
    out = tmp_path / "run"
    done = _lad("eval", "--model", folders[0], "--trust-remote-code", "--data", "shapes",
                "--items", 4, "--num-shuffles", 2, "--methods", "vanilla,pride,lad",
                "--device", "cpu", "--quiet", "--out", out)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr and "lad  " in done.stdout
    arguments = json.loads((out / "run.json").read_text())["arguments"]
    assert arguments["trust_remote_code"] is True and arguments["model"] == str(folders[0])
    methods = json.loads((out / "metrics.json").read_text())["methods"]
    assert set(methods) == {"vanilla", "pride", "lad"}


def _one_cell(suite: str, cell: str, settings: str) -> str:
    """A suite file's text with one cell (and the paper's numbers of that cell) and `settings`
    in place of its [settings] table."""
    blocks = re.split(r"(?m)^(?=\[)", suite)
    kept = [
        "[settings]\n" + settings + "\n\n" if b.startswith("[settings]") else b
        for b in blocks
        if not (b.startswith("[[cells]]") and f'id = "{cell}"' not in b)
        and not (b.startswith("[paper.") and f'"{cell}"]' not in b.splitlines()[0])
    ]
    return "".join(kept)


def test_suite_run_table1_puts_the_papers_row_beside_lads(
    folders: tuple[Path, Path], tmp_path: Path
) -> None:
    """`lad suite run <table1> --model <folder> --trust-remote-code --data-root <COCO>`: table1's
    own file cut to its cell coco random N=4 (3 items, one shuffle, vanilla / PriDe / lad: the
    built-in's 12 cells and CLIP-drawn distractors are a GPU's work) on the fixture COCO laid out
    as the download. The folder, named as the hub id, is the paper's LLaVA-OneVision-8B: its row
    stands beside lad's in the printed table, and the cell is a run made with trust_remote_code."""
    import lad.suites
    from lad.suites import load_suite
    from tests.data_fixtures import write_coco

    cell = "coco random N=4"
    paths = write_coco(tmp_path / "data" / "COCO")
    (tmp_path / "data/COCO/annotations").mkdir()
    paths["images"].rename(tmp_path / "data/COCO/val2014")
    for key in ("captions", "instances"):
        paths[key].rename(tmp_path / f"data/COCO/annotations/{key}_val2014.json")
    table1 = (Path(lad.suites.__file__).parent / "table1.toml").read_text()
    settings = 'methods = ["vanilla", "pride", "lad"]\nitems = 3\nnum_shuffles = 1\ndevice = "cpu"'
    (tmp_path / "table1.toml").write_text(_one_cell(table1, cell, settings))
    out = tmp_path / "out"
    done = _lad("suite", "run", tmp_path / "table1.toml", "--model", folders[0],
                "--trust-remote-code", "--data-root", tmp_path / "data", "--out", out)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert f"[1/1] LLaVA-OneVision-8B · {cell}: running" in done.stdout
    run = next(p for p in (out / "LLaVA-OneVision-8B").iterdir() if p.is_dir())
    arguments = json.loads((run / "run.json").read_text())["arguments"]
    assert arguments["trust_remote_code"] is True and arguments["model"] == str(folders[0])
    paper = load_suite("table1").paper["LLaVA-OneVision-8B"][cell]
    metrics = json.loads((run / "metrics.json").read_text())["methods"]
    rows, method = {}, None
    for line in done.stdout.splitlines():  # cell, method, source, then Acc, ±, RStd, Cons.
        words = line.split()
        if len(words) < 6 or not re.fullmatch(r"[+-]?\d+\.\d\d", words[-1]):
            continue
        source = words[-6:-4]
        if source[0] == "lad":  # a method's first line: lad's own numbers
            method = words[-7]
        if "Δ" not in words:
            rows[method, " ".join(source)] = words[-4:]
    keys = ("acc", "acc_std", "rstd", "cons")
    for method in ("vanilla", "pride", "lad"):
        assert rows[method, "lad LLaVA-OneVision-8B"] == [f"{metrics[method][k]:.2f}" for k in keys]
        assert rows[method, "paper LLaVA-OneVision-8B"] == [f"{paper[method][k]:.2f}" for k in keys]
