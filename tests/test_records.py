import json
import re

import numpy as np
import pytest

from lad.core.predictions import (
    Prediction,
    predictions_by_method,
    predictions_for,
    read_predictions,
    write_predictions,
)
from lad.core.records import Record, RecordSet, RecordWriter, concat, read_records, write_records
from lad.errors import RecordError
from tests.synthetic import SyntheticModel


def _record(item="a", ordering=0, order=(0, 1, 2), answer=0, **kw) -> dict:
    obj = {
        "item": item,
        "ordering": ordering,
        "order": list(order),
        "answer": answer,
        "logprobs": [-0.5, -1.5, -2.0],
        "attention": [[0.1, 0.2, 0.3], [0.0, 0.5, 0.25]],
        "extra": {"reply": "1"},
    }
    obj.update(kw)
    return obj


def _write_lines(path, objs) -> None:
    path.write_text("".join(o if isinstance(o, str) else json.dumps(o) + "\n" for o in objs))


def _same(a: RecordSet, b: RecordSet) -> None:
    assert a.items.tolist() == b.items.tolist()
    for name in ("ordering", "order", "answer", "logprobs", "attention"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name))
    assert a.extra == b.extra


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
def test_round_trip_is_exact(tmp_path, suffix):
    records = SyntheticModel(num_candidates=5, num_layers=7).eval_records(6, num_shuffles=3)
    records.extra[1] = {"reply": "3", "tokens": [1, 2]}
    path = tmp_path / f"records{suffix}"
    write_records(path, records)
    back = read_records(path)
    _same(records, back)
    assert (back.num_candidates, back.num_layers, len(back)) == (5, 7, 18)


def test_record_objects_round_trip(tmp_path):
    recs = [Record(**_record()), Record(**_record(ordering=1, order=(2, 0, 1), answer=1))]
    rs = RecordSet.from_records(recs)
    assert rs.to_records() == recs
    write_records(tmp_path / "r.jsonl", recs)
    assert read_records(tmp_path / "r.jsonl").to_records() == recs


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("{not json\n", "not valid JSON"),
        ("[1, 2]\n", "expected a JSON object"),
        (_record(answer=3), "'answer' 3 is not a position in 0..2"),
        (_record(order=[0, 0, 2]), "is not a permutation of 0..2"),
        (_record(logprobs=[0, 0]), "must have N = 3 entries"),
        (_record(attention=[[0.1, 0.2, 0.3]]), "must have L = 2 layers"),
        (_record(attention=[[0.1, 0.2, 0.3], [0.1, -0.2, 0.3]]), "must be >= 0"),
        (_record(logprobs=[0, "x", 0]), "'logprobs' must hold only numbers"),
        (_record(ordering=1.5), "'ordering' must be an integer"),
        (_record(order=[0, 1.0, 2]), "'order' must hold only integers"),
        (_record(logprob=[0, 0, 0]), "unknown key(s) ['logprob']"),
        ({k: v for k, v in _record().items() if k != "answer"}, "missing key 'answer'"),
        (_record(ordering=0, order=[1, 0, 2], answer=1), "duplicate record for item 'a'"),
        (_record(ordering=5, order=[1, 0, 2], answer=0), "the answer is image 1 here"),
    ],
)
def test_bad_line_names_file_and_line(tmp_path, line, message):
    path = tmp_path / "records.jsonl"
    _write_lines(path, [_record(), "\n", line])
    with pytest.raises(RecordError) as e:
        read_records(path)
    assert str(e.value).startswith(f"{path}:3: ")
    assert message in str(e.value)


def test_non_finite_values_are_refused_in_memory_and_parquet(tmp_path):
    records = SyntheticModel(num_candidates=3, num_layers=2).eval_records(2, num_shuffles=2)
    records.logprobs[3, 1] = np.nan
    write_records(tmp_path / "r.parquet", records)
    with pytest.raises(RecordError, match=r"r.parquet: row 4: 'logprobs' must be finite"):
        read_records(tmp_path / "r.parquet")
    with pytest.raises(RecordError, match=r"record 4: 'logprobs' must be finite"):
        RecordSet.from_records(records.to_records())


def test_parquet_with_ragged_lists_is_refused(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [_record(), _record(item="b", logprobs=[0.0, 0.0])]
    table = pa.table({k: [r[k] for r in rows] for k in rows[0] if k != "extra"})
    table = table.append_column("extra", pa.array(["{}", "{}"]))
    pq.write_table(table, tmp_path / "r.parquet")
    with pytest.raises(RecordError, match="'logprobs' lists differ in length"):
        read_records(tmp_path / "r.parquet")


def test_missing_file(tmp_path):
    with pytest.raises(RecordError, match="no such records file"):
        read_records(tmp_path / "nope.jsonl")
    assert len(read_records(tmp_path / "nope.jsonl", missing_ok=True)) == 0


def test_writer_appends_and_drops_a_partial_last_line(tmp_path):
    path = tmp_path / "run" / "records.jsonl"
    with RecordWriter(path) as w:
        w.write(Record(**_record()))
    with path.open("a") as f:
        f.write('{"item": "a", "ordering": 1, "ord')  # killed mid-write
    with RecordWriter(path) as w:
        w.write(Record(**_record(ordering=1, order=(1, 2, 0), answer=2)))
    back = read_records(path)
    assert back.ordering.tolist() == [0, 1]
    assert path.read_text().count("\n") == 2


def test_writer_on_a_file_that_is_only_a_partial_line(tmp_path):
    path = tmp_path / "records.jsonl"
    path.write_text('{"item": "a"')
    with RecordWriter(path) as w:
        w.write(Record(**_record()))
    assert len(read_records(path)) == 1


def test_select_and_concat():
    records = SyntheticModel(num_candidates=3, num_layers=2).eval_records(4, num_shuffles=2)
    first = records.select(records.ordering == 0)
    second = records.select([1, 3, 5, 7])
    assert first.ordering.tolist() == [0] * 4 and second.ordering.tolist() == [1] * 4
    both = concat([first, second])
    assert len(both) == 8
    np.testing.assert_array_equal(both.logprobs[4:], records.logprobs[1::2])
    other = SyntheticModel(num_candidates=4, num_layers=2).eval_records(1, num_shuffles=1)
    with pytest.raises(RecordError, match="different"):
        concat([first, other])


def test_predictions_round_trip_and_alignment(tmp_path):
    records = SyntheticModel(num_candidates=3, num_layers=2).eval_records(3, num_shuffles=2)
    scores = records.logprobs
    path = tmp_path / "predictions.jsonl"
    unparsed = np.full(len(records), -1)
    cot = predictions_for(records, "cot", np.zeros((len(records), 0)), prediction=unparsed)
    write_predictions(path, predictions_for(records, "vanilla", scores) + cot)
    preds = read_predictions(path)
    assert len(preds) == 12 and preds[0].scores == scores[0].tolist()
    # Alignment does not depend on the order of the predictions.
    aligned = predictions_by_method(records, preds[::-1])
    np.testing.assert_array_equal(aligned["vanilla"], scores.argmax(axis=1))
    assert aligned["cot"].tolist() == [-1] * 6


def test_predictions_alignment_errors():
    records = SyntheticModel(num_candidates=3, num_layers=2).eval_records(2, num_shuffles=1)
    p = Prediction("item-00000", 0, "lad", 1, [])
    with pytest.raises(RecordError, match="method 'lad' has no prediction for item 'item-00001'"):
        predictions_by_method(records, [p])
    with pytest.raises(RecordError, match="two 'lad' predictions"):
        predictions_by_method(records, [p, p])
    with pytest.raises(RecordError, match="matches no record"):
        predictions_by_method(records, [Prediction("zzz", 0, "lad", 0, [])])


def test_bad_prediction_line(tmp_path):
    path = tmp_path / "p.jsonl"
    good = {"item": "a", "ordering": 0, "method": "lad", "prediction": 0, "scores": [0.0, 1.0]}
    _write_lines(path, [good, {**good, "prediction": 2}])
    with pytest.raises(RecordError, match=r"p.jsonl:2: 'prediction' 2 is not a position"):
        read_predictions(path)


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ({"attention": [[0.1, 0.2, 0.3], [0.1, 0.2]]}, "attention[1] must be a list of N = 3"),
        ({"attention": [[0.1, 0.2, 0.3], 5]}, "attention[1] must be a list of N = 3"),
        ({"attention": [[0.1, 0.2, 0.3], [0.1, "0.2", 0.3]]}, "'attention' must hold only numbers"),
        ({"logprobs": [0.1, "0.2", 0.3]}, "'logprobs' must hold only numbers"),
        ({"extra": []}, "'extra' must be an object"),
    ],
)
def test_bad_values_deep_in_a_file(tmp_path, bad, message):
    path = tmp_path / "records.jsonl"
    _write_lines(path, [_record(item=f"i{k}") for k in range(5)] + [_record(item="z", **bad)])
    with pytest.raises(RecordError, match=r"records.jsonl:6: " + re.escape(message)):
        read_records(path)
