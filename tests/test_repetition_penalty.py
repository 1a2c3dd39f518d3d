"""The repetition penalty of the label steps (issue 26): lad's penalised label log-probs against
transformers' own RepetitionPenaltyLogitsProcessor applied to brute-force logits, on a tiny
Qwen2.5-VL; the option defines the records (run.json, calibration.json) and `--preset official`
takes it from the model's generation_config."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import RepetitionPenaltyLogitsProcessor

from lad.backends import load_backend
from lad.backends.checkpoint import resolve_repetition_penalty
from lad.backends.hf import Backend
from lad.backends.scoring import RepetitionPenalty, seen_tokens
from lad.cli import main
from lad.core.calibrate import Calibration, Fingerprint
from lad.core.labels import get_scheme
from lad.core.records import read_records
from lad.data.items import Item, read_items
from lad.data.shapes import build_shapes, shapes_vocabulary
from lad.errors import CalibrationError, RunError
from lad.run.config import eval_config
from lad.run.spec import RecordSpec
from lad.testing.tiny import build_tiny_model
from tests.full_forward import extend_inputs

DIGITS = get_scheme("digits")


def test_penalty_equals_transformers_processor_bit_for_bit():
    # Random logits of both signs, prompts of different lengths (left padded), ids beyond the
    # output vocabulary (ignored by transformers), label tokens decoded so far.
    g = torch.Generator().manual_seed(0)
    vocab, batch = 50, 3
    logits = torch.randn(batch, vocab, generator=g) * 4
    lengths = [9, 5, 7]
    ids = torch.zeros(batch, 9, dtype=torch.long)
    mask = torch.zeros(batch, 9, dtype=torch.long)
    rows = []
    for b, n in enumerate(lengths):
        row = torch.randint(0, vocab + 6, (n,), generator=g)
        row[row == 3] = 4
        ids[b, 9 - n :], mask[b, 9 - n :] = row, 1
        ids[b, : 9 - n] = 3  # the pad token: not in the sequence, so not penalised
        rows.append(row)
    assert all(3 not in r.tolist() for r in rows)
    for penalty in (1.05, 1.7, 0.6):
        lad = RepetitionPenalty(penalty, seen_tokens(ids, mask, vocab))
        for prefix in ((), (11,), (11, 4)):
            got = lad.apply(logits, prefix)
            for b, row in enumerate(rows):
                sequence = torch.cat([row, torch.tensor(prefix, dtype=torch.long)])[None]
                want = RepetitionPenaltyLogitsProcessor(penalty)(
                    sequence, logits[b : b + 1].clone()
                )
                assert torch.equal(got[b], want[0]), (penalty, prefix, b)
            assert torch.equal(got[:, 3], logits[:, 3])  # padding is not penalised


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("qwen") / "model"
    path = build_tiny_model("qwen2_5_vl", folder, words=shapes_vocabulary())
    config = json.loads((path / "generation_config.json").read_text())
    config["repetition_penalty"] = 1.05  # as Qwen2.5-VL-*-Instruct's generation_config.json
    (path / "generation_config.json").write_text(json.dumps(config))
    return path


@pytest.fixture(scope="module")
def item(tmp_path_factory: pytest.TempPathFactory) -> Item:
    from PIL import Image

    folder = tmp_path_factory.mktemp("pictures")
    rng = np.random.default_rng(0)
    paths = []
    for i in range(12):
        paths.append(folder / f"p{i}.png")
        Image.fromarray((rng.random((28, 40, 3)) * 255).astype("uint8")).save(paths[-1])
    return Item("q0", "a red ball", paths, 3)


def _full_logits(backend: Backend, req) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per label: the logits (steps, V) of one full forward of prompt + label tokens (+ end of
    answer), no cache, and that whole sequence's ids (1, T + steps)."""
    trie = backend.label_trie(DIGITS, req[0].num_candidates)
    texts, images = backend.build_prompts([req], "vanilla", DIGITS)
    inputs, _ = backend.encode([req], texts, images)
    t = inputs["input_ids"].shape[1]
    out = []
    for seq in trie.labels:
        steps = [*seq, trie.eos] if trie.valid(seq) else list(seq)
        extended = extend_inputs(inputs, steps)
        with torch.no_grad():
            logits = backend.model(**extended).logits[0, t - 1 :].float()
        out.append((logits, extended["input_ids"]))
    return out


def _reference(backend: Backend, full: list, penalty: float | None) -> tuple[np.ndarray, list]:
    """log P(c_k|x) from the full-forward logits, each step's logits put through transformers'
    RepetitionPenaltyLogitsProcessor over the sequence so far (the prompt and the label's tokens
    before the step); also the label prefixes of the branching steps."""
    trie = backend.label_trie(DIGITS, 12)
    out, branching = [], []
    for seq, (logits, ids) in zip(trie.labels, full, strict=True):
        steps = [*seq, trie.eos] if trie.valid(seq) else list(seq)
        t = ids.shape[1] - len(steps)
        total = 0.0
        for i, token in enumerate(steps):
            valid = trie.valid(seq[:i])
            if len(valid) == 1:
                continue
            scores = logits[i : i + 1].clone()
            if penalty is not None:
                scores = RepetitionPenaltyLogitsProcessor(penalty)(ids[:, : t + i], scores)
            total += float(scores[0, valid].double().log_softmax(-1)[valid.index(token)])
            branching.append(seq[:i])
        out.append(total)
    return np.array(out), branching


def test_label_logprobs_equal_transformers_processor_on_brute_force_logits(
    model_dir: Path, item: Item
) -> None:
    # N = 12 digits: "10".."12" need a second step after "1" (a multi-token label step).
    backend = load_backend(str(model_dir), device="cpu", dtype="float32")
    req = (item, 0, list(range(12)))
    full = _full_logits(backend, req)
    without = next(backend.records([req], scheme=DIGITS)).logprobs
    reference, branching = _reference(backend, full, None)
    np.testing.assert_allclose(without, reference, atol=1e-5, rtol=0)
    assert any(len(prefix) >= 1 for prefix in branching)  # a step after a label token
    short = Item("q1", "star", item.images, 5)
    for penalty in (1.05, 1.5):
        backend.repetition_penalty = penalty  # as load_backend(..., repetition_penalty=penalty)
        with_penalty = next(backend.records([req], scheme=DIGITS)).logprobs
        np.testing.assert_allclose(
            with_penalty, _reference(backend, full, penalty)[0], atol=1e-5, rtol=0
        )
        assert np.abs(np.array(with_penalty) - without).max() > 1e-3  # the penalty moved them
        assert np.exp(with_penalty).sum() == pytest.approx(1.0, abs=1e-9)
        # Batched with a shorter prompt (left padding): the padding is not in the sequence.
        pair = [(short, 0, list(range(12))), req]
        batched = list(backend.records(pair, scheme=DIGITS, batch_size=2))
        np.testing.assert_allclose(batched[1].logprobs, with_penalty, atol=1e-5, rtol=0)


def test_the_penalty_defines_the_records(model_dir: Path, tmp_path: Path) -> None:
    assert eval_config(repetition_penalty=1.05).identity()["repetition_penalty"] == 1.05
    for bad in (0, -1.0, "auto", float("nan")):
        with pytest.raises(RunError, match="--repetition-penalty must be a number > 0 or 'model'"):
            eval_config(repetition_penalty=bad)
    # "model" (--preset official) is the model's generation_config's; 1 and none are none.
    assert resolve_repetition_penalty("model", str(model_dir)) == 1.05
    assert resolve_repetition_penalty("model", "demo") is None
    assert resolve_repetition_penalty(1.0, "demo") is None
    assert resolve_repetition_penalty(1.2, "demo") == 1.2
    # A calibration made without the penalty is refused on records made with it, and back.
    made = {"model": "m", "chat_template": None, "image_size": None}
    without = RecordSpec.from_mapping(made).preprocessing()
    assert "repetition_penalty" not in without  # files without a penalty are as before
    with_it = RecordSpec.from_mapping({**made, "repetition_penalty": 1.05}).preprocessing()
    assert with_it["repetition_penalty"] == 1.05
    from tests.synthetic import SyntheticModel

    records = SyntheticModel(num_candidates=4).calibration_records(3)
    for fitted, now, message in (
        (without, with_it, "made with no --repetition-penalty, but these records are made with "
         "--repetition-penalty 1.05; recalibrate with the same --repetition-penalty"),
        (with_it, without, "made with --repetition-penalty 1.05, but these records are made "
         "with no --repetition-penalty"),
    ):  # fmt: skip
        calibration = Calibration().fit(records, Fingerprint(model="m", preprocessing=fitted))
        saved = tmp_path / "calibration.json"
        calibration.save(saved)
        loaded = Calibration.load(saved)
        with pytest.raises(CalibrationError, match=message.replace("(", r"\(")):
            loaded.check_compatible(records, Fingerprint(model="m", preprocessing=now))
        loaded.check_compatible(records, Fingerprint(model="m", preprocessing=now), strict=False)
        loaded.check_compatible(records, Fingerprint(model="m", preprocessing=fitted))
    # A calibration.json from before the option existed (preprocessing without the key) was
    # made without a penalty.
    old = Calibration().fit(records, Fingerprint(model="m", preprocessing=without))
    with pytest.raises(CalibrationError, match="no --repetition-penalty"):
        old.check_compatible(records, Fingerprint(model="m", preprocessing=with_it))


def test_preset_official_takes_the_penalty_from_the_generation_config(model_dir, tmp_path, capsys):
    from lad.core.prompts import PromptTemplate
    from lad.run.presets import OFFICIAL

    data = build_shapes(tmp_path / "eval", num_candidates=3, items=3, split="eval", seed=3,
                        image_size=32)  # fmt: skip
    argv = ["eval", "--model", str(model_dir), "--data", str(data), "-n", "3", "--quiet",
            "--calibration-items", "1", "--num-shuffles", "1", "--device", "cpu",
            "--methods", "vanilla,lad", "--layer-range", "0,1"]  # fmt: skip
    out = tmp_path / "official"
    assert main([*argv, "--preset", "official", "--out", str(out)]) == 0
    assert json.loads((out / "run.json").read_text())["arguments"]["repetition_penalty"] == 1.05
    made = json.loads((out / "calibration.json").read_text())["preprocessing"]
    assert made["repetition_penalty"] == 1.05
    # The records are the penalised log-probs of the backend (generation_config's 1.05).
    backend = load_backend(str(model_dir), device="cpu", dtype="float32", image_size=336,
                           repetition_penalty=1.05)  # fmt: skip
    first = read_records(out / "records.jsonl").to_records()[0]
    item = next(it for it in read_items(data) if it.id == first.item)
    request = [(item, first.ordering, list(first.order))]
    template = PromptTemplate(OFFICIAL["prompt_template"])
    want = next(backend.records(request, template=template, scheme=DIGITS)).logprobs
    np.testing.assert_allclose(first.logprobs, want, atol=1e-6, rtol=0)
    backend.repetition_penalty = None
    plain = next(backend.records(request, template=template, scheme=DIGITS)).logprobs
    assert np.abs(np.array(plain) - want).max() > 1e-4
    # Its calibration is refused on records made without the penalty (a stated flag wins).
    capsys.readouterr()
    argv += ["--calibration", str(out / "calibration.json"), "--out", str(tmp_path / "plain")]
    assert main([*argv, "--preset", "official", "--repetition-penalty", "1"]) == 1
    assert "recalibrate with the same --repetition-penalty" in capsys.readouterr().err


def test_the_python_api_takes_the_penalty_too(model_dir: Path) -> None:
    from lad.run.debiaser import Debiaser

    debiaser = Debiaser(str(model_dir), repetition_penalty="model", device="cpu")
    assert debiaser.backend.repetition_penalty == 1.05  # the generation_config's
    assert debiaser.spec.preprocessing()["repetition_penalty"] == 1.05
    assert "repetition_penalty" not in Debiaser(str(model_dir)).spec.preprocessing()
    assert (
        Debiaser(str(model_dir), repetition_penalty=1.2).spec.preprocessing()["repetition_penalty"]
        == 1.2
    )
    with pytest.raises(RunError, match="must be a number > 0 or 'model'"):
        Debiaser(str(model_dir), repetition_penalty=-1)
