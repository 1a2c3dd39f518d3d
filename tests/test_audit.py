"""lad.core.audit's numbers against brute force from the records: ordering pairs enumerated, the
bootstrap as a plain loop over resamples with the same seed, the permutation test against all
within-question permutations enumerated, and docs/metrics.md's worked examples."""

import itertools
import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lad.core.audit import Bootstrap, position_test, question_index, questions
from lad.core.metrics import compute_metrics, format_panel
from lad.core.records import RecordSet
from lad.errors import LadError
from tests.synthetic import SyntheticModel
from tests.test_metrics import PREDS, hand_records


def records_of(items, orders, answers) -> RecordSet:
    n = len(orders[0])
    return RecordSet(
        items=np.array(items),
        ordering=np.array([sum(x == i for x in items[:k]) for k, i in enumerate(items)]),
        order=np.array(orders),
        answer=np.array(answers),
        logprobs=np.zeros((len(items), n)),
        attention=np.zeros((len(items), 0, n)),
        extra=[{} for _ in items],
    )


def synthetic(num_items=30, shuffles=5, seed=0):
    records = SyntheticModel(num_candidates=4, seed=seed).eval_records(num_items, shuffles)
    return records, records.logprobs.argmax(axis=1)  # vanilla: position-biased


# -- docs/metrics.md's worked examples ----------------------------------------------------------


def test_worked_example_of_the_docs():
    # test_metrics' hand case: a chooses image 0 twice (right twice), b image 0 then 1 (wrong,
    # right): a's one pair agrees, b's flips -> flip rate 50; circular 50; any order 100; b's one
    # error is on a question it gets right under the other ordering -> 100.
    metrics = compute_metrics(hand_records(), {"lad": PREDS}, bootstrap=Bootstrap(resamples=99))
    m = metrics["methods"]["lad"]
    assert m["flip_rate"] == pytest.approx(50.0)
    assert m["circular_acc"] == pytest.approx(50.0)
    assert m["any_order_acc"] == pytest.approx(100.0)
    assert m["errors_due_to_order"] == pytest.approx(100.0)
    # Swapping b's two answer positions leaves RStd at 35.36 (a is right at both): p = 1.
    assert m["position_test"]["observed"] == pytest.approx(m["rstd"])
    assert m["position_test"]["p_value"] == 1.0
    assert metrics["bootstrap"] == {"B": 99, "seed": 0, "level": 95.0}


def three_perfectly_biased_questions() -> tuple[RecordSet, np.ndarray]:
    """docs/metrics.md: 3 questions, N = 2, each shown once per position; right exactly when the
    answer is first."""
    records = records_of(["a", "a", "b", "b", "c", "c"], [[0, 1], [1, 0]] * 3, [0, 1, 0, 1, 0, 1])
    return records, np.zeros(6, dtype=np.int64)


def exact_p_value(records: RecordSet, pred: np.ndarray) -> float:
    """All within-question permutations of the answer positions, enumerated."""
    right = pred == records.answer

    def rstd(answer):
        recall = [right[answer == p].mean() * 100 for p in range(records.num_candidates)]
        return np.std(recall, ddof=1)

    groups = [np.flatnonzero(records.items == i) for i in dict.fromkeys(records.items.tolist())]
    observed, stats = rstd(records.answer), []
    for perms in itertools.product(*[itertools.permutations(g) for g in groups]):
        answer = records.answer.copy()
        for g, perm in zip(groups, perms, strict=True):
            answer[g] = records.answer[list(perm)]
        stats.append(rstd(answer))
    return float(np.mean(np.array(stats) >= observed - 1e-9))


def test_a_perfect_bias_on_three_questions_is_not_distinguishable():
    records, pred = three_perfectly_biased_questions()
    assert exact_p_value(records, pred) == 0.25  # 2 of the 2^3 swaps reach RStd 70.7
    table = questions(records, pred, question_index(records)[1])
    test = position_test(table, Bootstrap(resamples=20000, seed=3))
    assert test["observed"] == pytest.approx(np.std([100, 0], ddof=1))
    assert test["p_value"] == pytest.approx(0.25, abs=0.01)  # 3.3 standard errors


def test_permutation_test_agrees_with_enumeration():
    # 4 questions under 3 orderings, positions and choices uneven: 6^4 = 1296 permutations.
    rng = np.random.default_rng(5)
    items = [i for i in "abcd" for _ in range(3)]
    orders = [list(rng.permutation(3)) for _ in items]
    answers = rng.integers(0, 3, size=len(items))
    records = records_of(items, orders, answers)
    pred = np.where(rng.random(len(items)) < 0.5, answers, (answers + 1) % 3)
    exact = exact_p_value(records, pred)
    table = questions(records, pred, question_index(records)[1])
    test = position_test(table, Bootstrap(resamples=20000))
    assert test["p_value"] == pytest.approx(exact, abs=3.3 * np.sqrt(exact * (1 - exact) / 2e4))


# -- brute force over synthetic records ---------------------------------------------------------


def test_flip_rate_and_circular_numbers_by_brute_force():
    records, pred = synthetic()
    pred = np.where(np.arange(len(pred)) % 17 == 0, -1, pred)  # some unparseable
    m = compute_metrics(records, {"x": pred}, bootstrap=Bootstrap(resamples=10))["methods"]["x"]
    flips, circular, anywhere, errors, known = [], [], [], 0, 0
    for item in sorted(set(records.items.tolist())):
        rows = np.flatnonzero(records.items == item)
        image = [records.order[r][pred[r]] if pred[r] >= 0 else None for r in rows]
        pairs = list(itertools.combinations(image, 2))
        flips.append(np.mean([a is None or b is None or a != b for a, b in pairs]))
        right = [pred[r] == records.answer[r] for r in rows]
        circular.append(all(right))
        anywhere.append(any(right))
        errors += right.count(False)
        known += right.count(False) if any(right) else 0
    assert m["flip_rate"] == pytest.approx(100 * np.mean(flips))
    assert m["circular_acc"] == pytest.approx(100 * np.mean(circular))
    assert m["any_order_acc"] == pytest.approx(100 * np.mean(anywhere))
    assert m["errors_due_to_order"] == pytest.approx(100 * known / errors)
    assert m["circular_acc"] <= m["acc"] <= m["any_order_acc"]


def brute_force_flip_rate(records: RecordSet, pred: np.ndarray) -> float:
    shares = []
    for item in dict.fromkeys(records.items.tolist()):
        rows = np.flatnonzero(records.items == item)
        image = [records.order[r][pred[r]] if pred[r] >= 0 else -1 for r in rows]
        pairs = list(itertools.combinations(image, 2))
        shares.append(np.mean([a < 0 or a != b for a, b in pairs]))
    return 100 * float(np.mean(shares))


def test_bootstrap_intervals_against_a_plain_loop():
    records, pred = synthetic(num_items=12, shuffles=3)
    boot = Bootstrap(resamples=200, seed=7, level=90.0)
    m = compute_metrics(records, {"x": pred}, bootstrap=boot)["methods"]["x"]
    names = sorted(set(records.items.tolist()))
    rng = np.random.default_rng(7)
    acc, rstd, flip, recall = [], [], [], []
    for _ in range(boot.resamples):
        drawn = rng.integers(0, len(names), size=len(names))
        parts = []
        for k, q in enumerate(drawn):  # a question drawn twice counts as two questions
            part = records.select(records.items == names[q])
            part.items = np.array([f"{k}"] * len(part))
            parts.append(part)
        resample = RecordSet.concat(parts)
        chosen = np.concatenate([pred[records.items == names[q]] for q in drawn])
        plain = compute_metrics(resample, {"x": chosen}, bootstrap=None)["methods"]["x"]
        acc.append(plain["acc"])
        rstd.append(plain["rstd"])
        flip.append(brute_force_flip_rate(resample, chosen))
        recall.append([np.nan if r is None else r for r in plain["recall_by_position"]])
    recall = np.array(recall)

    def interval(x):
        x = np.asarray(x)
        return np.percentile(x[~np.isnan(x)], [5, 95])

    np.testing.assert_allclose(m["ci"]["acc"], interval(acc))
    np.testing.assert_allclose(m["ci"]["rstd"], interval(rstd))
    np.testing.assert_allclose(m["ci"]["flip_rate"], interval(flip))
    for p in range(records.num_candidates):
        np.testing.assert_allclose(m["ci"]["recall_by_position"][p], interval(recall[:, p]))


def test_noise_floor_by_brute_force():
    records, pred = synthetic(num_items=10)
    again = pred.copy()
    again[[1, 4, 9]] = (again[[1, 4, 9]] + 1) % 4
    again[11] = -1
    m = compute_metrics(records, {"vanilla": pred}, repeats={"vanilla": again})
    assert m["methods"]["vanilla"]["noise_floor"] == {"flip_rate": 8.0, "records": 50}
    row = format_panel(m).splitlines()[3].split()
    assert row[0] == "vanilla" and row[row.index("8.00") + 1 :] == [
        f"{m['methods']['vanilla']['circular_acc']:.2f}",
        f"{m['methods']['vanilla']['errors_due_to_order']:.2f}",
    ]


def test_the_metrics_are_identical_bytes_whatever_the_records_order():
    records, pred = synthetic(num_items=20)
    shuffled = np.random.default_rng(1).permutation(len(records))
    first = compute_metrics(records, {"vanilla": pred})
    second = compute_metrics(records.select(shuffled), {"vanilla": pred[shuffled]})
    assert json.dumps(first) == json.dumps(second)


def test_a_position_effect_is_found_and_its_absence_is_not():
    records, pred = synthetic(num_items=60)
    biased = compute_metrics(records, {"vanilla": pred})["methods"]["vanilla"]
    assert biased["position_test"]["p_value"] < 0.01
    # Right with a coin flip per question, whatever the position: no position dependence.
    _, question = question_index(records)
    coin = np.random.default_rng(2).random(60) < 0.6
    fair = np.where(coin[question], records.answer, (records.answer + 1) % 4)
    m = compute_metrics(records, {"fair": fair})["methods"]["fair"]
    assert m["position_test"]["p_value"] == 1.0  # a question is right under all or none
    # ... and per record: the p-value is not small, and RStd's interval holds RStd.
    coin = np.random.default_rng(2).random(len(records)) < 0.6
    fair = np.where(coin, records.answer, (records.answer + 1) % 4)
    m = compute_metrics(records, {"fair": fair})["methods"]["fair"]
    assert m["position_test"]["p_value"] > 0.2
    lo, hi = m["ci"]["rstd"]
    assert lo <= m["rstd"] <= hi


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"resamples": 0}, "resamples must be an integer >= 1"),
        ({"seed": -1}, "seed must be an integer >= 0"),
        ({"level": 100}, "level must be a percentage in (0, 100)"),
    ],
)
def test_bad_bootstrap_settings_are_refused(kwargs, message):
    with pytest.raises(LadError, match=message.replace("(", r"\(").replace(")", r"\)")):
        Bootstrap(**kwargs)


def test_the_position_test_keeps_its_level_under_the_null():
    # 200 data sets where being right ignores the position (question difficulty varies): a
    # test at 5 % rejects about 5 % of them (binomial: 3.3 sd above is 15 of 200).
    rng = np.random.default_rng(11)
    records, _ = synthetic(num_items=20, shuffles=4)
    _, question = question_index(records)
    rejected = 0
    for _ in range(200):
        ease = rng.random(20)
        right = rng.random(len(records)) < ease[question]
        pred = np.where(right, records.answer, (records.answer + 1) % 4)
        test = position_test(questions(records, pred, question), Bootstrap(resamples=199))
        rejected += test["p_value"] <= 0.05
    assert 2 <= rejected <= 20


# -- the report ---------------------------------------------------------------------------------


def report_of(tmp_path, metrics):
    from lad.outputs.report import write_report

    run = tmp_path / "run"
    run.mkdir(exist_ok=True)
    (run / "metrics.json").write_text(json.dumps(metrics))
    return write_report([run], tmp_path / "report").read_text()


def test_the_report_shows_the_audit_panel_and_refuses_a_damaged_one(tmp_path):
    from lad.errors import RunError

    records, pred = synthetic()
    metrics = compute_metrics(records, {"vanilla": pred, "lad": records.answer})
    page = report_of(tmp_path, metrics)
    m = metrics["methods"]["vanilla"]
    lo, hi = m["ci"]["rstd"]
    assert "<h3>Position audit</h3>" in page and f"<td>[{lo:.1f}, {hi:.1f}]</td>" in page
    assert "matters, p≤0.001" in page  # vanilla; lad is always right: noise, p=1
    older = compute_metrics(records, {"vanilla": pred}, bootstrap=None)
    assert "Position audit" not in report_of(tmp_path, older)
    m["ci"]["recall_by_position"] = m["ci"]["recall_by_position"][:2]
    with pytest.raises(RunError, match=r"metrics\.json: damaged \(method 'vanilla': 'ci' must"):
        report_of(tmp_path, metrics)
    older["methods"]["vanilla"]["position_test"] = [0.5]  # not an object: refused, not a crash
    with pytest.raises(RunError, match=r"damaged \(method 'vanilla': 'position_test' must"):
        report_of(tmp_path, older)


# -- lad metrics --------------------------------------------------------------------------------


def test_lad_metrics_prints_the_panel_with_the_floor_and_refuses_other_orderings(tmp_path, capsys):
    from lad.cli import main
    from lad.core.predictions import predictions_for, write_predictions
    from lad.core.records import write_records

    records, pred = synthetic(num_items=10)
    again = pred.copy()
    again[:5] = (again[:5] + 1) % 4  # 5 of 50 records answered otherwise
    write_records(tmp_path / "r.jsonl", records)
    for name, chosen in (("p.jsonl", pred), ("q.jsonl", again)):
        write_predictions(
            tmp_path / name, predictions_for(records, "vanilla", records.logprobs, chosen)
        )
    args = [
        "metrics",
        "--records",
        str(tmp_path / "r.jsonl"),
        "--predictions",
        str(tmp_path / "p.jsonl"),
    ]
    assert main([*args, "--repeat-predictions", str(tmp_path / "q.jsonl"), "--bootstrap", "50",
                 "--out", str(tmp_path / "m.json")]) == 0  # fmt: skip
    out = capsys.readouterr().out
    assert "Position audit: 95% bootstrap intervals over 10 items (B = 50, seed 0)" in out
    vanilla = json.loads((tmp_path / "m.json").read_text())["methods"]["vanilla"]
    assert vanilla["noise_floor"] == {"flip_rate": 10.0, "records": 50}
    assert f"{vanilla['flip_rate']:.2f}" in out and " 10.00 " in out
    other = records.select(np.arange(len(records) - 1))
    write_records(tmp_path / "other.jsonl", other)
    code = main([*args, "--repeat-predictions", str(tmp_path / "q.jsonl"),
                 "--repeat-records", str(tmp_path / "other.jsonl")])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 1 and err.count("\n") == 1
    assert err.startswith(f"Error: {tmp_path / 'other.jsonl'}: its (item, ordering, order) differ")
    assert main([*args, "--repeat-records", str(tmp_path / "other.jsonl")]) == 1
    assert "give both" in capsys.readouterr().err
    assert main([*args, "--bootstrap", "0"]) != 0
    assert "--bootstrap" in capsys.readouterr().err


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(2, 5), st.integers(1, 4), st.integers(1, 8))
def test_audit_invariants(seed, n, shuffles, num_items):
    rng = np.random.default_rng(seed)
    items = [f"q{i}" for i in range(num_items) for _ in range(shuffles)]
    orders = [list(rng.permutation(n)) for _ in items]
    records = records_of(items, orders, rng.integers(0, n, size=len(items)))
    pred = rng.integers(-1, n, size=len(items))
    metrics = compute_metrics(records, {"x": pred}, bootstrap=Bootstrap(resamples=20))
    m = metrics["methods"]["x"]
    assert m["circular_acc"] <= m["acc"] + 1e-9 <= m["any_order_acc"] + 2e-9
    if shuffles == 1:
        assert m["flip_rate"] is None and m["ci"]["flip_rate"] is None
        assert m["position_test"]["p_value"] is None and "– (one order)" in format_panel(metrics)
    else:  # no flip anywhere exactly when every question is consistent (Cons. 100)
        assert (m["flip_rate"] == 0) == (m["cons"] == 100)
        assert 0 < m["position_test"]["p_value"] <= 1
    for ci in (m["ci"]["acc"], m["ci"]["rstd"]):
        assert 0 <= ci[0] <= ci[1]
    renamed = records_of([f"z{i}" for i in items], orders, records.answer)  # same sort order
    again = compute_metrics(renamed, {"x": pred}, bootstrap=Bootstrap(resamples=20))
    assert again["methods"]["x"] == m


def test_accuracy_against_n_has_the_intervals_as_error_bars(tmp_path):
    from lad.outputs.report import write_report

    runs = []
    for n in (3, 4):
        records = SyntheticModel(num_candidates=n).eval_records(15, 3)
        run = tmp_path / f"n{n}"
        run.mkdir()
        metrics = compute_metrics(records, {"vanilla": records.logprobs.argmax(axis=1)})
        (run / "metrics.json").write_text(json.dumps(metrics))
        (run / "run.json").write_text(json.dumps({"arguments": {"model": "m", "setting": "s"}}))
        runs.append(run)
    page = write_report(runs, tmp_path / "report")
    assert (tmp_path / "report/acc_vs_n.png").is_file() and "Accuracy against N" in page.read_text()
