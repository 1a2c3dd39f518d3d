"""`lad harness audit` over logged samples (no lmms-eval needed): the same numbers as
`lad metrics` on the equivalent lad run, the noise floor of repeated orderings, and bad sample
logs refused with one error line naming the file and line."""

import io
import json
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import numpy as np
import pytest

from lad.cli import main
from lad.core.metrics import compute_metrics
from lad.core.predictions import predictions_for, write_predictions
from lad.core.records import RecordSet, write_records
from lad.data.items import cyclic_shift
from lad.harness.circular import audit_row
from tests.synthetic import SyntheticModel

N = 4


def _lad(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = main(list(args))
    return code, out.getvalue(), err.getvalue()


def cyclic_run() -> tuple[RecordSet, np.ndarray]:
    """Records of 25 items under their N cyclic shifts (a circular task's orderings), with
    vanilla's position-biased choices."""
    records = SyntheticModel(num_candidates=N, seed=4).perm_records(25)
    return records, records.logprobs.argmax(axis=1)


def rows_of(records: RecordSet, pred: np.ndarray) -> list[dict]:
    return [
        {
            "item": str(records.items[r]),
            "ordering": int(records.ordering[r]),
            "order": records.order[r].tolist(),
            "answer": int(records.answer[r]),
            "prediction": int(pred[r]),
        }
        for r in range(len(records))
    ]


def write_samples(out: Path, rows: list[dict], task: str = "muirbench_circular") -> Path:
    model = out / "some__model"
    model.mkdir(parents=True, exist_ok=True)
    path = model / f"20260101_000000_samples_{task}.jsonl"
    lines = [json.dumps({"doc_id": i, "lad_acc": row}) for i, row in enumerate(rows)]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_the_audit_of_samples_equals_lad_metrics_of_the_lad_run(tmp_path):
    records, pred = cyclic_run()
    assert sorted(records.ordering.tolist())[:: len(records) // N][:N] == list(range(N))
    assert [cyclic_shift(N, s) for s in range(N)] == records.order[:N].tolist()
    write_records(tmp_path / "records.jsonl", records)
    write_predictions(
        tmp_path / "predictions.jsonl", predictions_for(records, "vanilla", records.logprobs, pred)
    )
    code, _, err = _lad(
        "metrics", "--records", str(tmp_path / "records.jsonl"),
        "--predictions", str(tmp_path / "predictions.jsonl"), "--out", str(tmp_path / "m.json"),
    )  # fmt: skip
    assert code == 0, err
    reference = json.loads((tmp_path / "m.json").read_text())
    write_samples(tmp_path / "out", rows_of(records, pred))
    code, out, err = _lad("harness", "audit", str(tmp_path / "out"))
    assert code == 0, err
    audit = json.loads((tmp_path / "out/lad_audit.json").read_text())
    entry = audit["tasks"]["muirbench_circular"][str(N)]
    got = json.loads((tmp_path / "out" / entry["folder"] / "metrics.json").read_text())
    assert got["bootstrap"] == reference["bootstrap"] == entry["bootstrap"]
    model, vanilla = got["methods"]["model"], reference["methods"]["vanilla"]
    for key in set(vanilla) - {"forward_passes_per_item", "delta_rstd"}:
        assert model[key] == vanilla[key], key
    for key in ("flip_rate", "circular_acc", "errors_due_to_order", "ci", "position_test"):
        assert entry["methods"]["model"][key] == vanilla[key], key
    p_value = vanilla["position_test"]["p_value"]
    assert p_value < 0.01 and f"matters, p={p_value:.3f}" in out  # vanilla's bias, printed


def test_repeats_give_the_noise_floor_and_leave_the_metrics(tmp_path):
    records, pred = cyclic_run()
    rows = rows_of(records, pred)
    again = [{**row, "repeat": 1} for row in rows]
    for row in again[:10:2]:  # 5 of 100 repeats answer another position
        row["prediction"] = (row["prediction"] + 1) % N
    write_samples(tmp_path / "once", rows)
    write_samples(tmp_path / "twice", [x for pair in zip(rows, again, strict=True) for x in pair])
    for folder in ("once", "twice"):
        assert _lad("harness", "audit", str(tmp_path / folder))[0] == 0
    entry = {
        f: json.loads((tmp_path / f / "lad_audit.json").read_text())["tasks"]
        ["muirbench_circular"][str(N)]["methods"]["model"]
        for f in ("once", "twice")
    }  # fmt: skip
    assert entry["twice"].pop("noise_floor") == {"flip_rate": 5.0, "records": 100}
    assert entry["twice"] == entry["once"]


def test_a_repeated_doc_carries_its_repeat():
    doc = {"lad_item": "muirbench-7", "lad_shift": 1, "answer": "A"}
    assert "repeat" not in audit_row(doc, [0, 1, 2], "B")
    assert audit_row({**doc, "lad_repeat": 0}, [0, 1, 2], "B") == audit_row(doc, [0, 1, 2], "B")
    assert audit_row({**doc, "lad_repeat": 1}, [0, 1, 2], "B")["repeat"] == 1


ROW = {"item": "a", "ordering": 1, "order": [1, 2, 0], "answer": 2, "prediction": 0}


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ({**ROW, "answer": 3}, "lad audit row: 'answer' must be an integer 0..2, got 3"),
        ({**ROW, "prediction": -2}, "'prediction' must be an integer -1..2, got -2"),
        ({**ROW, "order": [1, 1, 0]}, "'order' must be a permutation of 0..2 (each picture once)"),
        ({**ROW, "order": "120"}, "'order' must be a list of at least 2 integers, got '120'"),
        ({**ROW, "ordering": "1"}, "'ordering' must be an integer >= 0, got '1'"),
        ({**ROW, "item": 7}, "'item' must be a string, got 7"),
        ({**ROW, "repeat": True}, "'repeat' must be an integer >= 0, got True"),
        ({**ROW, "ordering": 2}, "item 'a': shifts 1 and 2 show the same order [1, 2, 0]"),
        ({**ROW, "repeat": 1, "answer": 1, "order": [2, 1, 0]}, "asked again with another order"),
        (ROW, "item 'a' shift 1 twice"),
        ({"prediction": 0}, "lad audit row: lacks ['item', 'ordering'"),
    ],
)
def test_bad_sample_rows_are_one_error_naming_file_and_line(tmp_path, line, message):
    path = write_samples(tmp_path, [ROW, line])
    code, _, err = _lad("harness", "audit", str(tmp_path))
    assert code == 1 and err.count("\n") == 1
    assert err.startswith(f"Error: {path}:2: ") and message in err, err


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b'{"lad_acc": {"item": "\xff"}}\n', "not UTF-8 text (byte 22)"),
        (b"[1, 2]\n", "expected a JSON object (one logged document), got list"),
        (b"{'lad_acc': 1}\n", "not valid JSON"),
    ],
)
def test_bad_sample_logs_are_one_error_naming_file_and_line(tmp_path, raw, message):
    path = write_samples(tmp_path, [ROW])
    path.write_bytes(path.read_bytes() + raw)
    code, _, err = _lad("harness", "audit", str(tmp_path))
    assert code == 1 and err.count("\n") == 1
    assert err.startswith(f"Error: {path}:2: ") and message in err, err


def test_the_repeat_variant_asks_every_shift_twice():
    datasets = pytest.importorskip("datasets", reason="datasets not installed (the harness extra)")
    from lad.harness.circular import muirbench_docs, muirbench_docs_repeated

    doc = {
        "idx": "7",
        "question": "Which picture shows the same street as <image>?",
        "options": ["<image>"] * 3,
        "answer": "B",
        "image_list": ["q", "a", "b", "c"],
    }
    once = muirbench_docs(datasets.Dataset.from_list([doc]))
    twice = muirbench_docs_repeated(datasets.Dataset.from_list([doc]))
    assert "lad_repeat" not in once.column_names
    assert [(d["lad_shift"], d["lad_repeat"]) for d in twice] == [
        (s, r) for s in range(3) for r in range(2)
    ]
    for d in twice:  # a repeat shows what its first asking showed
        first = once[d["lad_shift"]]
        assert (d["image_list"], d["answer"]) == (first["image_list"], first["answer"])


def test_lmms_eval_table_numbers_are_the_audit_s():
    from lad.harness.circular import lad_circular, lad_flip

    records, pred = cyclic_run()
    rows = rows_of(records, pred)
    m = compute_metrics(records, {"model": pred})["methods"]["model"]
    again = [{**row, "repeat": 1, "prediction": -1} for row in rows]  # repeats change nothing
    assert lad_flip(rows + again) == pytest.approx(m["flip_rate"])
    assert lad_circular(rows + again) == pytest.approx(m["circular_acc"])
    once = [dict(row) for row in rows if row["ordering"] == 0]  # one ordering: no pair
    assert np.isnan(lad_flip(once)) and lad_circular(once) == pytest.approx(
        100 * np.mean([row["prediction"] == row["answer"] for row in once])
    )


def test_pooled_numbers_are_those_of_all_questions_together(tmp_path):
    four, pred4 = cyclic_run()
    three = SyntheticModel(num_candidates=3, seed=1).perm_records(10)
    pred3 = three.logprobs.argmax(axis=1)
    rows = rows_of(four, pred4) + [{**r, "item": "t" + r["item"]} for r in rows_of(three, pred3)]
    write_samples(tmp_path, rows)
    assert _lad("harness", "audit", str(tmp_path))[0] == 0
    audit = json.loads((tmp_path / "lad_audit.json").read_text())
    pooled = audit["pooled"]["tasks"]["muirbench_circular"]["model"]
    assert audit["pooled"]["overall"]["model"] == pooled  # one task
    by_item: dict[str, list[dict]] = {}
    for row in rows:
        by_item.setdefault(row["item"], []).append(row)
    right = [[r["prediction"] == r["answer"] for r in mine] for mine in by_item.values()]
    errors = [(not ok, any(mine)) for mine in right for ok in mine]
    assert pooled["num_records"] == len(rows) == 100 + 30
    assert pooled["acc"] == pytest.approx(100 * np.mean([ok for mine in right for ok in mine]))
    assert pooled["circular_acc"] == pytest.approx(100 * np.mean([all(m) for m in right]))
    assert pooled["any_order_acc"] == pytest.approx(100 * np.mean([any(m) for m in right]))
    wrong = [known for is_wrong, known in errors if is_wrong]
    assert pooled["errors_due_to_order"] == pytest.approx(100 * np.mean(wrong))
    cells = audit["tasks"]["muirbench_circular"]
    flips = [cells[n]["methods"]["model"]["flip_rate"] for n in ("3", "4")]
    assert pooled["flip_rate"] == pytest.approx((10 * flips[0] + 25 * flips[1]) / 35)
