import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lad.core.metrics import compute_metrics, format_table
from lad.core.records import RecordSet
from lad.errors import LadError
from tests.synthetic import SyntheticModel

# Hand-computed case: N = 2, items a and b, T = 2 shuffles.
#   a, t=0: order [0,1], answer 0; predicts 0 -> correct, image 0
#   a, t=1: order [1,0], answer 1; predicts 1 -> correct, image 0     (a: consistent)
#   b, t=0: order [0,1], answer 1; predicts 0 -> wrong,   image 0
#   b, t=1: order [1,0], answer 0; predicts 0 -> correct, image 1     (b: not consistent)
# Acc per shuffle: t=0 50%, t=1 100% -> 75 ± std(50, 100) = 35.355
# Recall: answer at 0 (a0, b1) 100%; at 1 (a1, b0) 50% -> RStd = std(100, 50) = 35.355
# Cons. = 50%. Selection: positions chosen 0, 1, 0, 0 -> [75, 25].
# Confusion rows (answer position): 0 -> [100, 0]; 1 -> [50, 50].
SAMPLE_STD = math.sqrt(2 * 25**2)  # sample std of two values 50 apart


def hand_records() -> RecordSet:
    return RecordSet(
        items=np.array(["a", "a", "b", "b"]),
        ordering=np.array([0, 1, 0, 1]),
        order=np.array([[0, 1], [1, 0], [0, 1], [1, 0]]),
        answer=np.array([0, 1, 1, 0]),
        logprobs=np.log(np.full((4, 2), 0.5)),
        attention=np.ones((4, 1, 2)),
        extra=[{}] * 4,
    )


PREDS = np.array([0, 1, 0, 0])


def test_hand_computed_metrics():
    metrics = compute_metrics(hand_records(), {"lad": PREDS})
    assert (metrics["num_candidates"], metrics["num_items"], metrics["num_shuffles"]) == (2, 2, 2)
    m = metrics["methods"]["lad"]
    assert m["acc"] == pytest.approx(75.0)
    assert m["acc_std"] == pytest.approx(SAMPLE_STD)
    assert m["recall_by_position"] == pytest.approx([100.0, 50.0])
    assert m["rstd"] == pytest.approx(SAMPLE_STD)
    assert m["cons"] == pytest.approx(50.0)
    assert m["selection_by_position"] == pytest.approx([75.0, 25.0])
    np.testing.assert_allclose(m["confusion"], [[100.0, 0.0], [50.0, 50.0]])
    assert m["forward_passes_per_item"] == 1.0
    assert "parse_failure" not in m
    json.dumps(metrics)  # plain JSON types only


def test_unparseable_answers_count_as_wrong_and_are_reported():
    preds = np.array([0, -1, 0, 0])
    m = compute_metrics(hand_records(), {"cot": preds}, costs={"cot": 1})["methods"]["cot"]
    assert m["parse_failure"] == pytest.approx(25.0)
    assert m["acc"] == pytest.approx(50.0)  # t=0: 50%, t=1: 50%
    assert m["cons"] == 0.0  # a's second choice is no image
    assert m["selection_by_position"] == pytest.approx([75.0, 0.0])
    np.testing.assert_allclose(m["confusion"], [[100.0, 0.0], [50.0, 0.0]])
    assert "Unparsed" in format_table(compute_metrics(hand_records(), {"cot": preds}))


def test_costs_default_and_override():
    records = SyntheticModel(num_candidates=4).eval_records(3, 2)
    preds = np.zeros(len(records), dtype=np.int64)
    metrics = compute_metrics(records, {"perm-avg": preds, "sofa": preds}, costs={"sofa": 1})
    assert metrics["methods"]["perm-avg"]["forward_passes_per_item"] == 4.0
    assert metrics["methods"]["sofa"]["forward_passes_per_item"] == 1.0
    unknown = compute_metrics(records, {"my-method": preds})["methods"]
    assert unknown["my-method"]["forward_passes_per_item"] is None


def test_a_position_without_answers_has_no_recall():
    records = hand_records().select([0, 3])  # answers only at position 0
    m = compute_metrics(records, {"vanilla": np.array([0, 0])})["methods"]["vanilla"]
    assert m["recall_by_position"] == [100.0, None]
    assert m["rstd"] == 0.0


def test_bad_predictions_are_refused():
    with pytest.raises(LadError, match=r"must be \(4,\) integer positions"):
        compute_metrics(hand_records(), {"lad": np.array([0, 1])})
    with pytest.raises(LadError, match="'lad' predicts position 2"):
        compute_metrics(hand_records(), {"lad": np.array([0, 1, 2, 0])})


def test_format_table_has_the_papers_layout():
    table = format_table(compute_metrics(hand_records(), {"vanilla": PREDS, "lad": PREDS}))
    lines = table.splitlines()
    assert "Acc" in lines[1] and "RStd" in lines[1] and "Cons." in lines[1]
    assert lines[3].split()[:2] == ["vanilla", "75.00±35.36"]
    assert lines[4].startswith("lad")


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(2, 6), st.integers(1, 4))
def test_property_metrics_do_not_depend_on_record_order(seed, n, shuffles):
    rng = np.random.default_rng(seed)
    records = SyntheticModel(num_candidates=n, num_layers=2, seed=seed % 97).eval_records(
        5, num_shuffles=shuffles
    )
    preds = {"a": rng.integers(-1, n, size=len(records)), "b": records.answer.copy()}
    perm = rng.permutation(len(records))
    before = compute_metrics(records, preds)
    after = compute_metrics(records.select(perm), {k: v[perm] for k, v in preds.items()})
    assert json.dumps(before, sort_keys=True) == json.dumps(after, sort_keys=True)
    assert before["methods"]["b"]["acc"] == 100.0 and before["methods"]["b"]["cons"] == 100.0
