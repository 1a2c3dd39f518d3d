"""lad inside the real lm-evaluation-harness (lm-eval 0.4.x; skipped where it is not installed:
.ci/run runs this file in a venv with lad's [lm-eval] extra).

On a local MMLU-style task over a JSON Lines file and a tiny random-init causal LM on the REAL
Qwen3 tokenizer (LAD_REAL_CHECKPOINTS; lad's own word tokenizer where it is not set):
- `lad harness lm-eval --model lad` (lm-eval's own command line) answers the task, and its
  per-question choices and scores equal `lad eval`'s on the same questions converted by
  `lad data mmlu`, with the same calibration questions;
- with method=vanilla its loglikelihoods equal those of lm-eval's own `--model hf` (an
  implementation that shares no code with lad) on the same checkpoint, renormalised over the N;
- the circular variant (`lad harness lm-eval-circular`) asks every question N times, shifted, and
  `lad harness audit` reads lm-eval's logged samples.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

lm_eval = pytest.importorskip("lm_eval", reason="lm-evaluation-harness is not installed")

from lad.cli import main as lad_main  # noqa: E402
from lad.harness.text_scorer import FILES  # noqa: E402
from lad.testing.text import build_tiny_text_model  # noqa: E402

QUESTIONS = [
    ("Which animal can fly?", "animals", ["a dog", "a red kite", "a cat", "a fish"], 1),
    ("Which is a fruit?", "food", ["a hammer", "a chair", "an apple", "a river"], 2),
    ("Which is a colour?", "misc", ["blue", "seven", "Paris", "iron"], 0),
    ("Which is a metal?", "misc", ["wool", "wood", "glass", "copper"], 3),
    ("Which city is in France?", "geo", ["Rome", "Lyon", "Oslo", "Bern"], 1),
    ("Which number is even?", "math", ["three", "five", "eight", "nine"], 2),
    ("Which one is a tree?", "plants", ["an oak", "a rose", "moss", "a fern"], 0),
    ("Which is a planet?", "space", ["the Moon", "the Sun", "Sirius", "Mars"], 3),
]
DEV = [
    ("Which is a bird?", "animals", ["a crow", "a cow", "a carp", "a cat"], 0),
    ("Which is a drink?", "food", ["bread", "tea", "salt", "rice"], 1),
    ("Which is a shape?", "misc", ["loud", "square", "sweet", "slow"], 1),
    ("Which is a tool?", "misc", ["a saw", "a song", "a sock", "a sea"], 0),
    ("Which is a season?", "misc", ["north", "winter", "noon", "nine"], 1),
]
TASK = """task: lad_mcq
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{question.strip()}}}}\\nA. {{{{choices[0]}}}}\\nB. {{{{choices[1]}}}}\\nC. \
{{{{choices[2]}}}}\\nD. {{{{choices[3]}}}}\\nAnswer:"
doc_to_choice: ["A", "B", "C", "D"]
doc_to_target: answer
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
"""


def _write_questions(path: Path, rows: list) -> None:
    lines = [
        json.dumps({"question": q, "subject": s, "choices": c, "answer": a}) for q, s, c, a in rows
    ]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def _tokenizer() -> Path | None:
    for root in os.environ.get("LAD_REAL_CHECKPOINTS", "").split(os.pathsep):
        folder = Path(root) / "qwen3-text-tokenizer"
        if root and (folder / "tokenizer.json").is_file():
            return folder
    return None


@pytest.fixture(scope="module")
def setup(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("lm-eval")
    real = _tokenizer()
    words = "which animal can fly fruit colour metal city number tree planet is a an the one in"
    model = build_tiny_text_model(
        "qwen2" if real else "llama", root / "model", tokenizer=real, words=words.split()
    )
    _write_questions(root / "test.jsonl", QUESTIONS)
    _write_questions(root / "dev.jsonl", DEV)
    (root / "task").mkdir()
    (root / "task" / "lad_mcq.yaml").write_text(TASK.format(data=root / "test.jsonl"))
    for name in ("test", "dev"):
        code = lad_main(
            ["data", "mmlu", str(root / f"{name}.jsonl"), "--calibration-items", "0",
             "--out", str(root / f"{name}.items.jsonl")]
        )  # fmt: skip
        assert code == 0
    # MMLU's dev and test rows are both named mmlu-<subject>-<row>; the calibration's renamed
    dev = [json.loads(x) for x in (root / "dev.items.jsonl").read_text().splitlines()]
    (root / "dev.items.jsonl").write_text(
        "".join(json.dumps({**it, "id": "dev-" + it["id"]}) + "\n" for it in dev)
    )
    return {"root": root, "model": model}


def _env() -> dict[str, str]:
    return {**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}


def _samples(output: Path, task: str) -> list[dict]:
    (path,) = output.rglob(f"samples_{task}_*.jsonl")
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return sorted(rows, key=lambda r: r["doc_id"])


def _scores(sample: dict) -> np.ndarray:
    return np.array([float(r[0]) for r in sample["filtered_resps"]])


def _evaluate(model: str, model_args: str, setup: dict, task: str, include: Path) -> list[dict]:
    from lm_eval.tasks import TaskManager

    import lad.harness.lm_eval  # noqa: F401  (registers --model lad)

    os.environ.update({"HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"})
    result = lm_eval.simple_evaluate(
        model=model,
        model_args=model_args,
        tasks=[task],
        task_manager=TaskManager(include_path=str(include)),
        device="cpu",
        log_samples=True,
    )
    return sorted(result["samples"][task], key=lambda r: r["doc_id"])


def test_lm_eval_model_lad_equals_lad_eval_on_the_converted_items(setup, tmp_path):
    root, model = setup["root"], setup["model"]
    args = f"pretrained={model},method=lad,calibration_items={root / 'dev.items.jsonl'}"
    run = subprocess.run(
        [sys.executable, "-m", "lad", "harness", "lm-eval", "--model", "lad", "--model_args",
         args, "--device", "cpu", "--tasks", "lad_mcq", "--include_path", str(root / "task"),
         "--output_path", str(tmp_path / "out"), "--log_samples"],
        capture_output=True, text=True, env=_env(), timeout=600,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    assert "lad_mcq" in run.stdout and "acc" in run.stdout
    samples = _samples(tmp_path / "out", "lad_mcq")
    assert [s["doc_id"] for s in samples] == list(range(len(QUESTIONS)))

    orders = tmp_path / "orders.jsonl"
    items = [json.loads(x) for x in (root / "test.items.jsonl").read_text().splitlines()]
    orders.write_text("".join(json.dumps({"item": it["id"], "order": [0, 1, 2, 3]}) + "\n"
                              for it in items))  # fmt: skip
    code = lad_main(
        ["eval", "--model", str(model), "--data", str(root / "test.items.jsonl"),
         "--calibration-data", str(root / "dev.items.jsonl"), "--calibration-items", "5",
         "--labels", "upper", "--prompt-template", str(FILES / "mmlu.txt"),
         "--chat-template", str(FILES / "plain.jinja"), "--methods", "vanilla,lad",
         "--orders", str(orders), "--device", "cpu", "--out", str(tmp_path / "run"), "-q"]
    )  # fmt: skip
    assert code == 0
    predictions = [json.loads(x) for x in (tmp_path / "run" / "predictions.jsonl").open()]
    lad = {p["item"]: p for p in predictions if p["method"] == "lad"}
    for sample in samples:
        subject = QUESTIONS[sample["doc_id"]][1]
        mine = lad[f"mmlu-{subject}-{sample['doc_id']}"]
        scores = _scores(sample)
        assert int(np.argmax(scores)) == mine["prediction"]
        np.testing.assert_allclose(scores, mine["scores"], rtol=1e-5, atol=1e-6)
        assert [r[1] == "True" for r in sample["filtered_resps"]] == [
            k == mine["prediction"] for k in range(4)
        ]
        assert sample["acc"] == float(mine["prediction"] == sample["doc"]["answer"])


def test_vanilla_loglikelihoods_equal_lm_evals_own_hf_model(setup):
    root, model = setup["root"], setup["model"]
    theirs = _evaluate("hf", f"pretrained={model},dtype=float32", setup, "lad_mcq", root / "task")
    mine = _evaluate("lad", f"pretrained={model},method=vanilla", setup, "lad_mcq", root / "task")
    for a, b in zip(theirs, mine, strict=True):
        assert a["arguments"] == b["arguments"]  # the same prompts and continuations
        raw = _scores(a)  # log P(label | context); lad's are renormalised over the N labels
        np.testing.assert_allclose(_scores(b), raw - np.logaddexp.reduce(raw), atol=2e-5)
        assert b["acc"] == a["acc"]


def test_the_circular_variant_shifts_every_question_and_the_audit_reads_it(setup, tmp_path):
    root, model = setup["root"], setup["model"]
    folder = tmp_path / "circular"
    assert lad_main(["harness", "lm-eval-circular", str(root / "task" / "lad_mcq.yaml"),
                     "--out", str(folder)]) == 0  # fmt: skip
    task = "lad_mcq_lad_circular"
    samples = _evaluate("lad", f"pretrained={model},method=vanilla", setup, task, folder)
    assert len(samples) == 4 * len(QUESTIONS)
    for sample in samples:
        doc, shift = sample["doc"], sample["doc"]["lad_shift"]
        _, _, choices, answer = QUESTIONS[int(doc["lad_item"])]
        assert doc["choices"] == [choices[(p + shift) % 4] for p in range(4)]
        assert doc["choices"][doc["answer"]] == choices[answer]
        assert sample["lad_acc"]["prediction"] == int(np.argmax(_scores(sample)))
    out = tmp_path / "out"
    from lad.harness.samples import samples_rows

    log = out / "model" / f"samples_{task}_2026-12-01T00-00-00.000000.jsonl"
    log.parent.mkdir(parents=True)
    log.write_text("".join(json.dumps(s, default=str) + "\n" for s in samples))
    rows = samples_rows(out)[task]
    assert len(rows) == 4 * len(QUESTIONS)
    assert lad_main(["harness", "audit", str(out)]) == 0
    metrics = json.loads((out / "lad_audit" / task / "n4" / "metrics.json").read_text())
    acc = 100 * np.mean([s["acc"] for s in samples])
    assert metrics["methods"]["model"]["acc"] == pytest.approx(acc)


def test_tasks_lad_cannot_score_are_refused_in_one_line(setup, tmp_path):
    from lad.harness.lm_eval import LadLM

    with pytest.raises(Exception, match=r"unknown --model_args \['model'\]; --model lad takes pre"):
        LadLM(pretrained=str(setup["model"]), model="x", max_batch_size=4)  # lm-eval's own passes
    lm = LadLM(pretrained=str(setup["model"]), method="vanilla", device="cpu")
    for call in (lm.generate_until, lm.loglikelihood_rolling):
        with pytest.raises(Exception, match="scores multiple_choice tasks"):
            call([])
    run = subprocess.run(
        [sys.executable, "-m", "lad", "harness", "lm-eval", "--model", "lad", "--model_args",
         f"pretrained={setup['model']},method=lad", "--tasks", "lad_mcq", "--device", "cpu",
         "--include_path", str(setup["root"] / "task")],
        capture_output=True, text=True, env=_env(), timeout=600,
    )  # fmt: skip
    assert run.returncode == 1
    assert "Traceback" not in run.stderr
    assert run.stderr.strip().splitlines()[-1].startswith("Error: method=lad needs a calibration")


def test_a_calibration_file_is_checked_and_gives_the_fitted_choices(setup, tmp_path):
    root, model = setup["root"], setup["model"]
    common = ["calibrate", "--model", str(model), "--data", str(root / "dev.items.jsonl"),
              "--labels", "upper", "--chat-template", str(FILES / "plain.jinja"),
              "--device", "cpu", "-q"]  # fmt: skip
    good, other = tmp_path / "good.json", tmp_path / "other.json"
    assert (
        lad_main([*common, "--prompt-template", str(FILES / "mmlu.txt"), "--out", str(good)]) == 0
    )
    assert lad_main([*common, "--out", str(other)]) == 0  # lad's own text prompt, not lm-eval's
    task = root / "task"
    fitted = _evaluate("lad", f"pretrained={model},calibration_items={root / 'dev.items.jsonl'}",
                       setup, "lad_mcq", task)  # fmt: skip
    loaded = _evaluate("lad", f"pretrained={model},calibration={good}", setup, "lad_mcq", task)
    for a, b in zip(fitted, loaded, strict=True):
        np.testing.assert_allclose(_scores(b), _scores(a), atol=1e-6)  # JSON's round trip
        assert np.argmax(_scores(b)) == np.argmax(_scores(a))
    from lad.errors import CalibrationError

    with pytest.raises(CalibrationError, match=r"prompt.*check_calibration=False"):
        _evaluate("lad", f"pretrained={model},calibration={other}", setup, "lad_mcq", task)
    # The switch the refusal names is a model_arg: the same file, checked for N and layers only.
    unchecked = f"pretrained={model},calibration={other},check_calibration=False"
    assert len(_evaluate("lad", unchecked, setup, "lad_mcq", task)) == len(loaded)
