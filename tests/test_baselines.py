"""The paper's baselines on tiny models of every architecture: generation, SoFA, perm-avg, lad eval.

Greedy replies are checked against transformers' own `generate`; the SoFA mask against a direct
computation; every method runs end to end through `lad eval` on each architecture.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from lad.backends import load_backend
from lad.backends.generate import GenerationOptions, generation_records, stop_tokens
from lad.backends.sofa import SofaOptions, _active, _Scope, sofa_applied, sofa_attention, sofa_mask
from lad.core.labels import get_scheme
from lad.core.methods import METHODS, parsed_paths
from lad.core.predictions import read_predictions
from lad.core.records import read_records
from lad.data.items import Item
from lad.data.shapes import build_shapes, shapes_vocabulary
from lad.errors import BackendError, RunError
from lad.evaluate import evaluate
from lad.run.config import EvalConfig
from lad.run.rundir import STAGE_FILES
from lad.testing.tiny import ARCHITECTURES, build_tiny_model
from tests.runfiles import small_config

N = 3
BASELINES = ("vanilla", "perm-avg", "instruction", "cot", "self-consistency", "sofa")


@pytest.fixture(scope="module")
def bench(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("bench")
    kw = {"num_candidates": N, "setting": "random", "seed": 3, "image_size": 32}
    data = build_shapes(root / "eval", items=2, split="eval", **kw)
    cal = build_shapes(root / "cal", items=1, split="calibration", **kw)
    return data, cal


@pytest.fixture(scope="module", params=sorted(ARCHITECTURES))
def model_path(request, tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp(request.param) / "model"
    return str(build_tiny_model(request.param, path, words=shapes_vocabulary()))


def _config(model: str, bench: tuple[Path, Path], **kw) -> EvalConfig:
    more = {"num_candidates": N, "calibration_items": 1, "dtype": "float32", "methods": BASELINES}
    return small_config(model, bench, **{**more, "max_new_tokens": 3, "sc_samples": 2, **kw})


def test_every_baseline_runs_through_lad_eval(model_path, bench, tmp_path):
    run = tmp_path / "run"
    result = evaluate(_config(model_path, bench), run)
    methods = result.metrics["methods"]
    assert list(methods) == list(BASELINES)
    records = read_records(run / "records.jsonl")
    for method in ("instruction", "cot", "self-consistency"):
        stage = read_records(run / STAGE_FILES[method])
        assert stage.keys() == records.keys()
        samples = 2 if method == "self-consistency" else 1
        for extra in stage.extra:
            assert extra["template"] == method
            assert len(extra["replies"]) == len(extra["generated_tokens"]) == samples
            assert all(1 <= t <= 3 for t in extra["generated_tokens"])
        assert methods[method]["forward_passes_per_item"] == 1
        tokens = np.mean([sum(e["generated_tokens"]) for e in stage.extra])
        assert methods[method]["generated_tokens_per_item"] == pytest.approx(tokens)
        # The stored predictions are the replies re-parsed: a run can be re-scored offline.
        preds = [p.prediction for p in read_predictions(run / "predictions.jsonl")]
        assert all(-1 <= p < N for p in preds)
        labels = get_scheme("digits").labels(N)
        unparsed = np.mean([all(x == -1 for x in ps) for ps in parsed_paths(method, stage, labels)])
        assert methods[method].get("parse_failure", 0.0) == pytest.approx(100 * unparsed)
    assert methods["perm-avg"]["forward_passes_per_item"] == N
    # perm-avg scores each image the same whatever order the item is shown in: exactly.
    by_image: dict[str, list[list[float]]] = {}
    order = dict(zip(records.keys(), records.order.tolist(), strict=True))
    for p in read_predictions(run / "predictions.jsonl"):
        if p.method == "perm-avg":
            scores = np.zeros(N)
            scores[order[(p.item, p.ordering)]] = p.scores
            by_image.setdefault(p.item, []).append(scores.tolist())
    assert all(len(s) == 2 and s[0] == s[1] for s in by_image.values())
    sofa = read_records(run / "sofa_records.jsonl")
    assert {e["sofa_sigma"] for e in sofa.extra} == {0.5}
    assert "Gen. tok" in result.table


@pytest.mark.parametrize("scheme_name", ["digits", "roman"])
def test_sofa_at_sigma_zero_is_vanilla_and_changes_the_logits_otherwise(
    model_path, bench, scheme_name
):
    from lad.data.items import read_items

    backend = load_backend(model_path, device="cpu", dtype="float32")
    requests = [(it, 0, [2, 0, 1]) for it in read_items(bench[0])]
    # roman: multi-token labels, so the label decoding steps run on the SoFA prompt's cache.
    scheme = get_scheme(scheme_name)
    vanilla = list(backend.records(requests, scheme=scheme, batch_size=2))
    with sofa_applied(backend, SofaOptions(0.0)):
        zero = list(backend.records(requests, scheme=scheme, batch_size=2))
    with sofa_applied(backend, SofaOptions(1.0, within_image=True)):
        opened = list(backend.records(requests, scheme=scheme, batch_size=2))
    for v, z in zip(vanilla, zero, strict=True):
        if scheme_name == "digits":  # one softmax at the prompt's end: the very same computation
            assert v.logprobs == z.logprobs and v.attention == z.attention
        else:  # vanilla may score the label paths inside the prompt's forward instead
            np.testing.assert_allclose(v.logprobs, z.logprobs, atol=1e-7, rtol=0)
            np.testing.assert_allclose(v.attention, z.attention, atol=1e-7, rtol=0)
    changed = max(
        np.abs(np.subtract(v.logprobs, o.logprobs)).max()
        for v, o in zip(vanilla, opened, strict=True)
    )
    # Gemma3's tiny model only has sliding-window layers narrower than the prompt.
    assert changed > 1e-5 or backend.arch.name == "Gemma3"
    assert backend.model.config.get_text_config()._attn_implementation == "lad_capture"


# ----------------------------------------------------------------------------- generation


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> list[Path]:
    from PIL import Image

    folder = tmp_path_factory.mktemp("images")
    rng = np.random.default_rng(0)
    paths = []
    for i in range(4):
        path = folder / f"img{i}.png"
        Image.fromarray((rng.random((30, 40 + 7 * i, 3)) * 255).astype("uint8")).save(path)
        paths.append(path)
    return paths


def _requests(images: list[Path]) -> list[tuple[Item, int, list[int]]]:
    items = [Item("a", "red circle", images, 1), Item("b", "a blue star on the left", images, 2)]
    return [(items[0], 0, [2, 0, 1, 3]), (items[1], 1, [3, 1, 0, 2])]


@pytest.mark.parametrize("arch", ["llava", "qwen2_vl"])
@pytest.mark.parametrize("scheme_name", ["digits", "roman"])
def test_greedy_replies_equal_transformers_generate(arch, scheme_name, images, tmp_path):
    backend = load_backend(str(build_tiny_model(arch, tmp_path / arch)), device="cpu")
    scheme = get_scheme(scheme_name)
    requests = _requests(images)
    options = GenerationOptions(max_new_tokens=5)
    batched = list(
        generation_records(
            backend, requests, template="cot", scheme=scheme, options=options, batch_size=2
        )
    )
    plain = list(backend.records(requests, template="cot", scheme=scheme, batch_size=2))
    stops = sorted(stop_tokens(backend))
    for req, rec, ref in zip(requests, batched, plain, strict=True):
        assert rec.logprobs == pytest.approx(ref.logprobs, abs=1e-6)  # the same prompt pass
        texts, imgs = backend.build_prompts([req], "cot", scheme)
        inputs, _ = backend.encode([req], texts, imgs)
        out = backend.model.generate(
            **inputs, do_sample=False, max_new_tokens=5, eos_token_id=stops, pad_token_id=stops[0]
        )
        tokens = [t for t in out[0, inputs["input_ids"].shape[1] :].tolist() if t not in stops]
        expected = backend.processor.tokenizer.decode(tokens, skip_special_tokens=True)
        assert rec.extra["replies"] == [expected]


def test_sampled_paths_are_seeded_per_record(images, tmp_path):
    backend = load_backend(str(build_tiny_model("llava", tmp_path / "m")), device="cpu")
    scheme = get_scheme("digits")
    requests = _requests(images)

    def replies(batch_size: int, seed: int) -> list[list[str]]:
        options = GenerationOptions(
            max_new_tokens=4, samples=3, temperature=0.7, top_k=40, seed=seed
        )
        recs = generation_records(
            backend,
            requests,
            template="self-consistency",
            scheme=scheme,
            options=options,
            batch_size=batch_size,
        )
        return [r.extra["replies"] for r in recs]

    one, two = replies(1, 0), replies(2, 0)
    assert one == two  # independent of batching, so resume and sharding give the same replies
    assert one != replies(2, 1)
    assert all(len(set(paths)) > 1 for paths in one)  # the paths differ from each other


def test_generation_refuses_a_batch_size_below_one(images, tmp_path):
    """As Backend.records does: 0 used to put each run of one N in a single batch."""
    backend = load_backend(str(build_tiny_model("llava", tmp_path / "m")), device="cpu")
    options = GenerationOptions(max_new_tokens=2)
    for size in (0, -1):
        records = generation_records(
            backend,
            _requests(images),
            template="instruction",
            scheme=get_scheme("digits"),
            options=options,
            batch_size=size,
        )
        with pytest.raises(BackendError, match="'batch_size' parameter must be >= 1"):
            next(records)


def test_generation_options_are_checked():
    with pytest.raises(BackendError, match="temperature > 0"):
        GenerationOptions(samples=3)
    with pytest.raises(BackendError, match="max_new_tokens"):
        GenerationOptions(max_new_tokens=0)


# ----------------------------------------------------------------------------- SoFA mask


def _direct_mask(
    ids: torch.Tensor, pad: torch.Tensor, sigma: float, within: bool, q: range, kv: range
) -> torch.Tensor:
    """The SoFA mask entry by entry: 0 attend, log σ a later image token, min blocked."""
    blocked = torch.finfo(torch.float32).min
    out = torch.full((ids.shape[0], 1, len(q), len(kv)), blocked)
    for b in range(ids.shape[0]):
        for i, qp in enumerate(q):
            for j, kp in enumerate(kv):
                img_q = int(ids[b, qp]) if qp < ids.shape[1] else -1
                img_k = int(ids[b, kp]) if kp < ids.shape[1] else -1
                if kp <= qp and pad[b, kp]:
                    out[b, 0, i, j] = 0.0
                elif img_q >= 0 and img_k >= 0 and kp > qp and (within or img_q != img_k):
                    out[b, 0, i, j] = math.log(sigma) if sigma > 0 else blocked
    return out


@pytest.mark.parametrize("sigma", [0.0, 0.3, 1.0])
@pytest.mark.parametrize("within", [False, True])
def test_sofa_mask_entries_equal_a_direct_computation(sigma, within):
    # Two prompts of 9 tokens, the first left padded by 2: text, image 0 (3 tokens), text,
    # image 1 (2 tokens), text.
    ids = torch.tensor([[-1, -1, -1, 0, 0, 0, -1, 1, 1], [-1, 0, 0, 0, -1, 1, 1, -1, -1]])
    pad = torch.ones(2, 9, dtype=torch.long)
    pad[0, :2] = 0
    scope = _Scope(ids, SofaOptions(sigma, within))
    _active.append(scope)
    try:
        prefill = sofa_mask(batch_size=2, q_length=9, kv_length=9, attention_mask=pad.bool())
        step = sofa_mask(
            batch_size=2,
            q_length=2,
            kv_length=11,
            q_offset=9,
            attention_mask=torch.ones(2, 11, dtype=torch.bool),
        )
    finally:
        _active.remove(scope)
    assert prefill.shape == (2, 2, 9, 9)
    causal = _direct_mask(ids, pad, 0.0, within, range(9), range(9))
    torch.testing.assert_close(prefill[:, :1], causal, rtol=0, atol=0)
    expected = _direct_mask(ids, pad, sigma, within, range(9), range(9))
    torch.testing.assert_close(prefill[:, 1:], expected, rtol=0, atol=0)
    # Only entries of a query image token on a later image token may differ from causal.
    differs = (prefill[:, 1] != prefill[:, 0]).nonzero().tolist()
    assert all(ids[b, q] >= 0 and ids[b, k] >= 0 and k > q for b, q, k in differs)
    assert len(differs) == (0 if sigma == 0 else (20 if within else 12))
    # Decoding steps (queries after the prompt) keep the causal mask in both halves.
    assert torch.equal(step[:, 0], step[:, 1])


def test_sofa_errors_instead_of_a_silent_no_op(images, tmp_path):
    backend = load_backend(str(build_tiny_model("llava", tmp_path / "m")), device="cpu")
    plain = torch.zeros(1, 1, 4, 4)
    layer = backend.model.model.language_model.layers[0].self_attn
    q = torch.zeros(1, 4, 4, 8)
    with pytest.raises(BackendError, match="did not receive lad's SoFA mask"):
        sofa_attention(layer, q, q[:, :2], q[:, :2], plain)
    backend.model.set_attn_implementation({"text_config": "sdpa"})
    with (
        pytest.raises(BackendError, match="needs the language model on lad's attention"),
        sofa_applied(backend, SofaOptions(0.5)),
    ):
        pass
    with pytest.raises(BackendError, match=r"\[0, 1\]"):
        SofaOptions(1.5)


def test_sofa_sigma_auto_picks_from_the_grid(bench, tmp_path):
    model = str(build_tiny_model("llava", tmp_path / "m", words=shapes_vocabulary()))
    run = tmp_path / "run"
    config = _config(model, bench, methods=("vanilla", "sofa"), sofa_sigma="auto", num_shuffles=1)
    evaluate(config, run)
    choice = json.loads((run / "sofa.json").read_text())
    assert choice["sigma"] in choice["grid"]
    best = max(choice["accuracy"])
    assert choice["accuracy"][choice["grid"].index(choice["sigma"])] == best
    sofa = read_records(run / "sofa_records.jsonl")
    assert {e["sofa_sigma"] for e in sofa.extra} == {choice["sigma"]}
    with pytest.raises(RunError, match="sofa-sigma"):
        _config(model, bench, sofa_sigma=2.0)


def test_generation_methods_are_listed_with_their_stage():
    for name in ("instruction", "cot", "self-consistency", "sofa"):
        assert METHODS[name].stage == name
