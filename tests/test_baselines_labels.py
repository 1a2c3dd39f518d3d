"""Every label scheme round-trips through prompt, scoring, calibration, parsing and the report;
generation methods parse real-looking replies from records (paper D.2, Fig. 8; §5.1)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from lad.backends import load_backend
from lad.core.labels import LABEL_SCHEMES, get_scheme
from lad.core.methods import METHODS, MethodOptions, choose
from lad.core.prompts import render_prompt
from lad.core.records import RecordSet
from lad.data.items import Item
from lad.data.shapes import build_shapes, shapes_vocabulary
from lad.errors import CalibrationError, RecordError
from lad.evaluate import evaluate
from lad.run.config import EvalConfig, eval_config
from lad.testing.tiny import build_tiny_model

SCHEMES = sorted(LABEL_SCHEMES)


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("tiny") / "llava"
    return str(build_tiny_model("llava", path, words=shapes_vocabulary()))


@pytest.mark.parametrize("name", SCHEMES)
def test_scheme_round_trips_through_scoring_and_parsing(name, model, tmp_path):
    from PIL import Image

    scheme = get_scheme(name)
    n = scheme.max_candidates  # 12, or 26 for letters
    labels = scheme.labels(n)
    backend = load_backend(model, device="cpu")
    trie = backend.label_trie(scheme, n)
    tok = backend.processor.tokenizer
    images = []
    for i in range(n):
        images.append(tmp_path / f"{i}.png")
        Image.new("RGB", (8 + i, 8), (9 * i, 0, 0)).save(images[-1])
    item = Item("x", "red circle", images, 0)
    record = next(backend.records([(item, 0, list(range(n)))], scheme=scheme))
    assert np.exp(record.logprobs).sum() == pytest.approx(1.0, abs=1e-9)
    assert len(record.attention[0]) == n
    prompt = render_prompt("vanilla", "q", scheme, n)
    assert f"from {labels[0]} to {labels[-1]}" in prompt
    for k, tokens in enumerate(trie.labels):
        said = tok.decode(list(tokens)).strip()
        assert said == labels[k]  # the scored tokens are the label as the model would write it
        assert METHODS["instruction"].parse(said, labels) == k
        assert METHODS["cot"].parse(f"<think>...</think> {said}", labels) == k
        assert METHODS["self-consistency"].parse(f"So the answer is {said}.", labels) == k


@pytest.fixture(scope="module")
def bench(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("bench")
    kw = {"num_candidates": 3, "setting": "random", "seed": 2, "image_size": 32}
    return (
        build_shapes(root / "eval", items=2, split="eval", **kw),
        build_shapes(root / "cal", items=1, split="calibration", **kw),
    )


def _config(model: str, bench: tuple[Path, Path], **kw) -> EvalConfig:
    base = {
        "model": model,
        "data": str(bench[0]),
        "calibration_data": str(bench[1]),
        "num_candidates": 3,
        "calibration_items": 1,
        "num_shuffles": 2,
        "quiet": True,
        "device": "cpu",
        "methods": ("vanilla", "lad", "instruction"),
        "max_new_tokens": 2,
    }
    return eval_config(**{**base, **kw})


def test_labels_flow_through_calibration_and_report(model, bench, tmp_path, monkeypatch):
    import lad.outputs.report

    axes: list[list[str]] = []
    real = lad.outputs.report._heatmap

    def spy(ax, matrix, labels, *args, **kw):
        axes.append(list(labels))
        return real(ax, matrix, labels, *args, **kw)

    monkeypatch.setattr(lad.outputs.report, "_heatmap", spy)
    run = tmp_path / "roman"
    evaluate(_config(model, bench, labels="roman"), run)
    calibration = json.loads((run / "calibration.json").read_text())
    assert calibration["labels"] == ["I", "II", "III"]
    assert axes and all(a == ["I", "II", "III"] for a in axes)
    # A calibration made with one scheme is refused for another.
    with pytest.raises(CalibrationError, match="labels"):
        evaluate(
            _config(
                model,
                bench,
                labels="digits",
                calibration=str(run / "calibration.json"),
                calibration_data=None,
            ),
            tmp_path / "digits",
        )


# ----------------------------------------------------------------------------- parsing records


def _records(replies: list[list[str]], n: int) -> RecordSet:
    r = len(replies)
    return RecordSet(
        items=np.array([f"i{k}" for k in range(r)]),
        ordering=np.zeros(r, dtype=np.int64),
        order=np.tile(np.arange(n), (r, 1)),
        answer=np.zeros(r, dtype=np.int64),
        logprobs=np.log(np.full((r, n), 1 / n)),
        attention=np.ones((r, 1, n)),
        extra=[{"replies": paths} for paths in replies],
    )


REAL_REPLIES = [
    # (method, scheme, N, replies of one record, expected position)
    ("instruction", "digits", 4, ["3"], 2),
    ("instruction", "digits", 12, ["10"], 9),
    ("instruction", "digits", 12, ["Image 12."], 11),
    ("instruction", "digits", 4, ["The best match is image 2, not image 4."], -1),
    ("instruction", "digits", 4, ["I'm not sure."], -1),
    ("instruction", "upper", 4, ["**B**"], 1),
    ("instruction", "roman", 12, ["IX"], 8),
    ("instruction", "words", 5, ["The third image."], 2),
    ("cot", "digits", 12, ["Image 1 is a dog, image 11 a cat.</think>\n11"], 10),
    ("cot", "digits", 4, ["Image 2 looks right, so 2"], -1),  # no </think>
    ("cot", "lower", 4, ["b has a red square </think> c"], 2),
    ("cot", "roman", 4, ["I think II fits.</think> III"], 2),
    (
        "self-consistency",
        "digits",
        4,
        ["The answer is 2", "The answer is 3", "the answer is 3."],
        2,
    ),
    ("self-consistency", "digits", 4, ["The answer is 4", "The answer is 1"], 3),  # tie: first
    ("self-consistency", "digits", 4, ["Image 2", "no idea"], -1),
    ("self-consistency", "words", 4, ["The answer is second", "The answer is fourth."], 1),
]


@pytest.mark.parametrize(("method", "scheme", "n", "replies", "expected"), REAL_REPLIES)
def test_generation_methods_parse_real_looking_replies(method, scheme, n, replies, expected):
    records = _records([replies], n)
    scores, prediction = choose(method, records, options=MethodOptions(labels=scheme))
    assert prediction.tolist() == [expected]
    if method != "self-consistency":
        assert scores.sum() == (expected != -1)  # one-hot on the parsed answer, else zeros
    if expected >= 0:
        assert scores[0, expected] == scores.max()  # votes


def test_generation_methods_need_replies():
    records = _records([["1"]], 3)
    records.extra[0] = {}
    with pytest.raises(RecordError, match=r"record 1 .* extra\['replies'\]"):
        choose("cot", records)


def test_lad_score_parses_replies_and_keeps_unparseable(tmp_path, capsys):
    from lad.cli import main
    from lad.core.predictions import read_predictions
    from lad.core.records import write_records

    records = _records([["<think>x</think> II"], ["<think>II or III"]], 3)
    path = tmp_path / "cot_records.jsonl"
    write_records(path, records)
    out = tmp_path / "pred.jsonl"
    args = ["score", "--records", str(path), "--method", "cot", "--labels", "roman"]
    assert main([*args, "--out", str(out)]) == 0
    assert [p.prediction for p in read_predictions(out)] == [1, -1]
    assert "Unparsed" in capsys.readouterr().out


def test_run_made_before_the_baseline_flags_still_resumes(model, bench, tmp_path):
    from lad.errors import RunError

    run = tmp_path / "old"
    evaluate(_config(model, bench, methods=("vanilla",), num_shuffles=1), run)
    stored = json.loads((run / "run.json").read_text())
    for name in ("max_new_tokens", "sc_samples", "sofa_sigma", "sofa_within_image"):
        del stored["arguments"][name]
    (run / "run.json").write_text(json.dumps(stored))
    same = {"methods": ("vanilla",), "num_shuffles": 1, "max_new_tokens": 1024}
    evaluate(_config(model, bench, **same), run)
    with pytest.raises(RunError, match="--sc-samples 10, not 3"):
        evaluate(_config(model, bench, **same, sc_samples=3), run)


def test_cli_eval_takes_the_baseline_flags(model, bench, tmp_path, capsys):
    from lad.cli import main

    args = ["eval", "--model", model, "--data", str(bench[0]), "--calibration-data", str(bench[1])]
    args += ["-n", "3", "--calibration-items", "1", "--num-shuffles", "1", "--quiet"]
    args += ["--device", "cpu", "--labels", "upper", "--methods", "vanilla,self-consistency,sofa"]
    args += ["--max-new-tokens", "2", "--sc-samples", "2", "--sc-temperature", "1.0"]
    args += ["--sc-top-k", "5", "--sofa-sigma", "0.25", "--sofa-within-image"]
    assert main([*args, "--out", str(tmp_path / "run")]) == 0
    assert "Gen. tok" in capsys.readouterr().out
    stored = json.loads((tmp_path / "run" / "run.json").read_text())["arguments"]
    assert [stored[k] for k in ("sofa_sigma", "sofa_within_image", "sc_top_k")] == [0.25, True, 5]
    with pytest.raises(SystemExit):
        main([*args[:-3], "--sofa-sigma", "half", "--out", str(tmp_path / "bad")])
    assert "'auto'" in capsys.readouterr().err
