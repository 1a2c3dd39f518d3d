"""Settings under which the vLLM engine's capture would be wrong or missing are refused, in one
line, before the engine starts (docs/backends.md, "The vLLM engine"); a record never lacks a row."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from lad.backends.vllm_engine import _merged_rows, check_engine_args
from lad.errors import BackendError, RunError
from tests.vllm_fixtures import needs_vllm


@pytest.mark.parametrize(
    ("name", "value", "said"),
    [
        ("enforce_eager", False, "enforce_eager=True"),
        ("enable_prefix_caching", True, "enable_prefix_caching=False"),
        ("compilation_config", {"mode": 3}, "compiled graphs skip"),
        ("logprobs_mode", "processed_logprobs", "raw_logprobs"),
        ("worker_extension_cls", "x.Y", "set by lad"),
    ],
)
def test_engine_arguments_that_break_the_capture(name, value, said) -> None:
    with pytest.raises(BackendError, match=said) as e:
        check_engine_args({name: value})
    assert "\n" not in str(e.value)
    assert check_engine_args({"max_num_seqs": 8}) == {"max_num_seqs": 8}


def test_methods_that_need_the_hf_model() -> None:
    from lad.run.config import EvalConfig

    with pytest.raises(RunError, match="--engine vllm makes records only; --methods sofa"):
        EvalConfig(engine="vllm", methods=("lad", "sofa"))
    with pytest.raises(BackendError, match="--engine must be one of hf, vllm"):
        EvalConfig(engine="tgi")
    assert EvalConfig(engine="vllm").engine == "vllm"


def test_a_missing_layer_row_is_an_error_not_a_record() -> None:
    row = [0.5, 0.5]
    full = [{"rows": {"t": {0: row, 1: row}}, "heads": 2}]
    assert torch.allclose(
        _merged_rows("t", full, 2, "a", 0), torch.tensor([[0.25] * 2] * 2, dtype=torch.float64)
    )
    with pytest.raises(BackendError, match="saw 1 of 2 decoder layers"):
        _merged_rows("t", [{"rows": {"t": {0: row}}, "heads": 2}], 2, "a", 0)


def test_tensor_parallel_shards_merge_into_the_mean_over_all_heads() -> None:
    ranks = [
        {"rows": {"t": {0: [2.0, 0.0]}}, "heads": 2},
        {"rows": {"t": {0: [0.0, 2.0]}}, "heads": 2},
    ]
    assert _merged_rows("t", ranks, 1, "a", 0).tolist() == [[0.5, 0.5]]


def test_keys_the_engine_did_not_compute_are_an_error() -> None:
    """A request whose prefill starts past position 0 with no keys kept (prefix caching, a KV
    connector) is reported, not given a row over part of its prompt."""
    from lad.backends.vllm_capture import ROW, TAG, CaptureWorker, _State

    params = SimpleNamespace(extra_args={TAG: "t", ROW: 9})
    runner = SimpleNamespace(
        input_batch=SimpleNamespace(req_ids=["r"]),
        requests={"r": SimpleNamespace(sampling_params=params)},
    )
    state = _State(runner)
    metadata = SimpleNamespace(query_start_loc=torch.tensor([0, 4]), seq_lens=torch.tensor([10]))
    for slot in state.slots(metadata):
        state._capture(0, slot, torch.randn(4, 2 * 8), torch.randn(4, 8), (2, 1, 8), 0.35)
    worker = CaptureWorker()
    worker._lad_state = state
    taken = worker.lad_take(["t"])
    assert "were not computed" in taken["errors"]["t"][0]
    assert taken["rows"]["t"] == {}


@needs_vllm
@pytest.mark.parametrize(
    ("arch", "said"),
    [("llava", "supports model types qwen2, qwen3"), ("qwen2_vl", "head_dim 8 is not one")],
)
def test_models_the_capture_cannot_see_are_refused_before_the_engine(
    arch: str, said: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import vllm

    from lad.backends.vllm_engine import load_vllm_backend
    from lad.testing.tiny import build_tiny_model

    monkeypatch.setattr(vllm, "LLM", lambda **kw: pytest.fail("the engine started"))
    model = build_tiny_model(arch, tmp_path / arch)
    with pytest.raises(BackendError, match=said) as e:
        load_vllm_backend(str(model))
    assert "\n" not in str(e.value)
    with pytest.raises(BackendError, match="repetition penalty"):
        load_vllm_backend(str(model), repetition_penalty=1.2)


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed")
def test_lad_serve_without_vllm_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """The server (uvicorn, a vLLM dependency) is imported only once vLLM was found: without
    it, `lad serve` says what to install, in one line, not a ModuleNotFoundError."""
    from lad.cli import main
    from lad.core.calibrate import Calibration
    from tests.test_guarantees import SyntheticModel

    model = SyntheticModel(num_candidates=4, num_layers=6)
    Calibration().fit(model.calibration_records(2)).save(tmp_path / "cal.json")
    assert main(["serve", "--model", "demo", "--calibration", str(tmp_path / "cal.json")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("Error: --engine vllm needs vLLM"), err
