"""lad inside the real Inspect (inspect_ai 0.3.x; skipped where it is not installed: .ci/run runs
this file in a venv with lad's [inspect] extra). Every run is Inspect's own `inspect` command on a
local multiple-choice task (tests/inspect_task.py):

- `lad/circular` asks each sample under its N cyclic shifts and `lad/position` prints lad's
  position metrics; with Inspect's mockllm answering by a position-biased rule of the prompt it
  was shown, the printed and logged metrics are `lad metrics` of the choices that rule gives on
  the same orderings, worked out here from the dataset alone;
- `inspect score LOG --scorer lad/position` gives the same numbers for a task run with Inspect's
  own multiple_choice() solver swapped for `--solver lad/circular`;
- `--model lad/<tiny random-init Qwen3-architecture model on the REAL Qwen3 tokenizer>` answers
  in one pass with LAD: under every shift its choice is `lad eval`'s LAD choice on the same
  questions converted by `lad data mmlu` and asked in the same orders (scores within 1e-5), and
  the position metrics Inspect prints are `lad metrics`' of that lad run.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip(
    "inspect_ai", reason="inspect_ai is not installed (pip install -e '.[inspect]')"
)

from inspect_ai.log import read_eval_log

from lad.cli import main as lad_main
from lad.core.predictions import predictions_for, write_predictions
from lad.core.records import RecordSet, write_records
from lad.harness.text_scorer import FILES
from lad.testing.text import build_tiny_text_model
from tests.inspect_task import DEV, QUESTIONS, mock_choice

N = 4
INSPECT = [sys.executable, "-m", "inspect_ai"]
TASK = Path(__file__).parent / "inspect_task.py"
PRINTED = ("lad_acc", "lad_rstd", "lad_cons", "lad_flip", "lad_circular", "lad_position_p")
LAD_KEYS = {
    "lad_acc": "acc",
    "lad_rstd": "rstd",
    "lad_cons": "cons",
    "lad_flip": "flip_rate",
    "lad_circular": "circular_acc",
}


def _tokenizer() -> Path | None:
    for root in os.environ.get("LAD_REAL_CHECKPOINTS", "").split(os.pathsep):
        folder = Path(root) / "qwen3-text-tokenizer"
        if root and (folder / "tokenizer.json").is_file():
            return folder
    return None


def _write(path: Path, rows: list) -> None:
    lines = [
        json.dumps({"question": q, "subject": s, "choices": c, "answer": a}) for q, s, c, a in rows
    ]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


@pytest.fixture(scope="module")
def setup(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("inspect")
    _write(root / "test.jsonl", QUESTIONS)
    _write(root / "dev.jsonl", DEV)
    for name in ("test", "dev"):
        assert (
            lad_main(
                [
                    "data",
                    "mmlu",
                    str(root / f"{name}.jsonl"),
                    "--calibration-items",
                    "0",
                    "--out",
                    str(root / f"{name}.items.jsonl"),
                ]
            )
            == 0
        )
    dev = [json.loads(x) for x in (root / "dev.items.jsonl").read_text().splitlines()]
    (root / "dev.items.jsonl").write_text(  # MMLU names dev and test rows alike: renamed
        "".join(json.dumps({**it, "id": "dev-" + it["id"]}) + "\n" for it in dev)
    )
    return {"root": root}


def _inspect(*args: str, cwd: Path) -> str:
    # lad as installed (`pip install -e ".[inspect]"`), not from a PYTHONPATH checkout: Inspect
    # names an extension's objects lad/... only for an installed package's modules
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(
        {
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "INSPECT_LOG_DIR": str(cwd / "logs"),
            "INSPECT_DISPLAY": "plain",
        }
    )
    run = subprocess.run(
        [*INSPECT, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=900
    )
    assert run.returncode == 0, (run.stdout + run.stderr)[-4000:]
    return run.stdout + run.stderr


def _printed(output: str) -> dict[str, float]:
    found = dict(re.findall(r"(lad_[a-z_]+)[:\s]+(-?[\d.]+|nan)\b", output))
    assert set(PRINTED) <= set(found), output[-3000:]
    return {k: float(found[k]) for k in PRINTED}


def _log(folder: Path):
    (path,) = sorted((folder / "logs").glob("*.eval"))[-1:]
    return read_eval_log(str(path))


def _metrics(log, scorer: str = "position") -> dict[str, float]:
    (scores,) = [s for s in log.results.scores if s.name == scorer]
    return {k: m.value for k, m in scores.metrics.items()}


def _cyclic_records() -> RecordSet:
    """The test questions under their N cyclic shifts, named as `lad data mmlu` names them."""
    rows = [
        (f"mmlu-{s}-{i}", shift, [(p + shift) % N for p in range(N)], a)
        for i, (_, s, _, a) in enumerate(QUESTIONS)
        for shift in range(N)
    ]
    return RecordSet(
        items=np.array([r[0] for r in rows]),
        ordering=np.array([r[1] for r in rows]),
        order=np.array([r[2] for r in rows]),
        answer=np.array([r[2].index(r[3]) for r in rows]),
        logprobs=np.log(np.full((len(rows), N), 1.0 / N)),
        attention=np.zeros((len(rows), 1, N)),
        extra=[{} for _ in rows],
    )


def _lad_metrics(tmp: Path, records: RecordSet, pred: np.ndarray, method: str) -> dict:
    write_records(tmp / "records.jsonl", records)
    write_predictions(
        tmp / "predictions.jsonl", predictions_for(records, method, records.logprobs, pred)
    )
    assert (
        lad_main(
            [
                "metrics",
                "--records",
                str(tmp / "records.jsonl"),
                "--predictions",
                str(tmp / "predictions.jsonl"),
                "--out",
                str(tmp / "m.json"),
            ]
        )
        == 0
    )
    return json.loads((tmp / "m.json").read_text())["methods"][method]


def _check_equal(got: dict[str, float], printed: dict[str, float], reference: dict) -> None:
    for name, key in LAD_KEYS.items():
        assert got[name] == pytest.approx(reference[key], abs=1e-9), name
        assert printed[name] == pytest.approx(reference[key], abs=5e-4), name
    p = reference["position_test"]["p_value"]
    assert got["lad_position_p"] == pytest.approx(p, abs=1e-12)
    assert printed["lad_position_p"] == pytest.approx(p, abs=5e-4)


def test_circular_with_mockllm_prints_lad_metrics_of_its_choices(setup, tmp_path):
    data = setup["root"] / "test.jsonl"
    output = _inspect("eval", f"{TASK}@lad_mock", "-T", f"data={data}", cwd=tmp_path)
    log = _log(tmp_path)
    records = _cyclic_records()
    # what the mock's rule answers for each shown order, from the dataset alone
    pred = np.array(
        [
            mock_choice(
                [QUESTIONS[int(str(it).rsplit("-", 1)[1])][2][o] for o in order],
                QUESTIONS[int(str(it).rsplit("-", 1)[1])][0],
            )
            for it, order in zip(records.items, records.order, strict=True)
        ]
    )
    assert (pred == -1).any() and (pred == records.answer).any() and (pred != records.answer).any()
    reference = _lad_metrics(tmp_path, records, pred, "model")
    assert 0 < reference["flip_rate"] < 100 and reference["position_test"]["p_value"] < 0.05
    _check_equal(_metrics(log), _printed(output), reference)
    sample = log.samples[0]
    rows = sample.scores["position"].metadata["lad_rows"]
    assert [r["order"] for r in rows] == [[(p + s) % N for p in range(N)] for s in range(N)]
    assert sample.output.completion == sample.store["lad_completions"][0]  # shift 0 kept
    assert "A) " + QUESTIONS[0][2][0] in sample.messages[0].text  # its messages: the original order


def test_inspect_score_of_a_task_run_with_the_circular_solver(setup, tmp_path):
    data = setup["root"] / "test.jsonl"
    _inspect(
        "eval",
        f"{TASK}@lad_plain",
        "-T",
        f"data={data}",
        "-T",
        "mock=true",
        "--solver",
        "lad/circular",
        cwd=tmp_path,
    )
    (path,) = (tmp_path / "logs").glob("*.eval")
    assert "choice" in {s.name for s in _log(tmp_path).results.scores}  # the task's own scorer
    rescored_path = tmp_path / "rescored.eval"
    output = _inspect(
        "score",
        str(path),
        "--scorer",
        "lad/position",
        "--action",
        "append",
        "--output-file",
        str(rescored_path),
        cwd=tmp_path,
    )
    rescored = read_eval_log(str(rescored_path))
    records = _cyclic_records()
    pred = np.array(
        [
            mock_choice(
                [QUESTIONS[int(str(it).rsplit("-", 1)[1])][2][o] for o in order],
                QUESTIONS[int(str(it).rsplit("-", 1)[1])][0],
            )
            for it, order in zip(records.items, records.order, strict=True)
        ]
    )
    reference = _lad_metrics(tmp_path, records, pred, "model")
    _check_equal(_metrics(rescored), _printed(output), reference)


@pytest.fixture(scope="module")
def model(setup) -> Path:
    real = _tokenizer()
    words = "which animal can fly fruit colour metal city number tree planet is a an the one in"
    return build_tiny_text_model(
        "qwen2" if real else "llama", setup["root"] / "model", tokenizer=real, words=words.split()
    )


def test_model_lad_answers_as_lad_eval_under_every_shift(setup, model, tmp_path):
    root = setup["root"]
    output = _inspect(
        "eval",
        f"{TASK}@lad_circular",
        "-T",
        f"data={root / 'test.jsonl'}",
        "--model",
        f"lad/{model}",
        "-M",
        f"calibration_items={root / 'dev.items.jsonl'}",
        "-M",
        "device=cpu",
        cwd=tmp_path,
    )
    log = _log(tmp_path)
    items = [json.loads(x)["id"] for x in (root / "test.items.jsonl").read_text().splitlines()]
    orders = tmp_path / "orders.jsonl"
    orders.write_text(
        "".join(
            json.dumps({"item": it, "order": [(p + s) % N for p in range(N)]}) + "\n"
            for it in items
            for s in range(N)
        )
    )
    assert (
        lad_main(
            [
                "eval",
                "--model",
                str(model),
                "--data",
                str(root / "test.items.jsonl"),
                "--calibration-data",
                str(root / "dev.items.jsonl"),
                "--calibration-items",
                "5",
                "--labels",
                "upper",
                "--prompt-template",
                str(FILES / "mmlu.txt"),
                "--chat-template",
                str(FILES / "plain.jinja"),
                "--methods",
                "vanilla,lad",
                "--orders",
                str(orders),
                "--device",
                "cpu",
                "--out",
                str(tmp_path / "run"),
                "-q",
            ]
        )
        == 0
    )
    run = tmp_path / "run"
    lad = {
        (p["item"], p["ordering"]): p
        for p in map(json.loads, (run / "predictions.jsonl").open())
        if p["method"] == "lad"
    }
    records = {
        (r["item"], r["ordering"]): r for r in map(json.loads, (run / "records.jsonl").open())
    }
    for sample in log.samples:
        for row in sample.scores["position"].metadata["lad_rows"]:
            key = (row["item"], row["ordering"])
            assert records[key]["order"] == row["order"]  # lad eval asked the same order
            assert row["prediction"] == lad[key]["prediction"], key
        unshifted = lad[(str(sample.id), 0)]
        np.testing.assert_allclose(
            sample.output.metadata["lad"]["scores"], unshifted["scores"], rtol=1e-5, atol=1e-6
        )
    assert (
        lad_main(
            [
                "metrics",
                "--records",
                str(run / "records.jsonl"),
                "--predictions",
                str(run / "predictions.jsonl"),
                "--out",
                str(tmp_path / "m.json"),
            ]
        )
        == 0
    )
    reference = json.loads((tmp_path / "m.json").read_text())["methods"]["lad"]
    _check_equal(_metrics(log), _printed(output), reference)
