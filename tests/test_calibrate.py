import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lad.core.calibrate import (
    ATTENTION_FLOOR,
    Calibration,
    Fingerprint,
    check_symmetrised,
    log_softmax,
)
from lad.core.records import RecordSet
from lad.errors import CalibrationError
from tests.synthetic import SyntheticModel

# A 3×3 case of Eqs. 1, 4, 5 and 7 worked by hand. Two items, answer image 0, each under the
# 3 cyclic shifts s (order[p] = (p + s) mod 3), so the answer sits at position (−s) mod 3:
# s = 0 -> 0, s = 1 -> 2, s = 2 -> 1. P(c_j|x) per (item, answer position):
PROBS = {
    ("a", 0): [0.5, 0.25, 0.25],
    ("a", 1): [0.1, 0.8, 0.1],
    ("a", 2): [0.2, 0.2, 0.6],
    ("b", 0): [0.3, 0.35, 0.35],
    ("b", 1): [0.3, 0.6, 0.1],
    ("b", 2): [0.4, 0.2, 0.4],
}
# Eq. 1, the mean over the two items per answer position i:
#   P̂_obs(·|0) = [0.4, 0.3, 0.3],  P̂_obs(·|1) = [0.2, 0.7, 0.1],  P̂_obs(·|2) = [0.3, 0.2, 0.5]
OBS = [[0.4, 0.3, 0.3], [0.2, 0.7, 0.1], [0.3, 0.2, 0.5]]
# Eq. 4: ratios P̂_obs(i|i)/P̂_obs(j|i): row 0: 0.4/0.3; row 1: 0.7/0.1 = 7; row 2: 0.5/0.2.
GAMMA = 7.0
# Eq. 5: divide the diagonal by γ̂: 0.4/7, 0.7/7 = 0.1, 0.5/7.
BIAS = [[0.4 / 7, 0.3, 0.3], [0.2, 0.1, 0.1], [0.3, 0.2, 0.5 / 7]]
# Attention (L = 2): layer 0 is position p's value 0.1·(p + 1) + 0.1·s; layer 1 is 0.5 on the
# answer position, 0 elsewhere. Eq. 7 averages the 6 prompts: layer 0 = [0.2, 0.3, 0.4];
# layer 1: the answer visits every position once per item, so 0.5/3 everywhere.
PRIOR = [[0.2, 0.3, 0.4], [0.5 / 3] * 3]


def hand_records() -> RecordSet:
    rows = []
    for item in ("a", "b"):
        for s in range(3):
            answer = (-s) % 3
            attention = [[0.1 * (p + 1) + 0.1 * s for p in range(3)], [0.0] * 3]
            attention[1][answer] = 0.5
            rows.append((item, s, [(p + s) % 3 for p in range(3)], answer, attention))
    return RecordSet(
        items=np.array([r[0] for r in rows]),
        ordering=np.array([r[1] for r in rows]),
        order=np.array([r[2] for r in rows]),
        answer=np.array([r[3] for r in rows]),
        logprobs=np.log([PROBS[(r[0], r[3])] for r in rows]),
        attention=np.array([r[4] for r in rows]),
        extra=[{} for _ in rows],
    )


def test_hand_computed_3x3():
    cal = Calibration().fit(hand_records())
    np.testing.assert_allclose(np.exp(cal.log_obs), OBS)
    assert cal.gamma == pytest.approx(GAMMA)
    np.testing.assert_allclose(np.exp(cal.log_bias), BIAS)
    np.testing.assert_allclose(cal.attention_prior, PRIOR)
    # PriDe: log-softmax of the mean over all 6 prompts of log P(c_j|x).
    mean_log = np.mean(np.log(list(PROBS.values())), axis=0)
    expected = mean_log - math.log(np.exp(mean_log).sum())
    np.testing.assert_allclose(cal.pride_log_prior, expected)
    assert (cal.num_items, cal.num_candidates, cal.num_layers) == (2, 3, 2)


def test_logit_variant_of_eq1_averages_log_probs():
    cal = Calibration(obs_mean="logit").fit(hand_records())
    # Row 0: geometric means of [0.5, 0.3], [0.25, 0.35], [0.25, 0.35], renormalised.
    g = np.array([math.sqrt(0.5 * 0.3), math.sqrt(0.25 * 0.35), math.sqrt(0.25 * 0.35)])
    np.testing.assert_allclose(np.exp(cal.log_obs[0]), g / g.sum())


def test_gamma_is_at_least_one_when_the_answer_is_never_favoured():
    records = hand_records()
    records.logprobs[:] = np.log([0.1, 0.45, 0.45])  # P(i|i) <= P(j|i) in rows 0, 1 or 2
    records.logprobs[records.answer == 1] = np.log([0.45, 0.1, 0.45])
    records.logprobs[records.answer == 2] = np.log([0.45, 0.45, 0.1])
    cal = Calibration().fit(records)
    assert cal.gamma == 1.0
    np.testing.assert_allclose(cal.log_bias, cal.log_obs)


def test_fitting_twice_gives_the_same_result():
    records = SyntheticModel(num_candidates=4).calibration_records(5)
    a, b = Calibration().fit(records), Calibration().fit(records)
    assert a.to_dict() == b.to_dict()


def test_save_and_load(tmp_path):
    cal = Calibration().fit(
        hand_records(), Fingerprint(model="m", labels=["1", "2", "3"], prompt_sha256="x")
    )
    cal.save(tmp_path / "calibration.json")
    obj = json.loads((tmp_path / "calibration.json").read_text())
    assert obj["format"] == "lad-calibration/1"
    for key in ("model", "num_candidates", "labels", "prompt_sha256", "num_items", "num_layers",
                "log_obs", "gamma", "log_bias", "attention_prior", "pride_log_prior"):  # fmt: skip
        assert key in obj
    back = Calibration.load(tmp_path / "calibration.json")
    assert back.to_dict() == cal.to_dict()


def test_load_refuses_other_formats(tmp_path):
    path = tmp_path / "calibration.json"
    path.write_text(json.dumps({"format": "lad-calibration/0"}))
    with pytest.raises(CalibrationError, match="expected format 'lad-calibration/1'"):
        Calibration.load(path)
    obj = Calibration().fit(hand_records()).to_dict()
    obj["log_bias"] = [[0.0] * 2] * 3
    path.write_text(json.dumps(obj))
    with pytest.raises(CalibrationError, match=r"'log_bias' must have shape \(3, 3\)"):
        Calibration.load(path)


def test_missing_shift_is_named():
    records = hand_records()
    partial = records.select(~((records.items == "b") & (records.ordering == 2)))
    with pytest.raises(CalibrationError, match="item 'b' lacks cyclic shift 2"):
        Calibration().fit(partial)
    Calibration().fit(partial, allow_partial=True)  # accepted when asked


def test_inconsistent_shift_is_named():
    records = hand_records()
    records.order[4] = [2, 1, 0]  # item b, shift 1 should be [1, 2, 0]
    records.answer[4] = 2
    with pytest.raises(CalibrationError, match="item 'b', shift 1: order"):
        Calibration().fit(records)


def test_shift_out_of_range_and_missing_answer_position():
    records = hand_records()
    records.ordering[0] = 7
    with pytest.raises(CalibrationError, match="ordering 7"):
        Calibration().fit(records)
    only_shift_0 = hand_records().select(hand_records().ordering == 0)
    with pytest.raises(
        CalibrationError, match="no calibration record has its answer at position 1"
    ):
        Calibration().fit(only_shift_0, allow_partial=True)


def test_nan_is_refused():
    records = hand_records()
    records.attention[2, 0, 1] = np.nan
    with pytest.raises(CalibrationError, match="NaN"):
        Calibration().fit(records)


def test_unfitted_and_incompatible():
    with pytest.raises(CalibrationError, match="not fitted yet"):
        Calibration().check_compatible(hand_records())
    cal = Calibration().fit(hand_records(), Fingerprint(model="m", labels=["1", "2", "3"]))
    other_n = SyntheticModel(num_candidates=4, num_layers=2).eval_records(1, 1)
    with pytest.raises(CalibrationError, match="N = 3 candidates but the records have N = 4"):
        cal.check_compatible(other_n)
    other_l = SyntheticModel(num_candidates=3, num_layers=5).eval_records(1, 1)
    with pytest.raises(CalibrationError, match="L = 2 attention layers"):
        cal.check_compatible(other_l)
    with pytest.raises(CalibrationError, match="model is 'm' but the records' is 'n'"):
        cal.check_compatible(hand_records(), Fingerprint(model="n"))
    with pytest.raises(CalibrationError, match="labels"):
        cal.check_compatible(hand_records(), Fingerprint(labels=["A", "B", "C"]))
    cal.check_compatible(
        hand_records(), Fingerprint(model="m", prompt_sha256="anything")
    )  # unknown: ok
    with pytest.raises(CalibrationError, match="4 labels given for calibration records with N = 3"):
        Calibration().fit(hand_records(), Fingerprint(labels=["1", "2", "3", "4"]))


def test_symmetrised_check_on_synthetic_sets():
    model = SyntheticModel(num_candidates=5)
    check_symmetrised(model.calibration_records(3))
    with pytest.raises(CalibrationError, match="lacks cyclic shift"):
        check_symmetrised(model.calibration_records(3).select(np.arange(14)))


@st.composite
def calibration_sets(draw):
    n = draw(st.integers(2, 5))
    items = draw(st.integers(1, 3))
    layers = draw(st.integers(1, 3))
    rows = items * n
    finite = st.floats(-60, 60, allow_nan=False)
    logits = np.array(draw(st.lists(finite, min_size=rows * n, max_size=rows * n)))
    logits = logits.reshape(rows, n)
    tiny = st.sampled_from([0.0, ATTENTION_FLOOR / 10, 1e-300, 0.3, 1.0])
    size = rows * layers * n
    attention = np.array(draw(st.lists(tiny, min_size=size, max_size=size)))
    shift = np.tile(np.arange(n), items)
    return RecordSet(
        items=np.repeat([f"i{k}" for k in range(items)], n),
        ordering=shift,
        order=(np.arange(n)[None, :] + shift[:, None]) % n,
        answer=(-shift) % n,
        logprobs=log_softmax(logits, axis=1),
        attention=attention.reshape(rows, layers, n),
        extra=[{}] * rows,
    )


@settings(max_examples=60, deadline=None)
@given(calibration_sets())
def test_property_gamma_at_least_one_and_bias_well_defined(records):
    cal = Calibration().fit(records)
    assert cal.gamma >= 1 and math.isfinite(cal.gamma)
    assert np.isfinite(cal.log_bias).all() and np.isfinite(cal.log_obs).all()
    assert np.isfinite(cal.pride_log_prior).all() and np.isfinite(cal.attention_prior).all()
    # Eq. 5 only lowers the diagonal: P̂_bias(i|i) <= P̂_obs(i|i), off-diagonal unchanged.
    off = ~np.eye(records.num_candidates, dtype=bool)
    np.testing.assert_array_equal(cal.log_bias[off], cal.log_obs[off])
    assert (np.diag(cal.log_bias) <= np.diag(cal.log_obs)).all()
    np.testing.assert_allclose(np.exp(cal.log_obs).sum(axis=1), 1.0)


# ------------------------------------------------------------------ preprocessing (chat, pictures)

NATIVE = {"chat_template_sha256": None, "image_size": None, "image_options": {}}
AT_336 = {"chat_template_sha256": None, "image_size": 336, "image_options": {}}


def test_preprocessing_is_saved_and_a_difference_is_refused_naming_the_flag(tmp_path):
    cal = Calibration().fit(hand_records(), Fingerprint(model="m", preprocessing=AT_336))
    cal.save(tmp_path / "c.json")
    obj = json.loads((tmp_path / "c.json").read_text())
    assert obj["preprocessing"] == {"chat_template_sha256": None, "image_size": 336,
                                    "image_options": {}}  # fmt: skip
    back = Calibration.load(tmp_path / "c.json")
    back.check_compatible(hand_records(), Fingerprint(preprocessing=dict(AT_336)))
    with pytest.raises(
        CalibrationError,
        match=r"fitted on records made with --image-size 336, but these records are made with "
        r"no --image-size \(pictures as they are\); recalibrate with the same --image-size, or "
        r"skip this check on purpose \(check_calibration=False\)",
    ):
        back.check_compatible(hand_records(), Fingerprint(preprocessing=NATIVE))
    back.check_compatible(
        hand_records(), Fingerprint(preprocessing=NATIVE), strict=False
    )  # the override
    mine = {**NATIVE, "chat_template_sha256": "ab" * 32}
    with pytest.raises(
        CalibrationError,
        match=r"made with --chat-template of SHA-256 abababababab\.\.\., but these records are "
        r"made with the checkpoint's own chat template; recalibrate with the same --chat-template",
    ):
        Calibration().fit(hand_records(), Fingerprint(preprocessing=mine)).check_compatible(
            fingerprint=Fingerprint(preprocessing=NATIVE)
        )
    budget = {**NATIVE, "image_options": {"max_pixels": 200704}}
    with pytest.raises(
        CalibrationError,
        match=r'made with image options \{"max_pixels": 200704\}, but these records are made '
        r"with no image options .* the same --max-pixels / --min-pixels / --image-option",
    ):
        Calibration().fit(hand_records(), Fingerprint(preprocessing=budget)).check_compatible(
            fingerprint=Fingerprint(preprocessing=NATIVE)
        )


def test_unknown_preprocessing_is_not_compared(tmp_path):
    # A file from before lad recorded it: no key, accepted whatever the records' preprocessing.
    old = Calibration().fit(hand_records(), Fingerprint(model="m")).to_dict()
    assert "preprocessing" not in old
    (tmp_path / "old.json").write_text(json.dumps(old, indent=1) + "\n")
    cal = Calibration.load(tmp_path / "old.json")
    assert cal.preprocessing is None
    cal.check_compatible(hand_records(), Fingerprint(model="m", preprocessing=AT_336))
    cal.save(tmp_path / "again.json")  # kept as it was: no key added
    assert (tmp_path / "again.json").read_bytes() == (tmp_path / "old.json").read_bytes()
    # A chat template whose fingerprint is unknown on one side (its key absent): not compared.
    without = {"image_size": None, "image_options": {}}
    fitted = Calibration().fit(
        hand_records(), Fingerprint(preprocessing={**NATIVE, "chat_template_sha256": "c" * 64})
    )
    fitted.check_compatible(fingerprint=Fingerprint(preprocessing=without))
    with pytest.raises(CalibrationError, match="--image-size"):
        fitted.check_compatible(
            fingerprint=Fingerprint(preprocessing={**without, "image_size": 448})
        )


@pytest.mark.parametrize(
    "value",
    [
        [],
        {"image_size": "336"},
        {"image_size": 0},
        {"chat_template_sha256": "abc"},
        {"image_options": [1]},
    ],
)
def test_malformed_preprocessing_is_refused(tmp_path, value):
    obj = Calibration().fit(hand_records()).to_dict() | {"preprocessing": value}
    (tmp_path / "c.json").write_text(json.dumps(obj))
    with pytest.raises(CalibrationError, match=r"c\.json: 'preprocessing' must be an object"):
        Calibration.load(tmp_path / "c.json")


def test_run_preprocessing_fingerprints_the_chat_template_file(tmp_path):
    import hashlib

    from lad.run.config import eval_config

    assert eval_config().spec.preprocessing() == NATIVE
    template = tmp_path / "t.jinja"
    template.write_bytes(b"{{ messages }}\n")
    config = eval_config(chat_template=str(template), image_size=336,
                        image_options={"min_pixels": 3136, "max_pixels": 200704})  # fmt: skip
    assert config.spec.preprocessing() == {
        "chat_template_sha256": hashlib.sha256(b"{{ messages }}\n").hexdigest(),
        "image_size": 336,
        "image_options": {"max_pixels": 200704, "min_pixels": 3136},
    }
    # run.json's fingerprint of the file wins (a finished run rescores without the file) ...
    inputs = {"chat_template": {"path": str(template), "sha256": "d" * 64}}
    assert config.spec.preprocessing(inputs)["chat_template_sha256"] == "d" * 64
    # ... and with neither, the template is unknown: its key is left out, so it is not compared.
    template.unlink()
    assert "chat_template_sha256" not in config.spec.preprocessing()
