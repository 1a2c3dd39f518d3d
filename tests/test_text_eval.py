"""`lad eval` on text candidates: a tiny text-only Llama (and a tiny LLaVA) through the whole
pipeline: calibration on cyclic shifts, every logit method, perm-avg, metrics, resume."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lad.cli import main
from lad.core.prompts import TEXT
from lad.data.items import Item, write_items
from lad.evaluate import evaluate
from lad.run.config import EvalConfig
from lad.testing.text import build_tiny_text_model
from lad.testing.tiny import build_tiny_model
from tests.runfiles import comparable, small_config

N = 4
WORDS = [
    "apple",
    "stone",
    "river",
    "cloud",
    "tiger",
    "piano",
    "bread",
    "lamp",
    "chair",
    "ocean",
    "pencil",
    "garden",
]
RUN_FILES = ("run.json", "calibration.jsonl", "calibration.json", "records.jsonl")
RUN_FILES += ("perm_records.jsonl", "predictions.jsonl", "metrics.json")


def _items(start: int, count: int) -> list[Item]:
    return [
        Item(f"q{i}", f"Which word names a {WORDS[i % 12]}?", [], i % N,
             candidates=[WORDS[(i + k) % 12] for k in range(N)])
        for i in range(start, start + count)
    ]  # fmt: skip


@pytest.fixture(scope="module")
def bench(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("mcq")
    write_items(root / "mcq.jsonl", _items(0, 4))
    write_items(root / "cal.jsonl", _items(10, 2))
    return root / "mcq.jsonl", root / "cal.jsonl"


@pytest.fixture(scope="module")
def text_model(tmp_path_factory) -> str:
    return str(build_tiny_text_model("llama", tmp_path_factory.mktemp("m") / "llama", words=WORDS))


def _config(model: str, bench: tuple[Path, Path], **kw) -> EvalConfig:
    return small_config(model, bench, **{"num_candidates": N, **kw})


@pytest.fixture(scope="module")
def full_run(text_model, bench, tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("runs") / "full"
    evaluate(_config(text_model, bench), run)
    return run


def test_eval_on_text_options_writes_every_file(full_run):
    records = [json.loads(x) for x in (full_run / "records.jsonl").read_text().splitlines()]
    assert len(records) == 4 * 2
    for rec in records:
        assert len(rec["order"]) == N and len(rec["logprobs"]) == N and len(rec["attention"]) == 2
        assert len(rec["extra"]["candidate_tokens"]) == N
    cal = [json.loads(x) for x in (full_run / "calibration.jsonl").read_text().splitlines()]
    assert sorted(r["answer"] for r in cal) == sorted(list(range(N)) * 2)  # cyclic shifts
    run = json.loads((full_run / "run.json").read_text())
    assert run["arguments"]["prompt_template"] == TEXT.text
    metrics = json.loads((full_run / "metrics.json").read_text())
    assert {"vanilla", "pride", "lad", "attn", "attn-purified", "perm-avg"} <= set(
        metrics["methods"]
    )
    assert metrics["num_candidates"] == N


def test_interrupted_text_run_resumes_to_identical_files(
    full_run, text_model, bench, tmp_path, monkeypatch
):
    import lad.run.stages as ev

    real = ev._records

    def interrupt_after_three(backend, requests, config):
        for i, rec in enumerate(real(backend, requests, config)):
            if i == 3:
                raise KeyboardInterrupt
            yield rec

    run = tmp_path / "run"
    monkeypatch.setattr(ev, "_records", interrupt_after_three)
    with pytest.raises(KeyboardInterrupt):
        evaluate(_config(text_model, bench), run)
    monkeypatch.setattr(ev, "_records", real)
    evaluate(_config(text_model, bench), run)
    for name in RUN_FILES:
        assert comparable(run / name) == comparable(full_run / name), name


def test_cli_eval_on_a_multimodal_model_with_text_options(bench, tmp_path, capsys):
    model = str(build_tiny_model("llava", tmp_path / "llava", words=WORDS))
    out = tmp_path / "cli-run"
    args = ["eval", "--model", model, "--data", str(bench[0]), "--calibration-data", str(bench[1])]
    args += ["-n", str(N), "--calibration-items", "2", "--num-shuffles", "2", "--quiet"]
    args += ["--methods", "vanilla,pride,lad,attn", "--device", "cpu", "--out", str(out)]
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert "lad" in printed and str(out) in printed


def test_mixed_kinds_are_refused_before_model_work(bench, tmp_path, capsys):
    mixed = tmp_path / "mixed.jsonl"
    picture = tmp_path / "a.png"
    from PIL import Image

    Image.new("RGB", (8, 8)).save(picture)
    write_items(mixed, [*_items(0, 1), Item("p", "a red square", [picture] * N, 0)])
    args = ["eval", "--model", "nowhere-model", "--data", str(mixed), "-n", str(N)]
    assert main([*args, "--out", str(tmp_path / "r")]) == 1
    err = capsys.readouterr().err
    assert "mixes items of text candidates" in err and "Traceback" not in err


def _fail_on_load(monkeypatch) -> None:
    from lad.run import spec

    def refuse(*args, **kwargs):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(spec.RecordSpec, "load_backend", refuse)


def test_picture_items_on_a_text_model_are_refused_before_it_loads(
    text_model, tmp_path, capsys, monkeypatch
):
    from PIL import Image

    _fail_on_load(monkeypatch)
    picture = tmp_path / "a.png"
    Image.new("RGB", (8, 8)).save(picture)
    data = tmp_path / "pictures.jsonl"
    write_items(data, [Item(f"p{i}", "a red square", [picture] * N, 0) for i in range(3)])
    args = ["eval", "--model", text_model, "--data", str(data), "-n", str(N), "--device", "cpu"]
    args += ["--calibration-items", "1"]
    assert main([*args, "--out", str(tmp_path / "r")]) == 1
    err = capsys.readouterr().err
    assert "is a text-only causal LM (llama)" in err and "item 'p0'" in err
    assert not (tmp_path / "r").exists()


def test_picture_labels_are_refused_for_text_options(text_model, bench, tmp_path, capsys,
                                                     monkeypatch):  # fmt: skip
    _fail_on_load(monkeypatch)
    args = ["eval", "--model", text_model, "--data", str(bench[0]), "-n", str(N)]
    args += ["--labels", "image-ordinals", "--calibration-items", "1", "--out", str(tmp_path / "r")]
    assert main(args) == 1
    assert "--labels image-ordinals names pictures" in capsys.readouterr().err


def test_a_multimodal_model_takes_a_chat_template_without_pictures_for_text_options(
    bench, tmp_path, capsys
):
    from lad.harness.text_scorer import PLAIN_CHAT_TEMPLATE

    model = str(build_tiny_model("qwen2_vl", tmp_path / "qwen2vl", words=WORDS))
    out = tmp_path / "plain-run"
    args = ["eval", "--model", model, "--data", str(bench[0]), "--calibration-data", str(bench[1])]
    args += ["-n", str(N), "--calibration-items", "2", "--num-shuffles", "1", "--quiet"]
    args += ["--chat-template", str(PLAIN_CHAT_TEMPLATE), "--methods", "vanilla,lad"]
    assert main([*args, "--device", "cpu", "--out", str(out)]) == 0
    records = [json.loads(x) for x in (out / "records.jsonl").read_text().splitlines()]
    assert len(records) == 4
    # pictures still need a template that writes them: checked before the weights load
    from PIL import Image

    picture = tmp_path / "a.png"
    Image.new("RGB", (8, 8)).save(picture)
    data = tmp_path / "pictures.jsonl"
    write_items(data, [Item(f"p{i}", "a red square", [picture] * N, 0) for i in range(3)])
    args = ["eval", "--model", model, "--data", str(data), "-n", str(N), "--device", "cpu"]
    args += ["--chat-template", str(PLAIN_CHAT_TEMPLATE), "--calibration-items", "1"]
    assert main([*args, "--out", str(tmp_path / "r2")]) == 1
    assert "writes 0 image placeholders" in capsys.readouterr().err
