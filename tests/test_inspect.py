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
from inspect_ai.solver import Choices, MultipleChoiceTemplate

from lad.cli import main as lad_main
from lad.core.predictions import predictions_for, write_predictions
from lad.core.records import RecordSet, write_records
from lad.harness.text_scorer import FILES
from lad.testing.text import build_tiny_text_model
from tests.inspect_task import DEV, PAIRS, QUESTIONS, mock_choice

N = 4
INSPECT = [sys.executable, "-m", "inspect_ai"]
TASK = Path(__file__).parent / "inspect_task.py"
PRINTED = ("lad_acc", "lad_rstd", "lad_cons", "lad_flip", "lad_circular", "lad_position_p",
           "lad_noise_floor")  # fmt: skip
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


def _inspect(*args: str, cwd: Path, code: int = 0) -> str:
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
    assert run.returncode == code, (run.stdout + run.stderr)[-4000:]
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


def _mock_records(questions: list) -> tuple[RecordSet, np.ndarray]:
    """The questions under their N cyclic shifts, named as `lad data mmlu` names them, and what
    the mock's rule answers to each order shown: worked out from the dataset alone."""
    rows = []
    for i, (question, subject, choices, answer) in enumerate(questions):
        n = len(choices)
        for shift in range(n):
            order = [(p + shift) % n for p in range(n)]
            chosen = mock_choice([choices[o] for o in order], question)
            rows.append((f"mmlu-{subject}-{i}", shift, order, order.index(answer), chosen))
    n = len(rows[0][2])
    records = RecordSet(
        items=np.array([r[0] for r in rows]),
        ordering=np.array([r[1] for r in rows]),
        order=np.array([r[2] for r in rows]),
        answer=np.array([r[3] for r in rows]),
        logprobs=np.log(np.full((len(rows), n), 1.0 / n)),
        attention=np.zeros((len(rows), 1, n)),
        extra=[{} for _ in rows],
    )
    return records, np.array([r[4] for r in rows])


def _lad_metrics(tmp: Path, records: RecordSet, pred: np.ndarray, method: str) -> dict:
    """`lad metrics` of these records and predictions (method's numbers)."""
    write_records(tmp / "records.jsonl", records)
    predictions = predictions_for(records, method, records.logprobs, pred)
    write_predictions(tmp / "predictions.jsonl", predictions)
    return _lad_metrics_of(tmp, tmp, method)


def _lad_metrics_of(run: Path, tmp: Path, method: str) -> dict:
    args = ["--records", str(run / "records.jsonl"), "--predictions"]
    args += [str(run / "predictions.jsonl"), "--out", str(tmp / "m.json")]
    assert lad_main(["metrics", *args]) == 0
    return json.loads((tmp / "m.json").read_text())["methods"][method]


def _check_equal(got: dict, printed: dict, reference: dict, floor: float | None = None) -> None:
    """Inspect's logged metrics equal lad's; the printed ones to the 3 decimals printed. The
    noise floor: `floor`, or NaN (one epoch: nothing asked again)."""
    for name, key in LAD_KEYS.items():
        assert got[name] == pytest.approx(reference[key], abs=1e-9), name
        assert printed[name] == pytest.approx(reference[key], abs=5e-4), name
    p = reference["position_test"]["p_value"]
    assert got["lad_position_p"] == pytest.approx(p, abs=1e-12)
    assert printed["lad_position_p"] == pytest.approx(p, abs=5e-4)
    if floor is None:
        assert np.isnan(got["lad_noise_floor"]) and np.isnan(printed["lad_noise_floor"])
    else:
        assert got["lad_noise_floor"] == printed["lad_noise_floor"] == floor


def test_circular_with_mockllm_prints_lad_metrics_of_its_choices(setup, tmp_path):
    data = setup["root"] / "test.jsonl"
    output = _inspect("eval", f"{TASK}@lad_mock", "-T", f"data={data}", cwd=tmp_path)
    log = _log(tmp_path)
    records, pred = _mock_records(QUESTIONS)
    assert (pred == -1).any() and (pred == records.answer).any() and (pred != records.answer).any()
    reference = _lad_metrics(tmp_path, records, pred, "model")
    assert 0 < reference["flip_rate"] < 100 and reference["position_test"]["p_value"] < 0.05
    _check_equal(_metrics(log), _printed(output), reference)
    # lad harness audit of Inspect's log folder: the whole audit is lad metrics'
    assert lad_main(["harness", "audit", str(tmp_path / "logs"), "--out", str(tmp_path / "a")]) == 0
    audit = json.loads((tmp_path / "a" / "lad_audit.json").read_text())
    (entry,) = audit["tasks"]["lad_mock__mockllm__model"].values()
    metrics = json.loads((tmp_path / "a" / entry["folder"] / "metrics.json").read_text())
    assert metrics["methods"]["model"] == reference
    sample = log.samples[0]
    rows = sample.scores["position"].metadata["lad_rows"]
    assert [r["order"] for r in rows] == [[(p + s) % N for p in range(N)] for s in range(N)]
    assert sample.output.completion == sample.store["lad_completions"][0]  # shift 0 kept
    assert "A) " + QUESTIONS[0][2][0] in sample.messages[0].text  # its messages: the original order


def test_a_pairwise_judgment_is_asked_in_both_orders_and_a_flip_is_a_tie(setup, tmp_path):
    _write(tmp_path / "pairs.jsonl", PAIRS)
    args = ["-T", f"data={tmp_path / 'pairs.jsonl'}", "--epochs", "2"]
    output = _inspect("eval", f"{TASK}@lad_mock", *args, cwd=tmp_path)
    log = _log(tmp_path)
    records, pred = _mock_records(PAIRS)
    reference = _lad_metrics(tmp_path, records, pred, "model")
    _check_equal(_metrics(log), _printed(output), reference, floor=0.0)  # the first epoch's
    verdicts = {s.id: s.scores["position"].answer for s in log.samples}
    assert len(log.samples) == 2 * len(PAIRS)  # each pair asked in both orders in each epoch
    assert list(verdicts.values()) == ["tie", "tie", "tie", "B"]  # one pair judged consistently
    # floor 0: the mock answers an order alike each time
    assert reference["cons"] == 25.0 and reference["flip_rate"] == 75.0


def test_inspect_score_of_a_task_run_with_the_circular_solver(setup, tmp_path):
    data = setup["root"] / "test.jsonl"
    args = ["-T", f"data={data}", "-T", "mock=true", "--solver", "lad/circular"]
    _inspect("eval", f"{TASK}@lad_plain", *args, cwd=tmp_path)
    (path,) = (tmp_path / "logs").glob("*.eval")
    assert "choice" in {s.name for s in _log(tmp_path).results.scores}  # the task's own scorer
    rescored = tmp_path / "rescored.eval"
    args = ["--scorer", "lad/position", "--action", "append", "--output-file", str(rescored)]
    output = _inspect("score", str(path), *args, cwd=tmp_path)
    records, pred = _mock_records(QUESTIONS)
    reference = _lad_metrics(tmp_path, records, pred, "model")
    _check_equal(_metrics(read_eval_log(str(rescored))), _printed(output), reference)


@pytest.fixture(scope="module")
def model(setup) -> Path:
    real = _tokenizer()
    words = "which animal can fly fruit colour metal city number tree planet is a an the one in"
    return build_tiny_text_model(
        "qwen2" if real else "llama", setup["root"] / "model", tokenizer=real, words=words.split()
    )


def test_model_lad_answers_as_lad_eval_under_every_shift(setup, model, tmp_path):
    root = setup["root"]
    args = ["-T", f"data={root / 'test.jsonl'}", "--model", f"lad/{model}", "-M",
            f"calibration_items={root / 'dev.items.jsonl'}", "-M", "device=cpu"]  # fmt: skip
    output = _inspect("eval", f"{TASK}@lad_circular", *args, cwd=tmp_path)
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
    eval_args = ["--model", str(model), "--data", str(root / "test.items.jsonl"),
                 "--calibration-data", str(root / "dev.items.jsonl"), "--calibration-items", "5",
                 "--labels", "upper", "--prompt-template", str(FILES / "mmlu.txt"),
                 "--chat-template", str(FILES / "plain.jinja"), "--methods", "vanilla,lad",
                 "--orders", str(orders), "--device", "cpu", "--out", str(tmp_path / "run"),
                 "-q"]  # fmt: skip
    assert lad_main(["eval", *eval_args]) == 0
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
    reference = _lad_metrics_of(run, tmp_path, "lad")
    _check_equal(_metrics(log), _printed(output), reference)


# ------------------------------------------------ the provider's reading of a turn (no model)


def test_a_multiple_choice_turn_is_read_back_to_its_question_and_options():
    from lad.harness.inspect_model import context_question, read_turn

    options = ["a dog", "two\nlines, A) not a label", "the Moon"]
    question = "Few-shot: A) is not where options start here\nWhich one?"
    for template in (MultipleChoiceTemplate.SINGLE_ANSWER.value, "{question}\n\n{choices}"):
        asked = read_turn(Choices(options).prompt(question, template))
        assert asked.question == question and list(asked.options) == options
    prompt = context_question(asked, 0).prompt()  # lad's rendering, checked in lad.harness.contexts
    assert prompt.text == f"{question}\nA. a dog\nB. {options[1]}\nC. the Moon\nAnswer:"


@pytest.mark.parametrize(
    ("turn", "message"),
    [
        ("What is it?", "lists no options"),
        ("What is it?\n\nA) one", "one option only"),
        (MultipleChoiceTemplate.MULTIPLE_ANSWER.value.format(
            question="Q?", choices="A) x\nB) y", letters="A,B"), "multiple-answer"),
        ("Answer the following multiple choice question. The entire content of your response "
         "should be of the following format: 'ANSWER: $LETTER' (without quotes) where LETTER is "
         "one of A,B,C.\n\nQ?\n\nA) x\nB) y", "names the letters"),
        ("A) x\nB) y", "no question"),
    ],
)  # fmt: skip
def test_a_turn_lad_cannot_read_is_refused_with_the_reason(turn, message):
    from lad.errors import LadError
    from lad.harness.inspect_model import read_turn

    with pytest.raises(LadError, match=message):
        read_turn(turn)


def test_the_provider_refuses_unknown_args_and_lad_without_a_calibration(tmp_path):
    from lad.harness.inspect_model import LadModelAPI

    refusals = (
        ({"soup": 1}, "unknown -M ['soup']"),
        ({}, "needs a calibration"),
        ({"method": "vanilla", "check_calibration": "no?"}, "must be True or False"),
    )
    for args, message in refusals:
        with pytest.raises(Exception) as refused:  # before any model loads
            LadModelAPI("some/model", **args)
        assert message in refused.value.message and refused.value.message.startswith("Error: ")
    _write(tmp_path / "pairs.jsonl", PAIRS)
    args = ["-T", f"data={tmp_path / 'pairs.jsonl'}", "--model", "lad/some/model"]
    output = _inspect("eval", f"{TASK}@lad_circular", *args, cwd=tmp_path, code=1)
    assert "Error: method=lad needs a calibration" in output and "Traceback" not in output
    # check_calibration (the switch a calibration refusal names) is one of its -M args
    lenient = LadModelAPI("some/model", method="vanilla", check_calibration="False")
    assert lenient.options.check_calibration is False


# ------------------------------------------------ the solver and the metrics, in process


def _state(target: str, choices: list[str]):
    from inspect_ai.model import ChatMessageUser, ModelName
    from inspect_ai.scorer import Target
    from inspect_ai.solver import TaskState

    question = [ChatMessageUser(content="Which one?")]
    return TaskState(ModelName("mockllm/model"), "q", 1, "Which one?", question,
                     target=Target(target), choices=choices)  # fmt: skip


def test_a_sample_without_one_target_letter_is_refused_before_any_asking():
    import asyncio

    from lad.errors import LadError
    from lad.harness.inspect_audit import circular

    async def generate(state, **kwargs):  # never reached
        raise AssertionError("asked")

    for target, message in (("AB", "one target letter"), ("E", "one target letter")):
        with pytest.raises(LadError, match=message):
            asyncio.run(circular()(_state(target, ["x", "y", "z"]), generate))
    with pytest.raises(LadError, match="at least 2 choices"):
        asyncio.run(circular()(_state("A", ["x"]), generate))


def test_mixed_n_pools_by_records_and_leaves_the_position_test_per_n():
    from inspect_ai.scorer import SampleScore, Score

    from lad.harness.audit import rows_metrics
    from lad.harness.inspect_audit import lad_acc, lad_position_p

    def rows(item: str, n: int, chosen: int) -> list[dict]:
        orders = [[(p + s) % n for p in range(n)] for s in range(n)]
        return [{"item": item, "ordering": s, "order": o, "answer": o.index(0),
                 "prediction": o.index(chosen)} for s, o in enumerate(orders)]  # fmt: skip

    groups = [rows("a", 2, 0), rows("b", 2, 1), rows("c", 4, 0), rows("d", 4, 3)]
    scores = [SampleScore(score=Score(value=0, metadata={"lad_rows": g}), sample_id=g[0]["item"])
              for g in groups]  # fmt: skip
    by_n = rows_metrics([r for g in groups for r in g])
    weighted = by_n[2]["methods"]["model"]["acc"] * 4 + by_n[4]["methods"]["model"]["acc"] * 8
    assert lad_acc()(scores) == pytest.approx(weighted / 12)
    assert np.isnan(lad_position_p()(scores))
    assert lad_position_p()(scores[2:]) == by_n[4]["methods"]["model"]["position_test"]["p_value"]
