"""`--model lad` inside the real lmms-eval and lm-eval on LLaVA-OneVision-1.5's own code (remote
code, transformers 4.53.1; issue 41): the shrunk random-weight copy of its real files
(lad.testing.remote) with trust_remote_code=True, in CI's .ci/.venv-remote, which holds both
harnesses beside that transformers.

References, none of them the harness adapters: for lmms-eval, `lad eval --trust-remote-code` on
the same MuirBench-schema questions converted by `lad data muirbench` (lad eval's records are
checked against brute force and a patched eager copy in tests/test_remote_code.py), and, for its
one question with text options, the model's own greedy `generate` on its own chat template; for
lm-eval, `lad eval` on the questions converted by `lad data mmlu`, and lm-eval's own `--model hf`
(the checkpoint's code run by lm-eval, no lad). Skipped, saying why, where transformers is 5.x,
a harness is missing or LAD_REAL_CHECKPOINTS does not name the folder.
"""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import transformers

if int(transformers.__version__.split(".")[0]) >= 5:
    pytest.skip(
        f"transformers {transformers.__version__}: LLaVA-OneVision-1.5's code runs under 4.53.1 "
        "(.ci/run's .venv-remote; docs/backends.md, 'Remote code')",
        allow_module_level=True,
    )
for _harness in ("lmms-eval", "lm-eval"):  # installed but broken: an error here, not a skip
    try:
        metadata.version(_harness)
    except metadata.PackageNotFoundError:
        pytest.skip(f"{_harness} not installed beside transformers 4.53", allow_module_level=True)
    importlib.import_module(_harness.replace("-", "_"))

# After the checks above: the harness tests' modules import lmms-eval and lm-eval themselves.
from lad.core.records import read_records  # noqa: E402
from lad.data.items import cyclic_shift, read_items  # noqa: E402
from lad.harness.text_scorer import FILES  # noqa: E402
from tests import test_harness as lmms  # noqa: E402
from tests import test_lm_eval as lm  # noqa: E402
from tests.harness_fixtures import local_task, shapes_muirbench  # noqa: E402

N, EVAL_ITEMS, CAL_ITEMS = 3, 3, 2
PLAIN, CIRCULAR = "muir_local", "muir_local_circular"


@pytest.fixture(scope="module")
def lmms_run(llava15_tiny: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """lmms-eval's CLI with --model lad (trust_remote_code=True, method=lad, a calibration from
    `lad calibrate --trust-remote-code`) on MuirBench's own task and lad's circular variant over
    a local parquet (two context-picture questions and one with text options among them), and
    the same questions through `lad data muirbench` and `lad eval --trust-remote-code` in every
    cyclic order (shift 0 is the order the plain task shows)."""
    import lmms_eval

    from lad.harness import tasks_folder

    root = tmp_path_factory.mktemp("remote-lmms")
    parquet = shapes_muirbench(root / "eval", items=EVAL_ITEMS, split="eval", n=N, extras=True)
    cal_parquet = shapes_muirbench(root / "cal", items=CAL_ITEMS, split="calibration", n=N)
    muirbench = Path(lmms_eval.__file__).parent / "tasks/muirbench/muirbench.yaml"
    tasks = local_task(root / "tasks", parquet, PLAIN, muirbench, "lmms_eval.tasks.muirbench.utils")
    local_task(root / "tasks", parquet, CIRCULAR, tasks_folder() / "muirbench_circular.yaml")
    for name, path in (("eval", parquet), ("cal", cal_parquet)):
        lmms._lad("data", "muirbench", str(path), "--calibration-items", "0",
                  "--out", str(root / f"{name}.jsonl"), cwd=root)  # fmt: skip
    calibration = root / "calibration.json"
    common = ("--model", str(llava15_tiny), "--trust-remote-code", "--labels", "upper",
              "--device", "cpu", "--quiet")  # fmt: skip
    lmms._lad("calibrate", *common, "--data", str(root / "cal.jsonl"),
              "--out", str(calibration), cwd=root)  # fmt: skip
    out = root / "lmms"
    args = f"model={llava15_tiny},trust_remote_code=True,method=lad,calibration={calibration}"
    log = lmms._run(
        "-m", "lmms_eval", "--model", "lad", "--model_args", f"{args},output={out}/lad",
        "--tasks", f"{PLAIN},{CIRCULAR}", "--include_path", str(tasks),
        "--output_path", str(out), "--log_samples", "--device", "cpu", cwd=root,
    )  # fmt: skip
    assert list(out.rglob("*_results.json")), log[-3000:]  # (lmms-eval exits 0 on errors)
    orders = root / "cyclic.jsonl"
    with orders.open("w") as f:
        for it in read_items(root / "eval.jsonl"):
            for s in range(N):
                f.write(json.dumps({"item": it.id, "order": cyclic_shift(N, s)}) + "\n")
    lmms._lad("eval", *common, "--data", str(root / "eval.jsonl"), "--calibration",
              str(calibration), "-n", str(N), "--methods", "vanilla,lad", "--orders", str(orders),
              "--out", str(root / "eval"), cwd=root)  # fmt: skip
    return {"root": root, "out": out, "lad": out / "lad", "log": log}


@pytest.mark.parametrize("task", [PLAIN, CIRCULAR])
def test_lmms_eval_answers_and_records_equal_lad_eval(lmms_run: dict[str, Any], task: str) -> None:
    """Each picture question's record under lmms-eval's --model lad is lad eval's for the same
    item and order (label log-probabilities 1e-5, span attention), and its reply is the letter
    of the option lad eval's LAD chooses; vanilla is lad eval's too."""
    ours = lmms_run["lad"] / task / f"n{N}"
    theirs = lmms_run["root"] / "eval"
    mine, ref = read_records(ours / "records.jsonl"), read_records(theirs / "records.jsonl")
    where = {k: i for i, k in enumerate(ref.keys())}
    asked = mine.keys()
    shifts = N if task == CIRCULAR else 1  # the plain task: each question in its own order
    assert len(asked) == shifts * (EVAL_ITEMS + 2) and set(asked) <= set(where)
    assert any(k[0].startswith("muirbench-context-") for k in asked)
    rows = [where[k] for k in asked]
    assert np.array_equal(mine.order, ref.order[rows])
    np.testing.assert_allclose(mine.logprobs, ref.logprobs[rows], atol=1e-5, rtol=0)
    np.testing.assert_allclose(mine.attention, ref.attention[rows], rtol=1e-4, atol=1e-7)
    assert np.abs(mine.logprobs - np.log(1 / N)).max() > 1e-3  # the model discriminates
    lad_eval = lmms._chosen(theirs, "lad")
    replied = {}
    for sample in lmms._samples(lmms_run["out"], task):
        doc = sample["muirbench_score_overall"]
        ordering = sample["lad_acc"]["ordering"] if task == CIRCULAR else 0
        replied[(f"muirbench-{doc['idx']}", ordering)] = sample["filtered_resps"]
    for key in asked:
        assert replied.pop(key) == "ABC"[lad_eval[key]], key
    assert list(replied) == ([("muirbench-text-0", 0)] if task == PLAIN else [])
    vanilla = lmms._chosen(theirs, "vanilla")
    assert lmms._chosen(ours, "vanilla") == {k: vanilla[k] for k in asked}


def test_lmms_eval_audit_equals_lad_metrics(lmms_run: dict[str, Any]) -> None:
    """The circular task's lad_audit.json and lmms-eval's own table hold lad metrics' numbers
    of lad eval's run in the same N cyclic orders."""
    audit = json.loads((lmms_run["lad"] / "lad_audit.json").read_text())
    entry = audit["tasks"][CIRCULAR][str(N)]
    assert entry["num_items"] == EVAL_ITEMS + 2 and entry["num_shuffles"] == N
    assert entry["calibration"]["kind"] == "file"
    reference = lmms._metrics(lmms_run["root"] / "eval")["methods"]
    for method in ("vanilla", "lad"):
        for key in ("acc", "acc_std", "rstd", "cons", "recall_by_position", "flip_rate"):
            got = entry["methods"][method][key]
            assert got == pytest.approx(reference[method][key], abs=1e-9), (method, key)
    table = lmms._results(lmms_run["out"])[CIRCULAR]
    for name in ("acc", "rstd", "cons"):
        assert table[f"lad_{name},flexible-extract"] == pytest.approx(reference["lad"][name])
    assert 100 * table["muirbench_score_overall,flexible-extract"] == pytest.approx(
        reference["lad"]["acc"]
    )


def test_lmms_eval_text_question_is_the_models_own_greedy_reply(
    lmms_run: dict[str, Any], llava15_tiny: Path
) -> None:
    """The question with text options is answered by plain generation: the reply is what the
    checkpoint's own code generates greedily (16 new tokens, MuirBench's generation_kwargs) from
    its ChatML turn written out here by hand (no lad code), the question's picture first and its
    text with `<image>` taken out; lmms-eval logs that reply as it is and after MuirBench's own
    filter (a leading "X." becomes X)."""
    import torch
    from lmms_eval.tasks.muirbench.utils import MultiChoiceRegexFilter
    from PIL import Image
    from transformers import AutoModelForCausalLM, AutoProcessor

    assert "1 answered by plain generation" in lmms_run["log"]
    (sample,) = [
        s for s in lmms._samples(lmms_run["out"], PLAIN)
        if s["muirbench_score_overall"]["idx"] == "text-0"
    ]  # fmt: skip
    text = sample["input"].replace("Does <image> show", "Does show")
    assert "<image>" not in text
    (item,) = [it for it in read_items(lmms_run["root"] / "eval" / "shapes" / "items.jsonl")
               if it.id.endswith("-00000")]  # fmt: skip
    picture = Image.open(item.images[item.answer]).convert("RGB")  # the question's one picture
    prompt = (
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n"
        f"<|vision_start|><|image_pad|><|vision_end|>{text}<|im_end|>\n<|im_start|>assistant\n"
    )
    processor = AutoProcessor.from_pretrained(llava15_tiny, trust_remote_code=True)
    model = AutoModelForCausalLM.from_pretrained(
        llava15_tiny, torch_dtype=torch.float32, trust_remote_code=True
    ).eval()
    inputs = processor(text=[prompt], images=[picture], return_tensors="pt")
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=16, do_sample=False)
    reply = processor.tokenizer.decode(out[0, inputs["input_ids"].shape[1] :],
                                       skip_special_tokens=True)  # fmt: skip
    assert reply.strip()
    # The reply as generated: lmms-eval logs it unless the filter left it as it was.
    assert sample.get("resps", [sample["filtered_resps"]]) == [reply]
    assert sample["filtered_resps"] == MultiChoiceRegexFilter().apply([[reply]], [None])[0]


# --------------------------------------------------------------------------- lm-eval


@pytest.fixture(scope="module")
def lm_setup(llava15_tiny: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """tests/test_lm_eval.py's local MMLU-style task and its questions as lad items."""
    from lad.cli import main

    root = tmp_path_factory.mktemp("remote-lm-eval")
    lm._write_questions(root / "test.jsonl", lm.QUESTIONS)
    lm._write_questions(root / "dev.jsonl", lm.DEV)
    (root / "task").mkdir()
    (root / "task" / "lad_mcq.yaml").write_text(lm.TASK.format(data=root / "test.jsonl"))
    for name in ("test", "dev"):
        assert main(["data", "mmlu", str(root / f"{name}.jsonl"), "--calibration-items", "0",
                     "--out", str(root / f"{name}.items.jsonl")]) == 0  # fmt: skip
    dev = [json.loads(x) for x in (root / "dev.items.jsonl").read_text().splitlines()]
    (root / "dev.items.jsonl").write_text(  # MMLU's dev rows are named as its test rows
        "".join(json.dumps({**it, "id": "dev-" + it["id"]}) + "\n" for it in dev)
    )
    return {"root": root, "model": llava15_tiny}


def test_lm_eval_model_lad_equals_lad_eval(lm_setup: dict[str, Path], tmp_path: Path) -> None:
    """`lad harness lm-eval --model lad --trust_remote_code` (lm-eval's own flag) with
    method=lad fitted on the dev questions: each question's scores and choice are those of
    `lad eval --trust-remote-code` on the same questions with the same calibration questions."""
    from lad.cli import main

    root, model = lm_setup["root"], lm_setup["model"]
    args = f"pretrained={model},method=lad,calibration_items={root / 'dev.items.jsonl'}"
    run = subprocess.run(
        [sys.executable, "-m", "lad", "harness", "lm-eval", "--model", "lad", "--model_args",
         args, "--trust_remote_code", "--device", "cpu", "--tasks", "lad_mcq",
         "--include_path", str(root / "task"), "--output_path", str(tmp_path / "out"),
         "--log_samples"],
        capture_output=True, text=True, env=lm._env(), timeout=600,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    samples = lm._samples(tmp_path / "out", "lad_mcq")
    assert [s["doc_id"] for s in samples] == list(range(len(lm.QUESTIONS)))
    items = [json.loads(x) for x in (root / "test.items.jsonl").read_text().splitlines()]
    orders = tmp_path / "orders.jsonl"
    orders.write_text("".join(json.dumps({"item": it["id"], "order": [0, 1, 2, 3]}) + "\n"
                              for it in items))  # fmt: skip
    assert main(
        ["eval", "--model", str(model), "--trust-remote-code", "--data",
         str(root / "test.items.jsonl"), "--calibration-data", str(root / "dev.items.jsonl"),
         "--calibration-items", "5", "--labels", "upper", "--prompt-template",
         str(FILES / "mmlu.txt"), "--chat-template", str(FILES / "plain.jinja"),
         "--methods", "vanilla,lad", "--orders", str(orders), "--device", "cpu",
         "--out", str(tmp_path / "run"), "-q"]
    ) == 0  # fmt: skip
    predictions = [json.loads(x) for x in (tmp_path / "run" / "predictions.jsonl").open()]
    lad = {p["item"]: p for p in predictions if p["method"] == "lad"}
    for sample in samples:
        mine = lad[f"mmlu-{lm.QUESTIONS[sample['doc_id']][1]}-{sample['doc_id']}"]
        scores = lm._scores(sample)
        np.testing.assert_allclose(scores, mine["scores"], rtol=1e-5, atol=1e-6)
        assert int(np.argmax(scores)) == mine["prediction"]
        assert sample["acc"] == float(mine["prediction"] == sample["doc"]["answer"])


def test_lm_eval_vanilla_equals_lm_evals_own_hf_model(lm_setup: dict[str, Path]) -> None:
    """method=vanilla's scores are the loglikelihoods lm-eval's own `--model hf` computes with
    the checkpoint's code (trust_remote_code=True), renormalised over the four letters."""
    root, model = lm_setup["root"], lm_setup["model"]
    task = root / "task"
    theirs = lm._evaluate("hf", f"pretrained={model},dtype=float32,trust_remote_code=True",
                          lm_setup, "lad_mcq", task)  # fmt: skip
    mine = lm._evaluate("lad", f"pretrained={model},method=vanilla,trust_remote_code=True",
                        lm_setup, "lad_mcq", task)  # fmt: skip
    assert len(mine) == len(lm.QUESTIONS)
    for a, b in zip(theirs, mine, strict=True):
        assert a["arguments"] == b["arguments"]  # the same prompts and continuations
        raw = lm._scores(a)
        np.testing.assert_allclose(lm._scores(b), raw - np.logaddexp.reduce(raw), atol=2e-5)
        assert np.ptp(raw - np.logaddexp.reduce(raw)) > 1e-3  # the model discriminates
        assert b["acc"] == a["acc"]
