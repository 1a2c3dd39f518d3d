"""The vLLM engine's records equal the HF backend's (docs/backends.md, "The vLLM engine").

On tiny random models of head sizes vLLM's CPU attention takes: Qwen2 text on the real Qwen3
tokenizer (N = 4 and 11: "10", "11" are two tokens, a branching label prefix), Qwen2.5-VL on
the real 3B processor files (N = 4 and 10), and lad's demo model (Qwen2-VL, head size 64). Every
record of every cyclic shift within 1e-4 (log-probabilities) and 5e-5 (attention) of the HF
backend's, made in lad's own environment; the same choices for every method; the text model's
engine runs with a 64-token step budget, so its prompts are prefilled in chunks. One engine at
a time, in this process (vLLM's in-process mode).
"""

from __future__ import annotations

import gc
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.vllm_fixtures import (
    ATTENTION_TOL,
    LOGPROB_TOL,
    RECORD_METHODS,
    build_model,
    by_n,
    engine_env,
    hf_records,
    largest_differences,
    needs_hf,
    needs_vllm,
    picture_items,
    text_items,
)

pytestmark = [needs_vllm]
STEP_BUDGET = 64  # the text engine's max_num_batched_tokens: its prompts come in chunks


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("vllm")


@pytest.fixture(scope="module", params=["text", "vl", "demo"])
def engine(request: pytest.FixtureRequest, folder: Path) -> Iterator[dict[str, Any]]:
    """One model loaded by the vLLM engine (in this process), with its items and requests."""
    from lad.backends.engines import load_engine
    from lad.data.items import read_items
    from lad.data.orders import cyclic_requests

    kind = request.param
    model = build_model(kind, folder / "models")
    data = folder / kind
    data.mkdir()
    items_file = text_items(data) if kind == "text" else picture_items(data)
    items = read_items(items_file)
    saved = dict(os.environ)
    os.environ.update(engine_env(), VLLM_ENABLE_V1_MULTIPROCESSING="0")
    args = {"max_num_batched_tokens": STEP_BUDGET, "max_model_len": 4096} if kind == "text" else {}
    backend = load_engine("vllm", str(model), dtype="float32", engine_args=args, quiet=True)
    try:
        yield {
            "kind": kind,
            "model": model,
            "items_file": items_file,
            "items": items,
            "requests": cyclic_requests(items),
            "backend": backend,
            "folder": data,
        }
    finally:
        backend.close()
        del backend
        gc.collect()
        os.environ.clear()
        os.environ.update(saved)


def _records(engine: dict[str, Any], requests: list, batch_size: int = 4) -> dict[int, Any]:
    from lad.core.labels import get_scheme

    made = engine["backend"].records(requests, scheme=get_scheme("digits"), batch_size=batch_size)
    return by_n(list(made))


@pytest.fixture(scope="module")
def both(engine: dict[str, Any]) -> tuple[dict[int, Any], dict[int, Any]]:
    """(vLLM records, HF records) of every cyclic shift of every item, by N."""
    mine = _records(engine, engine["requests"])
    theirs = hf_records(
        engine["model"], engine["items_file"], engine["requests"], engine["folder"] / "hf.jsonl"
    )
    return mine, theirs


@needs_hf
def test_records_equal_the_hf_backends(engine: dict[str, Any], both: tuple[Any, Any]) -> None:
    mine, theirs = both
    assert sorted(mine) == sorted(theirs) and len(mine) == 2
    for n in mine:
        logprobs, attention = largest_differences(mine[n], theirs[n])
        print(f"\n{engine['kind']} N={n}: |Δ log P| ≤ {logprobs:.2e}, |Δ attn| ≤ {attention:.2e}")
        assert logprobs <= LOGPROB_TOL
        assert attention <= ATTENTION_TOL
        assert np.allclose(np.exp(mine[n].logprobs).sum(1), 1)  # restricted softmaxes (App. B)
    if engine["kind"] == "text":  # the prompts were longer than a step: prefilled in chunks
        assert max(e["prompt_tokens"] for r in mine.values() for e in r.extra) > 2 * STEP_BUDGET


@needs_hf
def test_every_method_chooses_the_same(both: tuple[Any, Any]) -> None:
    from lad.core.calibrate import Calibration
    from lad.core.methods import predict

    for n in both[0]:
        choices = []
        for records in (both[0][n], both[1][n]):  # calibrated on all, scored on all
            calibration = Calibration().fit(records)
            choices.append(
                {m: predict(m, records, calibration, perm_records=records) for m in RECORD_METHODS}
            )
        for method in RECORD_METHODS:
            assert (choices[0][method] == choices[1][method]).all(), (n, method)


def test_a_batch_gives_each_request_its_own_records(engine: dict[str, Any]) -> None:
    """Rows and log-probabilities of a request do not depend on what the engine batched it
    with (one at a time against the whole set at once)."""
    requests = engine["requests"][:3]
    alone = [_records(engine, [r], batch_size=1)[4] for r in requests]
    together = _records(engine, requests, batch_size=3)[4]
    for k, single in enumerate(alone):
        assert np.abs(single.logprobs[0] - together.logprobs[k]).max() <= 1e-5
        assert np.abs(single.attention[0] - together.attention[k]).max() <= 1e-6
