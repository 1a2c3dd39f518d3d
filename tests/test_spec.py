"""RecordSpec, EvalConfig's record fields, presets in the library, and Debiaser(spec, options)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lad import Debiaser
from lad.core.labels import get_scheme
from lad.core.methods import MethodOptions
from lad.core.prompts import OFFICIAL, QUESTION, prompt_sha256
from lad.errors import LadError
from lad.run.config import RECORD_FIELDS, eval_config
from lad.run.presets import OFFICIAL as OFFICIAL_PRESET
from lad.run.spec import RecordSpec

FIXTURE_RUN = Path(__file__).parent / "data" / "run-d76e89a" / "partial" / "run.json"


def test_record_fields_are_the_arguments_run_json_has_always_held():
    stored = json.loads(FIXTURE_RUN.read_text())["arguments"]
    # Added since d76e89a: a run.json without them reads them as their defaults (check_same).
    added = {"engine": "hf", "trust_remote_code": False}
    assert set(RECORD_FIELDS) == set(stored) | set(added)
    assert eval_config().identity() == {**stored, **added, "items": None, "num_shuffles": 5,
                                       "calibration_items": None, "batch_size": 4}  # fmt: skip


def test_the_fingerprint_is_computed_in_one_place():
    spec = RecordSpec(model="m", labels="upper", prompt_template=QUESTION.text, image_size=336)
    got = spec.fingerprint(4)
    assert got.model == "m" and got.labels == ("A", "B", "C", "D")
    assert got.prompt_sha256 == prompt_sha256(QUESTION, get_scheme("upper"), 4)
    assert got.preprocessing == {
        "chat_template_sha256": None,
        "image_size": 336,
        "image_options": {},
    }
    assert eval_config(model="m", labels="upper", image_size=336,
                      prompt_template=QUESTION.text).spec == spec  # fmt: skip


def test_a_preset_gives_defaults_that_stated_options_override():
    official = eval_config("official")
    for name, value in OFFICIAL_PRESET.items():
        assert getattr(official, name) == value, name
    stated = eval_config("official", obs_mean="prob", image_size=None, calibration_data="c.jsonl")
    assert stated.obs_mean == "prob" and stated.image_size == 336  # None: not stated
    assert stated.calibrate_on == "held-out"  # a stated calibration source wins over the preset
    with pytest.raises(LadError, match="'preset' parameter must be one of"):
        eval_config("nosuch")


def test_debiaser_takes_a_spec_options_and_a_preset_and_clones():
    spec = RecordSpec(model="demo", labels="upper")
    d = Debiaser(spec, MethodOptions(top_k=1), device="cpu", batch_size=2)
    assert d.spec == spec and d.options.top_k == 1 and d.labels == "upper"
    twin = d.clone()
    assert twin is not d and twin.spec == d.spec and twin.options == d.options
    assert twin.batch_size == 2 and twin._backend is d._backend
    official = Debiaser("demo", preset="official", tau=3.0)
    assert official.spec.prompt_template == OFFICIAL.text and official.spec.image_size == 336
    assert official.options.obs_mean == "logit" and official.options.tau == 3.0
    with pytest.raises(LadError, match="unexpected setting 'taus'"):
        Debiaser("demo", taus=1)
