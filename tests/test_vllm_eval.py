"""`lad eval --engine vllm` end to end on a tiny Qwen2.5-VL (the real 3B processor files) gives the
records and predictions of `lad eval --engine hf` (run in lad's own environment, LAD_HF_PYTHON):
calibration, evaluation, perm-avg and blank records within 1e-4 / 5e-5, every method's
prediction the same. The vLLM run is a user's: `python -m lad` in a process of its own,
vLLM's workers in processes of their own."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.vllm_fixtures import (
    ATTENTION_TOL,
    LOGPROB_TOL,
    ROOT,
    build_model,
    engine_env,
    largest_differences,
    needs_hf,
    needs_vllm,
    picture_items,
)

pytestmark = [needs_vllm, needs_hf]
FILES = ("calibration.jsonl", "records.jsonl", "perm_records.jsonl", "blank_records.jsonl")
RUNS = ("vllm", "hf")


def _lad(python: str, out: Path, env: dict[str, str], *argv: str) -> None:
    done = subprocess.run(
        [python, "-m", "lad", "eval", *argv, "--out", str(out), "--quiet"],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-3000:]


def test_lad_eval_engine_vllm_equals_engine_hf(tmp_path: Path) -> None:
    from lad.core.records import read_records

    model = build_model("vl", tmp_path / "models")
    data = picture_items(tmp_path, counts=(4, 4, 4, 4))
    flags = ["--model", str(model), "--data", str(data), "-n", "4", "--items", "2"]
    flags += ["--calibration-items", "2", "--num-shuffles", "2", "--dtype", "float32"]
    hf_env = dict(os.environ, PYTHONPATH=str(ROOT))
    _lad(os.environ["LAD_HF_PYTHON"], tmp_path / "hf", hf_env, *flags, "--engine", "hf")
    _lad(sys.executable, tmp_path / "vllm", engine_env(), *flags, "--engine", "vllm")
    for name in FILES:
        mine, theirs = (read_records(tmp_path / run / name) for run in RUNS)
        logprobs, attention = largest_differences(mine, theirs)
        print(f"\n{name}: |Δ log P| ≤ {logprobs:.2e}, |Δ attention| ≤ {attention:.2e}")
        assert logprobs <= LOGPROB_TOL and attention <= ATTENTION_TOL
    made = [(tmp_path / run / "predictions.jsonl").read_text().splitlines() for run in RUNS]
    assert len(made[0]) == len(made[1]) > 0
    methods = set()
    for mine, theirs in zip(*([json.loads(line) for line in m] for m in made), strict=True):
        scores = (mine.pop("scores"), theirs.pop("scores"))
        assert mine == theirs  # item, ordering, method, prediction
        assert max(abs(a - b) for a, b in zip(*scores, strict=True)) <= 1e-3
        methods.add(mine["method"])
    assert methods >= {"vanilla", "pride", "lad", "attn", "attn-purified", "perm-avg"}
