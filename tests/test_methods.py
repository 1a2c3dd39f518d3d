import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lad.core.calibrate import Calibration
from lad.core.methods import (
    METHODS,
    MethodOptions,
    lad_posterior,
    log_mixture_prior,
    predict,
    score,
    selected_layers,
)
from lad.core.metrics import compute_metrics
from lad.core.records import RecordSet
from lad.errors import CalibrationError, LadError, RecordError
from tests.synthetic import SyntheticModel

# A 3×3 case of Eqs. 8-14 worked by hand (N = 3 candidates, L = 3 layers, one record).
# Attention per layer, and its sum S (Eq. 8):
#   layer 0: [0.05, 0.03, 0.02]  S = 0.1
#   layer 1: [0.2,  0.2,  0.2 ]  S = 0.6
#   layer 2: [0.05, 0.2,  0.05]  S = 0.3     -> L* = {1, 2} for K = 2 (Eq. 9)
# Attention prior: layer 1 [0.4, 0.1, 0.1], layer 2 [0.1, 0.1, 0.1] (layer 0 unused).
# a / prior: layer 1 [0.5, 2, 2], layer 2 [0.5, 2, 0.5]; Eq. 11 averages their logs:
#   log π̃ = [log 0.5, log 2, 0]  ->  with τ = 1, π = [0.5, 2, 1] / 3.5 = [1/7, 4/7, 2/7] (Eq. 12)
# P̂_bias(j|k), rows k:  [0.1, 0.6, 0.3], [0.2, 0.2, 0.6], [0.5, 0.25, 0.25]
# Eq. 13: P_prior = 1/7·row0 + 4/7·row1 + 2/7·row2 = [1.9, 1.9, 3.2] / 7
# P(c_j|x) = [0.25, 0.35, 0.4]; Eq. 14: score = log(P / P_prior)
#   = log [0.25·7/1.9, 0.35·7/1.9, 0.4·7/3.2] = log [0.921, 1.289, 0.875]  -> LAD picks 1,
#   vanilla picks 2.
ATTENTION = [[0.05, 0.03, 0.02], [0.2, 0.2, 0.2], [0.05, 0.2, 0.05]]
PRIOR = [[0.3, 0.3, 0.3], [0.4, 0.1, 0.1], [0.1, 0.1, 0.1]]
BIAS = [[0.1, 0.6, 0.3], [0.2, 0.2, 0.6], [0.5, 0.25, 0.25]]
PROBS = [0.25, 0.35, 0.4]
PI = [1 / 7, 4 / 7, 2 / 7]
P_PRIOR = [1.9 / 7, 1.9 / 7, 3.2 / 7]


def one_record(attention=ATTENTION, probs=PROBS) -> RecordSet:
    return RecordSet(
        items=np.array(["x"]),
        ordering=np.array([0]),
        order=np.array([[0, 1, 2]]),
        answer=np.array([1]),
        logprobs=np.log([probs]),
        attention=np.array([attention], dtype=float),
        extra=[{}],
    )


def hand_calibration() -> Calibration:
    return Calibration.from_arrays(np.log(BIAS), PRIOR, pride_log_prior=np.log([0.2, 0.3, 0.5]))


TAU1 = MethodOptions(tau=1.0)


def test_hand_computed_eqs_8_to_14():
    records, cal = one_record(), hand_calibration()
    assert selected_layers(records, TAU1).tolist() == [[1, 2]]
    np.testing.assert_allclose(lad_posterior(records, cal, TAU1), [PI])
    np.testing.assert_allclose(np.exp(log_mixture_prior(records, cal, TAU1)), [P_PRIOR])
    expected = np.log(np.array(PROBS) / np.array(P_PRIOR))
    np.testing.assert_allclose(score("lad", records, cal, TAU1), [expected])
    assert predict("lad", records, cal, TAU1).tolist() == [1]
    assert predict("vanilla", records, cal, TAU1).tolist() == [2]


def test_hand_computed_readouts_and_pride():
    records, cal = one_record(), hand_calibration()
    # Raw attention readout: mean over L* = {1, 2} of log a = log [0.1, 0.2, 0.1].
    np.testing.assert_allclose(score("attn", records, cal, TAU1), np.log([[0.1, 0.2, 0.1]]))
    np.testing.assert_allclose(score("attn-purified", records, cal, TAU1), np.log([PI]))
    # PriDe: log P − log p_prior = log [0.25/0.2, 0.35/0.3, 0.4/0.5].
    np.testing.assert_allclose(score("pride", records, cal), np.log([[1.25, 0.35 / 0.3, 0.8]]))
    np.testing.assert_allclose(score("vanilla", records), np.log([PROBS]))


def test_tau_sharpens_the_posterior():
    # τ = 2 squares π̃: [0.25, 4, 1] / 5.25 (Eq. 12).
    pi = lad_posterior(one_record(), hand_calibration(), MethodOptions(tau=2.0))
    np.testing.assert_allclose(pi, [[0.25 / 5.25, 4 / 5.25, 1 / 5.25]])


def test_tau_limits():
    records, cal = one_record(), hand_calibration()
    # τ = 0: π uniform, so P_prior is the mean of P̂_bias's rows = [0.8, 1.05, 1.15] / 3.
    pi0 = lad_posterior(records, cal, MethodOptions(tau=0.0))
    np.testing.assert_allclose(pi0, [[1 / 3] * 3])
    p_prior0 = np.array([0.8, 1.05, 1.15]) / 3
    np.testing.assert_allclose(
        np.exp(log_mixture_prior(records, cal, MethodOptions(tau=0.0))), [p_prior0]
    )
    # τ = ∞: π one-hot at argmax π̃ = position 1, so P_prior = P̂_bias(·|1) = [0.2, 0.2, 0.6].
    inf = MethodOptions(tau=math.inf)
    np.testing.assert_array_equal(lad_posterior(records, cal, inf), [[0.0, 1.0, 0.0]])
    np.testing.assert_allclose(np.exp(log_mixture_prior(records, cal, inf)), [BIAS[1]])
    np.testing.assert_allclose(score("lad", records, cal, inf), np.log([PROBS]) - np.log([BIAS[1]]))
    purified = score("attn-purified", records, cal, inf)
    assert np.isfinite(purified).all() and purified.argmax() == 1 and purified[0, 1] == 0.0
    # ... the limit of large finite τ, also under the log-space mixture.
    for mixture in ("prob", "log"):
        big = score("lad", records, cal, MethodOptions(tau=200.0, mixture=mixture))
        limit = score("lad", records, cal, MethodOptions(tau=math.inf, mixture=mixture))
        np.testing.assert_allclose(big, limit, atol=1e-9)


def test_tau_infinity_splits_ties_evenly():
    # Without the prior and with K = 1 (layer 1 attends [0.2, 0.2, 0.2]): a three-way tie.
    options = MethodOptions(tau=math.inf, use_prior=False, top_k=1)
    np.testing.assert_allclose(lad_posterior(one_record(), None, options), [[1 / 3] * 3])


def test_official_code_variants():
    records, cal = one_record(), hand_calibration()
    # Eq. 13 in log space: Σ_k π_k log P̂_bias(j|k).
    log_mix = MethodOptions(tau=1.0, mixture="log")
    expected = np.array(PI) @ np.log(BIAS)
    np.testing.assert_allclose(log_mixture_prior(records, cal, log_mix), [expected])
    # Eq. 11 on raw attention: log mean_l a − mean_l log prior:
    #   mean a over {1, 2} = [0.125, 0.2, 0.125]; geometric-mean prior = [0.2, 0.1, 0.1]
    #   -> π̃ ∝ [0.625, 2, 1.25]
    raw = MethodOptions(tau=1.0, attn_mean="raw")
    np.testing.assert_allclose(
        lad_posterior(records, cal, raw), [[0.625, 2, 1.25] / np.sum([0.625, 2, 1.25])]
    )


def test_layer_strategies():
    records = one_record()
    assert selected_layers(records, MethodOptions(layers="all")).tolist() == [[0, 1, 2]]
    assert selected_layers(records, MethodOptions(layers=(0, 2))).tolist() == [[0, 2]]
    assert selected_layers(records, MethodOptions(top_k=1)).tolist() == [[1]]
    assert selected_layers(records, MethodOptions(top_k=3)).tolist() == [[1, 2, 0]]
    with pytest.raises(LadError, match=r"top_k 9 is more than the 3 layers of the records"):
        selected_layers(records, MethodOptions(top_k=9))
    assert selected_layers(records, MethodOptions(layer_range=(0, 0))).tolist() == [[0]]
    # A range past the last layer is clipped to the records' layers, as the official code's hooks
    # are (its default 21..35 on a 28-layer model searches 21..27); one starting past them fails.
    assert selected_layers(records, MethodOptions(layer_range=(2, 40))).tolist() == [[2]]
    assert selected_layers(records, MethodOptions(top_k=1, layer_range=(1, 9))).tolist() == [[1]]
    with pytest.raises(LadError, match=r"layer_range \(3, 35\) starts past the last layer"):
        selected_layers(records, MethodOptions(layer_range=(3, 35)))
    with pytest.raises(LadError, match=r"layers \[5\] are out of range"):
        selected_layers(records, MethodOptions(layers=(1, 5)))
    # Without the attention prior, π comes from the raw attention of L*: [0.1, 0.2, 0.1].
    pi = lad_posterior(records, None, MethodOptions(tau=1.0, use_prior=False))
    np.testing.assert_allclose(pi, [[0.25, 0.5, 0.25]])


def test_ties_in_layer_strength_go_to_the_lower_layer():
    attention = [[0.1, 0.1, 0.1], [0.1, 0.1, 0.1], [0.2, 0.05, 0.05]]
    assert selected_layers(one_record(attention), MethodOptions(top_k=2)).tolist() == [[0, 1]]


@pytest.mark.parametrize("method", [m for m in METHODS if METHODS[m].parse is None])
def test_zero_and_tiny_attention_give_finite_scores(method):
    zero = np.zeros((3, 3))
    zero[1, 2] = 1e-300
    records = one_record(attention=zero)
    cal = Calibration.from_arrays(np.log(BIAS), np.zeros((3, 3)))
    perm = _cyclic(records)
    scores = score(method, records, cal, MethodOptions(tau=50.0), perm_records=perm)
    assert np.isfinite(scores).all()


def _cyclic(records: RecordSet) -> RecordSet:
    """The items of `records` under all N cyclic shifts of the identity, with fixed log-probs."""
    n = records.num_candidates
    shift = np.arange(n)
    order = (np.arange(n)[None, :] + shift[:, None]) % n
    return RecordSet(
        items=np.repeat(records.items[:1], n),
        ordering=shift,
        order=order,
        answer=np.argmax(order == 1, axis=1),
        logprobs=np.log(np.full((n, n), 1 / n)),
        attention=np.ones((n, records.num_layers, n)),
        extra=[{}] * n,
    )


def test_perm_avg_hand_computed():
    # Item x, N = 3, shifts s: order_s = [(p + s) mod 3]. log-probs by position, per shift:
    #   s=0 order [0,1,2]: [l00, l01, l02]; s=1 order [1,2,0]; s=2 order [2,0,1].
    perm = _cyclic(one_record())
    perm.logprobs = np.log([[0.5, 0.3, 0.2], [0.6, 0.1, 0.3], [0.2, 0.2, 0.6]])
    # image 0 sits at p=0 (s=0), p=2 (s=1), p=1 (s=2): mean log [0.5, 0.3, 0.2]
    # image 1: p=1 (s=0), p=0 (s=1), p=2 (s=2): mean log [0.3, 0.6, 0.6]
    # image 2: p=2 (s=0), p=1 (s=1), p=0 (s=2): mean log [0.2, 0.1, 0.2]
    by_image = np.log([0.5 * 0.3 * 0.2, 0.3 * 0.6 * 0.6, 0.2 * 0.1 * 0.2]) / 3
    records = one_record()
    records.order[0] = [2, 0, 1]
    records.answer[0] = 2
    np.testing.assert_allclose(score("perm-avg", records, perm_records=perm), [by_image[[2, 0, 1]]])
    assert predict("perm-avg", records, perm_records=perm).tolist() == [2]  # image 1


def test_perm_avg_is_invariant_to_the_input_order():
    model = SyntheticModel(num_candidates=5)
    records, perm = model.eval_records(30, num_shuffles=4), model.perm_records(30)
    chosen = predict("perm-avg", records, perm_records=perm)
    image = np.take_along_axis(records.order, chosen[:, None], 1)[:, 0].reshape(30, 4)
    assert (image == image[:, :1]).all()
    assert compute_metrics(records, {"perm-avg": chosen})["methods"]["perm-avg"]["cons"] == 100


def test_perm_avg_errors():
    model = SyntheticModel(num_candidates=4)
    records = model.eval_records(3, num_shuffles=2)
    with pytest.raises(LadError, match="perm-avg needs the records of its cyclic shifts"):
        score("perm-avg", records)
    with pytest.raises(RecordError, match="perm-avg records lack item 'item-00002'"):
        score("perm-avg", records, perm_records=model.perm_records(2))
    with pytest.raises(CalibrationError, match="perm-avg records: item 'item-00001' lacks"):
        score("perm-avg", records, perm_records=model.perm_records(3).select(np.arange(7)))
    other = model.perm_records(3)  # other items under the same ids: the next image is answered
    other.answer = (other.answer + 1) % 4
    with pytest.raises(RecordError, match="item 'item-00000' answer another image"):
        score("perm-avg", records, perm_records=other)


def test_errors_are_clear():
    records = one_record()
    with pytest.raises(LadError, match="Unknown method 'ours'"):
        score("ours", records)
    with pytest.raises(CalibrationError, match="comes from a calibration"):
        score("lad", records)
    with pytest.raises(
        CalibrationError, match=r"fitted with obs_mean 'prob' \(Eq. 1\), not 'logit'"
    ):
        score("lad", records, hand_calibration(), MethodOptions(obs_mean="logit"))
    bad_options = ({"tau": -1.0}, {"tau": math.nan}, {"tau": "5"}, {"top_k": 0}, {"layers": "x"})
    for bad in (*bad_options, {"mixture": "geo"}):
        with pytest.raises(LadError, match="parameter must"):
            MethodOptions(**bad)
    wrong_n = SyntheticModel(num_candidates=4, num_layers=3).eval_records(1, 1)
    with pytest.raises(CalibrationError, match="N = 3 candidates"):
        score("pride", wrong_n, hand_calibration())


def _accuracy(records, calibration, method):
    preds = predict(method, records, calibration, perm_records=None)
    return 100 * float(np.mean(preds == records.answer))


@pytest.mark.parametrize("num_candidates", [4, 8])
def test_lad_beats_vanilla_and_pride_under_conditional_bias(num_candidates):
    model = SyntheticModel(num_candidates=num_candidates, bias="conditional", seed=1)
    records = model.eval_records(300, num_shuffles=5)
    cal = Calibration().fit(model.calibration_records(5))
    acc = {m: _accuracy(records, cal, m) for m in ("vanilla", "pride", "lad", "attn-purified")}
    for better in ("lad", "attn-purified"):
        for worse in ("vanilla", "pride"):
            assert acc[better] > acc[worse] + 10, acc


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("num_candidates", [4, 8])
def test_lad_matches_vanilla_without_bias(num_candidates, seed):
    # 20 calibration items: with 5, the calibration's sampling noise alone moves LAD by up to
    # ~1.8 points either way on this generator (seen over 12 seeds); with 20, by under 0.8.
    model = SyntheticModel(num_candidates=num_candidates, bias="none", seed=seed)
    records = model.eval_records(400, num_shuffles=5)
    cal = Calibration().fit(model.calibration_records(20))
    assert abs(_accuracy(records, cal, "lad") - _accuracy(records, cal, "vanilla")) <= 1.0


@st.composite
def scored_records(draw):
    n = draw(st.integers(2, 5))
    layers = draw(st.integers(1, 4))
    r = draw(st.integers(1, 6))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    logits = rng.normal(scale=3, size=(r, n))
    records = RecordSet(
        items=np.array([f"i{k}" for k in range(r)]),
        ordering=np.zeros(r, dtype=np.int64),
        order=np.tile(np.arange(n), (r, 1)),
        answer=np.zeros(r, dtype=np.int64),
        logprobs=logits - np.log(np.exp(logits).sum(1, keepdims=True)),
        attention=rng.uniform(0, 1, size=(r, layers, n)) ** 3,
        extra=[{}] * r,
    )
    log_bias = np.log(rng.dirichlet(np.ones(n), size=n))
    prior = rng.uniform(0.01, 1, size=(layers, n))
    options = MethodOptions(
        top_k=draw(st.integers(1, min(3, layers))),
        tau=draw(st.sampled_from([0.0, 1.0, 5.0, 20.0])),
        mixture=draw(st.sampled_from(["prob", "log"])),
        attn_mean=draw(st.sampled_from(["log", "raw"])),
    )
    return records, Calibration.from_arrays(log_bias, prior), options, rng.permutation(n)


@settings(max_examples=60, deadline=None)
@given(scored_records())
def test_property_zero_bias_and_uniform_prior_is_vanilla(case):
    records, cal, options, _ = case
    n = records.num_candidates
    flat = Calibration.from_arrays(np.zeros((n, n)), np.full_like(cal.attention_prior, 0.2))
    np.testing.assert_allclose(score("lad", records, flat, options), records.logprobs, atol=1e-9)


@settings(max_examples=60, deadline=None)
@given(scored_records())
def test_property_relabelling_positions_permutes_scores(case):
    records, cal, options, sigma = case
    # Show position sigma[p] at p: logprobs and attention move with it, and so does a
    # calibration whose positions are relabelled the same way.
    moved = RecordSet(
        items=records.items,
        ordering=records.ordering,
        order=records.order[:, sigma],
        answer=records.answer,
        logprobs=records.logprobs[:, sigma],
        attention=records.attention[:, :, sigma],
        extra=records.extra,
    )
    moved_cal = Calibration.from_arrays(
        cal.log_bias[np.ix_(sigma, sigma)],
        cal.attention_prior[:, sigma],
        cal.pride_log_prior[sigma],
    )
    for method in ("vanilla", "pride", "lad", "attn", "attn-purified"):
        before = score(method, records, cal, options)
        after = score(method, moved, moved_cal, options)
        np.testing.assert_allclose(after, before[:, sigma], atol=1e-9)


@settings(max_examples=40, deadline=None)
@given(scored_records())
def test_property_symmetric_calibration_makes_lad_equivariant(case):
    records, _, options, sigma = case
    n = records.num_candidates
    # Invariant under any relabelling: a constant off-diagonal and constant diagonal bias, and a
    # prior that is the same at every position.
    log_bias = np.full((n, n), math.log(0.3)) + np.eye(n) * math.log(0.5)
    cal = Calibration.from_arrays(log_bias, np.full((records.num_layers, n), 0.1))
    moved = RecordSet(
        items=records.items,
        ordering=records.ordering,
        order=records.order[:, sigma],
        answer=records.answer,
        logprobs=records.logprobs[:, sigma],
        attention=records.attention[:, :, sigma],
        extra=records.extra,
    )
    before, after = score("lad", records, cal, options), score("lad", moved, cal, options)
    np.testing.assert_allclose(after, before[:, sigma], atol=1e-9)
