"""`lad ablate`: the paper's analyses from stored records.

Orderings the paper reports, on synthetic records with a known conditional bias; every number
against a direct call of lad's scoring (and `lad score` / `lad metrics`); missing prerequisites
and bad input; and end to end on a real `lad eval` run of the demo model.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from itertools import combinations
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lad.cli import main
from lad.core.calibrate import Calibration
from lad.core.methods import MethodOptions, predict
from lad.core.metrics import compute_metrics
from lad.core.records import write_records
from lad.data.orders import cyclic_requests
from lad.errors import CalibrationError, DataError, LadError, RunError
from lad.evaluate import fit_or_load_calibration
from lad.outputs.ablate import (
    AblateOptions,
    AnalysisError,
    Run,
    ablate,
    ablation_table,
    calibration_size_sweep,
    calibration_subsets,
    cost_table,
    divergence_table,
    load_run,
    load_runs,
    prepare,
    temperature_sweep,
    transfer_table,
    write_ablation,
)
from lad.run.config import eval_config
from lad.run.inputs import load_items
from tests.synthetic import SyntheticModel


def synthetic_run(model: SyntheticModel, name: str = "syn", *, items: int = 300, cal: int = 5,
                  perm: bool = True, setting: str = "random") -> Run:  # fmt: skip
    calibration_records = model.calibration_records(cal)
    return Run(
        name=name,
        records=model.eval_records(items, num_shuffles=5),
        calibration=Calibration().fit(calibration_records),
        calibration_records=calibration_records,
        perm_records=model.perm_records(items) if perm else None,
        arguments={"model": "synthetic", "setting": setting},
    )


def write_run_dir(path: Path, model: SyntheticModel, *, items: int = 40, cal: int = 5,
                  perm: bool = True, setting: str = "random", **arguments) -> Path:  # fmt: skip
    """A run directory as `lad eval` leaves it, holding the synthetic model's records
    (`arguments`: other EvalConfig fields run.json states)."""
    path.mkdir(parents=True)
    config = eval_config(
        model="synthetic", num_candidates=model.num_candidates, setting=setting,
        calibration_items=cal, **arguments,
    )  # fmt: skip
    (path / "run.json").write_text(
        json.dumps({"format": "lad-run/1", "arguments": config.identity()})
    )
    write_records(path / "records.jsonl", model.eval_records(items, num_shuffles=5))
    calibration_records = model.calibration_records(cal)
    write_records(path / "calibration.jsonl", calibration_records)
    if perm:
        write_records(path / "perm_records.jsonl", model.perm_records(items))
    fit_or_load_calibration(config, path, calibration_records)
    return path


def direct(run: Run, method: str, calibration: Calibration | None = None, **options) -> dict:
    """metrics of `method` computed straight from lad.core.methods.predict and lad.core.metrics."""
    chosen = predict(
        method, run.records, calibration or run.calibration, MethodOptions(**options),
        perm_records=run.perm_records,
    )  # fmt: skip
    return compute_metrics(run.records, {method: chosen})["methods"][method]


def rows_by(table, *keys):
    return {tuple(r[k] for k in keys): r for r in table.data[next(iter(table.data))]}


# ---------------------------------------------------------------------------------------------
# The orderings the paper reports (§5.6, Table 4, Figure 6).


@pytest.mark.parametrize("num_candidates", [4, 8])
@pytest.mark.parametrize("seed", [0, 1])
def test_table4_orderings(num_candidates, seed):
    # A strong attention sink on the first position (sink = 6), the structural artifact the
    # paper blames for the raw readout's errors; content only in two of twelve layers.
    model = SyntheticModel(num_candidates=num_candidates, seed=seed, sink=6.0)
    acc = {
        (r["strategy"], r["prior"], r["k"]): r
        for r in ablation_table(synthetic_run(model)).data["rows"]
    }
    raw, purified = acc["Attn Readout", False, 2], acc["Attn Readout", True, 2]
    assert purified["acc"] > raw["acc"] + 3 and purified["rstd"] < raw["rstd"]  # prior helps
    dynamic = acc["Dynamic", True, 2]["acc"]
    assert dynamic > acc["All Layers", True, None]["acc"] + 5  # dynamic top-K beats all layers
    assert dynamic > acc["Dynamic", False, 2]["acc"]  # the prior helps LAD too
    assert dynamic >= acc["Dynamic", True, 4]["acc"] > acc["Dynamic", True, 8]["acc"]


@pytest.mark.parametrize("num_candidates", [4, 8])
@pytest.mark.parametrize("seed", [0, 1])
def test_accuracy_rises_with_tau_to_a_plateau(num_candidates, seed):
    run = synthetic_run(SyntheticModel(num_candidates=num_candidates, seed=seed))
    acc = {r["tau"]: r["acc"] for r in temperature_sweep(run).data["points"]}
    assert set(acc) == {0.0, 1.0, 3.0, 5.0, 7.0, 9.0, "inf"}
    assert acc[0.0] + 5 < acc[1.0] < acc[3.0] < acc[5.0]
    first_gain, last_gain = acc[1.0] - acc[0.0], acc[9.0] - acc[7.0]
    assert abs(last_gain) < 1.5 and abs(last_gain) < first_gain / 5


@pytest.mark.parametrize("seed", [0, 1])
def test_accuracy_rises_with_calibration_size_to_a_plateau(seed):
    # Logits that carry the content strongly (signal = 3): one calibration item's P_obs(j|i) is
    # then mostly that item's content, and only more items average it out.
    model = SyntheticModel(num_candidates=8, seed=seed, signal=3.0, attention_signal=0.6)
    run = synthetic_run(model, cal=50)
    options = AblateOptions(sizes=(1, 5, 20, 50), subsets=10)
    points = {p["size"]: p for p in calibration_size_sweep(run, options).data["points"]}
    acc = {size: p["lad_mean"] for size, p in points.items()}
    assert acc[5] > acc[1] + 1 and acc[20] > acc[1] + 1.5
    assert abs(acc[50] - acc[20]) < 1
    assert points[1]["lad_subset_std"] > points[20]["lad_subset_std"]
    assert len(points[1]["subsets"]) == 10 and points[50]["subsets"] == [
        sorted(set(run.calibration_records.items.tolist()))
    ]


# ---------------------------------------------------------------------------------------------
# Every number is lad's own scoring on the stored records.


@pytest.fixture(scope="module")
def run4() -> Run:
    return synthetic_run(SyntheticModel(num_candidates=4, seed=3), "a", items=60, cal=12)


def test_table4_values_equal_direct_scoring(run4):
    rows = rows_by(ablation_table(run4), "strategy", "prior", "k")
    expected = {
        ("Attn Readout", False, 2): direct(run4, "attn"),
        ("Attn Readout", True, 2): direct(run4, "attn-purified"),
        ("All Layers", True, None): direct(run4, "lad", layers="all"),
        ("Dynamic", False, 2): direct(run4, "lad", use_prior=False),
        **{("Dynamic", True, k): direct(run4, "lad", top_k=k) for k in (1, 2, 4, 8)},
    }
    assert set(rows) == set(expected)
    for key, m in expected.items():
        for metric in ("acc", "acc_std", "rstd", "cons"):
            assert rows[key][metric] == m[metric], (key, metric)


def test_sweeps_and_tables_equal_direct_scoring(run4):
    for r in temperature_sweep(run4).data["points"]:
        tau = math.inf if r["tau"] == "inf" else r["tau"]
        assert r["acc"] == direct(run4, "lad", tau=tau)["acc"]
        assert r["pride_acc"] == direct(run4, "pride")["acc"]
    for r in divergence_table(run4).data["runs"]:
        for method, m in r["methods"].items():
            assert m["recall_by_position"] == direct(run4, method)["recall_by_position"]
    for r in cost_table(run4).data["rows"]:
        assert r["acc"] == direct(run4, r["method"])["acc"]
        assert r["forward_passes_per_item"] == (4 if r["method"] == "perm-avg" else 1)
    point = calibration_size_sweep(run4, AblateOptions(sizes=(3,))).data["points"][0]
    cal = run4.calibration_records
    for subset, lad_acc, pride_acc in zip(
        point["subsets"], point["lad_acc"], point["pride_acc"], strict=True
    ):
        fitted = Calibration().fit(cal.select(np.isin(cal.items, subset)))
        assert fitted.num_items == 3
        assert lad_acc == direct(run4, "lad", fitted)["acc"]
        assert pride_acc == direct(run4, "pride", fitted)["acc"]


def test_transfer_values_and_refusals(run4):
    other = synthetic_run(
        SyntheticModel(num_candidates=4, seed=4, neighbor_bias=1.0), "b", items=60
    )
    table = transfer_table([run4, other])
    pairs = {(p["calibration"], p["records"], p["method"]): p for p in table.data["pairs"]}
    assert len(pairs) == 2 * 3
    for (source, target, method), p in pairs.items():
        src, tgt = {"a": run4, "b": other}[source], {"a": run4, "b": other}[target]
        assert p["transferred"]["acc"] == direct(tgt, method, src.calibration)["acc"]
        assert p["own"]["acc"] == direct(tgt, method)["acc"]
    eight = synthetic_run(SyntheticModel(num_candidates=8), "c", items=10)
    with pytest.raises(AnalysisError, match=r"runs of the same N; a has N = 4, c N = 8"):
        transfer_table([run4, eight])
    with pytest.raises(AnalysisError, match="was given one"):
        transfer_table([run4])
    # Next to a compatible pair, an incompatible run is listed, not fatal.
    mixed = transfer_table([run4, other, eight])
    assert len(mixed.data["pairs"]) == 6 and len(mixed.missing) == 4


def test_figure5_values_panels_and_notes(run4):
    eight = synthetic_run(SyntheticModel(num_candidates=8, seed=3), "c", items=30)
    twin = synthetic_run(SyntheticModel(num_candidates=8, seed=6), "d", items=10)
    adversarial = synthetic_run(SyntheticModel(num_candidates=4), "e", items=10, perm=False)
    adversarial.arguments["setting"] = "adversarial"
    result = ablate([run4, eight, twin, adversarial], only=["fig5"])
    (panel,) = result.tables[0].data["panels"]
    assert (panel["setting"], panel["ns"], panel["runs"]) == (
        "random",
        [4, 8],
        {"4": "a", "8": "c"},
    )
    for method, points in panel["series"].items():
        assert points["4"]["acc"] == direct(run4, method)["acc"]
        assert points["8"]["acc"] == direct(eight, method)["acc"]
    assert [m.reason for m in result.missing] == [
        "c and d both have N = 8 (random); Figure 5 uses c",
        "e (adversarial) is the only run of its model and setting",
    ]
    assert result.tables[0].rows[0] == ["random", "vanilla", *[
        f"{direct(r, 'vanilla')['acc']:.2f} ± {direct(r, 'vanilla')['acc_std']:.2f}"
        for r in (run4, eight)
    ]]  # fmt: skip


def test_calibration_items_option_refits_on_a_seeded_subset(run4):
    subset = calibration_subsets(run4.calibration_items(), 3, 1, seed=2)[0]
    cal = run4.calibration_records
    fitted = Calibration().fit(cal.select(np.isin(cal.items, subset)))
    result = ablate([run4], AblateOptions(calibration_items=3, seed=2, sizes=(12,)))
    tables = {t.key: t for t in result.tables}
    rows = rows_by(tables["table4"], "strategy", "prior", "k")
    assert rows["Dynamic", True, 2]["acc"] == direct(run4, "lad", fitted)["acc"]
    assert "a: 3 of its 12 calibration items (seed 2), |D_cal| = 3" in tables["table4"].caption
    # Figure 6(a) still draws from all the run's calibration items.
    assert tables["fig6a"].data["points"][0]["lad_acc"] == [direct(run4, "lad")["acc"]]
    with pytest.raises(AnalysisError, match="holds 12 calibration items, fewer than 13"):
        ablate([run4], AblateOptions(calibration_items=13))


def test_ablate_matches_lad_score_and_lad_metrics(tmp_path, capsys):
    run = write_run_dir(tmp_path / "run", SyntheticModel(num_candidates=4, seed=5))
    out = tmp_path / "ablate"
    assert main(["ablate", str(run), "--out", str(out), "--only", "table4,fig6b"]) == 0
    table4 = json.loads((out / "table4_ablation.json").read_text())["data"]["rows"]
    fig6b = json.loads((out / "fig6b_temperature.json").read_text())["data"]["points"]
    cases = [
        (["--top-k", "1"], next(r for r in table4 if r["strategy"] == "Dynamic" and r["k"] == 1)),
        (["--no-prior"], next(r for r in table4 if r["strategy"] == "Dynamic" and not r["prior"])),
        (["--layers", "all"], next(r for r in table4 if r["strategy"] == "All Layers")),
        (["--tau", "inf"], next(r for r in fig6b if r["tau"] == "inf")),
        (["--tau", "0"], next(r for r in fig6b if r["tau"] == 0.0)),
    ]
    for i, (flags, row) in enumerate(cases):
        preds, metrics = tmp_path / f"p{i}.jsonl", tmp_path / f"m{i}.json"
        args = ["score", "--records", str(run / "records.jsonl"), "--method", "lad",
                "--calibration", str(run / "calibration.json"), *flags,
                "--out", str(preds)]  # fmt: skip
        assert main(args) == 0
        assert main(["metrics", "--records", str(run / "records.jsonl"),
                     "--predictions", str(preds), "--out", str(metrics)]) == 0  # fmt: skip
        got = json.loads(metrics.read_text())["methods"]["lad"]
        assert (got["acc"], got["rstd"], got["cons"]) == (row["acc"], row["rstd"], row["cons"])

    # The official code's variants: lad ablate refits Eq. 1 over logits from calibration.jsonl.
    variants = ["--obs-mean", "logit", "--mixture", "log", "--attn-mean", "raw"]
    assert main(["ablate", str(run), "--out", str(out), "--only", "table4", *variants]) == 0
    table4 = json.loads((out / "table4_ablation.json").read_text())
    assert "mixture = log, attn_mean = raw" in table4["caption"]
    assert "Eq. 1 over logits" in table4["caption"]
    row = next(r for r in table4["data"]["rows"] if r["strategy"] == "Dynamic" and r["k"] == 1)
    args = ["score", "--records", str(run / "records.jsonl"), "--method", "lad", "--top-k", "1",
            "--calibration-records", str(run / "calibration.jsonl"), *variants,
            "--out", str(tmp_path / "v.jsonl")]  # fmt: skip
    assert main(args) == 0
    assert main(["metrics", "--records", str(run / "records.jsonl"), "--predictions",
                 str(tmp_path / "v.jsonl"), "--out", str(tmp_path / "v.json")]) == 0  # fmt: skip
    assert json.loads((tmp_path / "v.json").read_text())["methods"]["lad"]["acc"] == row["acc"]
    assert main(["ablate", str(run), "--out", str(out), "--preset", "official"]) == 1
    assert "layer_range (21, 35) starts past the last layer" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------
# Subsets, missing prerequisites, bad input, output.


def test_every_analysis_has_its_files():
    from lad.outputs.ablate import ANALYSES

    assert all(a.make and a.figure and a.stem.startswith(f"{k}_") for k, a in ANALYSES.items())


def test_calibration_subsets_are_seeded():
    items = [f"cal-{i}" for i in range(20)]
    a = calibration_subsets(items, 5, 4, seed=0)
    assert a == calibration_subsets(list(reversed(items)), 5, 4, seed=0)
    assert a != calibration_subsets(items, 5, 4, seed=1)
    assert all(len(s) == 5 == len(set(s)) and set(s) <= set(items) for s in a)
    assert calibration_subsets(items, 20, 4, seed=0) == [sorted(items)]


@settings(max_examples=80, deadline=None)
@given(
    pool=st.integers(1, 30), size=st.integers(1, 30), count=st.integers(1, 12),
    seed=st.integers(0, 5),
)  # fmt: skip
def test_calibration_subsets_draw_without_replacement_across_subsets(pool, size, count, seed):
    items = [f"cal-{i:02d}" for i in range(pool)]
    size = min(size, pool)
    subsets = calibration_subsets(items, size, count, seed)
    assert subsets == calibration_subsets(items, size, count, seed)
    assert all(len(s) == size == len(set(s)) and s == sorted(s) for s in subsets)
    assert len({tuple(s) for s in subsets}) == len(subsets)  # no subset twice
    if math.comb(pool, size) <= count:  # all of them
        assert len(subsets) == math.comb(pool, size)
        return
    assert len(subsets) == count
    uses = Counter(item for s in subsets for item in s)
    if size * count <= pool:  # disjoint: no item is used twice
        assert max(uses.values()) == 1
    if size * count >= pool:  # every item is used before any is used again
        assert set(uses) == set(items)


def test_size_one_subsets_of_five_items_are_each_item_once():
    # The case: five 1-item subsets of five items drew items 2, 4, 4, 2, 1.
    items = [f"cal-{i}" for i in range(5)]
    assert calibration_subsets(items, 1, 5, seed=0) == [[i] for i in items]
    assert calibration_subsets(items, 4, 5, seed=0) == [list(c) for c in combinations(items, 4)]
    assert len(calibration_subsets(items, 2, 5, seed=0)) == 5  # of C(5, 2) = 10


def test_missing_prerequisites_are_listed_not_raised():
    bare = synthetic_run(SyntheticModel(num_candidates=4), "bare", items=20, perm=False)
    bare.calibration_records = None
    bare.arguments["calibration"] = "given.json"  # lad eval --calibration given.json
    result = ablate([bare])
    made = {t.key for t in result.tables}
    assert made == {"table4", "fig6b", "table7"}
    why = {m.analysis: m for m in result.missing}
    assert "two N" in why["fig5"].reason and "lad eval -n 8" in why["fig5"].fix
    assert "given one" in why["table3"].reason
    assert "--calibration file" in why["fig6a"].reason and "--calibration" in why["fig6a"].fix
    assert why["table8"].reason == (
        "Table 8 compares with SoFA and permutation averaging: sofa for bare: no "
        "sofa_records.jsonl; perm-avg for bare: no perm_records.jsonl"
    )
    assert "sofa and perm-avg added to --methods" in why["table8"].fix

    few = ablate([synthetic_run(SyntheticModel(num_candidates=4), "few", items=20)], only=["fig6a"])
    assert [p["size"] for p in few.tables[0].data["points"]] == [1, 5]
    assert (
        few.missing[0].reason == "|D_cal| = 10, 20, 50, 100 for few: its calibration holds 5 items"
    )
    assert "lad eval --calibration-items 100" in few.missing[0].fix


def test_tau_infinity_everywhere_writes_valid_json(run4, tmp_path):
    result = ablate([run4], AblateOptions(MethodOptions(tau=math.inf), sizes=(2,), subsets=2))
    write_ablation(result, tmp_path)
    table4 = json.loads((tmp_path / "table4_ablation.json").read_text())
    assert {r["options"]["tau"] for r in table4["data"]["rows"]} == {"inf"}
    assert "τ = ∞" in table4["caption"]
    rows = table4["data"]["rows"]
    lad = next(r for r in rows if r["strategy"] == "Dynamic" and r["prior"] and r["k"] == 2)
    assert lad["acc"] == direct(run4, "lad", tau=math.inf)["acc"]


def test_ablate_is_deterministic(run4, tmp_path):
    options = AblateOptions(sizes=(1, 3), subsets=3)
    for name in ("a", "b"):
        write_ablation(ablate([run4], options, only=["table4", "fig6a"]), tmp_path / name)
    for path in (tmp_path / "a").glob("*.json"):
        assert path.read_text() == (tmp_path / "b" / path.name).read_text(), path.name


def test_bad_inputs(tmp_path, run4, capsys):
    with pytest.raises(RunError, match="not a directory"):
        load_run(tmp_path / "nowhere")
    with pytest.raises(RunError, match=r"not a lad run directory \(no run.json\)"):
        load_run(tmp_path)
    (tmp_path / "run.json").write_text("{")
    with pytest.raises(RunError, match=r"run\.json: not valid JSON"):
        load_run(tmp_path)
    (tmp_path / "run.json").write_text(json.dumps({"format": "x"}))
    with pytest.raises(RunError, match="not a lad run"):
        load_run(tmp_path)
    run = write_run_dir(tmp_path / "r", SyntheticModel(num_candidates=4))
    (run / "calibration.json").unlink()
    with pytest.raises(RunError, match=r"no calibration\.json; the run is unfinished"):
        load_run(run)
    with pytest.raises(RunError, match="given twice"):
        load_runs([tmp_path / "r", tmp_path / "r"])
    for bad in ({"subsets": 0}, {"sizes": (0,)}, {"taus": (-1.0,)}, {"ks": ()}):
        with pytest.raises(LadError, match="parameter must"):
            AblateOptions(**bad)
    with pytest.raises(LadError, match="labels and obs_mean are each run's own"):
        AblateOptions(MethodOptions(obs_mean="logit"))
    with pytest.raises(LadError, match="Unknown analyses"):
        ablate([run4], only=["table9"])
    with pytest.raises(LadError, match="no runs given"):
        ablate([])

    assert main(["ablate", str(tmp_path / "nowhere")]) == 1
    assert "not a directory" in capsys.readouterr().err
    assert main(["ablate", str(tmp_path), str(tmp_path / "x")]) == 1
    assert capsys.readouterr().err == "Error: --out is needed with several runs\n"
    for flags, message in (
        (["--only", "table9"], "unknown ['table9']; analyses: fig5,table3,table4,fig6a"),
        (["--taus", "1,x"], "expected comma-separated floats, got '1,x'"),
        (["--sizes", "1,2.5"], "expected comma-separated ints, got '1,2.5'"),
    ):
        with pytest.raises(SystemExit):
            main(["ablate", str(tmp_path), *flags])
        assert message in capsys.readouterr().err


def test_variants_of_the_official_code(run4):
    options = AblateOptions(
        MethodOptions(mixture="log", attn_mean="raw", layer_range=(3, 11)), obs_mean="logit"
    )
    table = ablate([run4], options, only=["table4"]).tables[0]
    logit = Calibration(obs_mean="logit").fit(run4.calibration_records)
    rows = rows_by(table, "strategy", "prior", "k")
    variants = {"obs_mean": "logit", "mixture": "log", "attn_mean": "raw", "layer_range": (3, 11)}
    assert rows["Dynamic", True, 2]["acc"] == direct(run4, "lad", logit, **variants)["acc"]
    assert rows["Dynamic", True, 8]["layers_used"] == 8 and rows["Dynamic", True, 8]["k"] == 8
    assert table.rows[-1][3] == "8"  # 9 layers (3..11) to choose from
    # Calibrations that average Eq. 1 differently are not exchanged.
    logit_run = prepare(run4, AblateOptions(obs_mean="logit"))[0]
    assert logit_run.calibration.obs_mean == "logit"
    other = synthetic_run(SyntheticModel(num_candidates=4, seed=4), "b", items=20)
    with pytest.raises(AnalysisError, match=r"average Eq\. 1 over 'logit' and 'prob'"):
        transfer_table([logit_run, other])


def test_calibration_of_another_model_is_refused_unless_told(tmp_path, capsys):
    run = write_run_dir(tmp_path / "run", SyntheticModel(num_candidates=4))
    cal = json.loads((run / "calibration.json").read_text())
    (run / "calibration.json").write_text(json.dumps({**cal, "model": "another"}))
    with pytest.raises(CalibrationError, match="calibration's model is 'another'"):
        load_run(run)
    assert load_run(run, check_calibration=False).calibration.model == "another"
    assert main(["ablate", str(run), "--only", "table7"]) == 1
    assert "calibration's model is 'another'" in capsys.readouterr().err
    assert main(["ablate", str(run), "--only", "table7", "--no-calibration-check"]) == 0


def test_transfer_refuses_a_calibration_of_records_prepared_otherwise(tmp_path):
    model = SyntheticModel(num_candidates=4)
    native = load_run(write_run_dir(tmp_path / "native", model))
    official = load_run(write_run_dir(tmp_path / "at336", model, image_size=336))
    again = load_run(write_run_dir(tmp_path / "again", SyntheticModel(num_candidates=4, seed=5)))
    assert official.calibration.preprocessing["image_size"] == 336
    table = transfer_table([native, official, again])
    pairs = {(p["calibration"], p["records"]) for p in table.data["pairs"]}
    assert pairs == {("native", "again"), ("again", "native")}
    reasons = {m.reason.split(":")[0]: m.reason for m in table.missing}
    assert set(reasons) == {"again → at336", "native → at336", "at336 → again", "at336 → native"}
    assert reasons["again → at336"] == (
        "again → at336: calibration.json: the calibration was fitted on records made with no "
        "--image-size (pictures as they are), but these records are made with --image-size 336; "
        "recalibrate with the same --image-size, or skip this check on purpose "
        "(--no-calibration-check)"
    )
    assert reasons["at336 → native"].startswith(
        "at336 → native: calibration.json: the calibration was fitted on records made with "
        "--image-size 336, but"
    )


def test_cli_lists_what_is_missing_and_fails_when_nothing_can_be_made(tmp_path, capsys):
    run = write_run_dir(tmp_path / "run", SyntheticModel(num_candidates=4), perm=False)
    assert main(["ablate", str(run)]) == 0
    out = capsys.readouterr().out
    assert f"page: {run / 'ablate' / 'index.html'}" in out
    assert "Not possible with these runs:" in out and "perm-avg for run: no perm_records" in out
    summary = json.loads((run / "ablate" / "summary.json").read_text())
    assert set(summary["analyses"]) == {"table4", "fig6a", "fig6b", "table7"}
    assert main(["ablate", str(run), "--only", "fig5,table8"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("Error: none of the analyses can be made from these runs:")
    assert "fig5: Figure 5 needs runs of at least two N" in err
    assert main(["ablate", str(run), "--calibration-items", "9"]) == 1
    assert capsys.readouterr().err == (
        "Error: run holds 5 calibration items, fewer than 9 (lad eval --calibration-items 9)\n"
    )
    assert main(["ablate", str(run), "--calibration-items", "4", "--only", "table7"]) == 0
    assert (
        "run: 4 of its 5 calibration items (seed 0)"
        in (run / "ablate" / "table7_divergence.md").read_text()
    )


def test_html_and_markdown_escape_what_they_show(tmp_path):
    run = synthetic_run(SyntheticModel(num_candidates=4), "<script>x|y</script>", items=20)
    write_ablation(ablate([run], only=["table7"]), tmp_path)
    page = (tmp_path / "index.html").read_text()
    assert "<script>" not in page and "&lt;script&gt;x|y&lt;/script&gt;" in page
    md = (tmp_path / "table7_divergence.md").read_text()
    assert "| <script>x\\|y</script> | 1 |" in md


# ---------------------------------------------------------------------------------------------
# lad eval keeps every calibration record, so |D_cal| subsets can be drawn.


def test_calibration_items_are_all_kept(tmp_path):
    from lad.data.shapes import build_shapes

    shapes = eval_config(calibration_items=100, items=3)
    evaluation, calibration = load_items(shapes, tmp_path / "shapes")
    assert (len(evaluation), len(calibration)) == (3, 100)
    assert len(cyclic_requests(calibration)) == 400  # calibration.jsonl: every item × N shifts

    items = build_shapes(tmp_path / "items", num_candidates=4, items=110, image_size=16)
    held_out = eval_config(data=str(items), calibration_items=100)
    evaluation, calibration = load_items(held_out, tmp_path / "run")
    assert (len(evaluation), len(calibration)) == (10, 100)

    # A --calibration-data file with fewer items than --calibration-items is refused, never cut
    # silently (issue 23): the run would calibrate on fewer items than run.json says.
    few = build_shapes(tmp_path / "few", num_candidates=4, items=3, split="calibration")
    config = eval_config(data=str(items), calibration_data=str(few), calibration_items=100)
    with pytest.raises(DataError, match=r"holds 3 items but --calibration-items asks for 100"):
        load_items(config, tmp_path / "run")


# ---------------------------------------------------------------------------------------------
# End to end on a real lad eval run of the demo model.


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory) -> Path:
    """A default `lad eval` run of the demo model, on 20 items."""
    from lad.evaluate import evaluate

    run = tmp_path_factory.mktemp("demo") / "run"
    evaluate(eval_config(items=20, quiet=True, device="cpu"), run)
    return run


def test_lad_ablate_on_a_demo_run(demo_run, tmp_path, capsys):
    out = tmp_path / "ablate"
    assert main(["ablate", str(demo_run), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    for stem in ("table4_ablation", "fig6a_calibration_size", "fig6b_temperature",
                 "table7_divergence", "table8_cost"):  # fmt: skip
        for ext in ("md", "json"):
            assert (out / f"{stem}.{ext}").stat().st_size > 0
        assert (out / f"{stem}.png").read_bytes()[:4] == b"\x89PNG"
        assert f'src="{stem}.png"' in (out / "index.html").read_text()
    assert "lad eval --calibration-items 100" in printed
    # The ablation's paper-default row is the run's own LAD row of metrics.json.
    metrics = json.loads((demo_run / "metrics.json").read_text())["methods"]
    rows = json.loads((out / "table4_ablation.json").read_text())["data"]["rows"]
    default = next(r for r in rows if r["strategy"] == "Dynamic" and r["prior"] and r["k"] == 2)
    readout = next(r for r in rows if r["strategy"] == "Attn Readout" and not r["prior"])
    assert default["acc"] == metrics["lad"]["acc"] and readout["acc"] == metrics["attn"]["acc"]
    assert default["layers_used"] == 2 and rows[-1]["k"] == 8 and rows[-1]["layers_used"] == 4
    cost = json.loads((out / "table8_cost.json").read_text())["data"]["rows"]
    assert {r["method"]: r["acc"] for r in cost}["perm-avg"] == metrics["perm-avg"]["acc"]


# ---------------------------------------------------------------------------------------------
# Issue 26: Figure 6(a) as the paper draws it, every refused transfer, K above L everywhere.


def test_figure6a_band_is_the_std_over_evaluation_shuffles(run4, tmp_path):
    # The paper's caption: "Shaded regions denote the standard deviation across 5 random
    # shuffles". The band is each subset's std over the shuffles, averaged over the subsets; the
    # spread over the subsets is kept as a second quantity.
    table = calibration_size_sweep(run4, AblateOptions(sizes=(3, 12), subsets=4))
    cal = run4.calibration_records
    for point in table.data["points"]:
        fits = [Calibration().fit(cal.select(np.isin(cal.items, s))) for s in point["subsets"]]
        for method in ("lad", "pride"):
            got = [direct(run4, method, f) for f in fits]
            acc = [m["acc"] for m in got]
            assert point[f"{method}_acc"] == acc
            assert point[f"{method}_acc_shuffle_std"] == [m["acc_std"] for m in got]
            assert point[f"{method}_mean"] == pytest.approx(np.mean(acc), abs=1e-12)
            band = np.mean([np.std(m["acc_by_shuffle"], ddof=1) for m in got])
            assert point[f"{method}_shuffle_std"] == pytest.approx(band, abs=1e-9)
            spread = np.std(acc, ddof=1) if len(acc) > 1 else 0.0
            assert point[f"{method}_subset_std"] == pytest.approx(spread, abs=1e-12)
    full = table.data["points"][-1]
    assert full["size"] == 12 and len(full["subsets"]) == 1 and full["lad_subset_std"] == 0.0
    assert full["lad_shuffle_std"] == direct(run4, "lad")["acc_std"] > 0  # was ± 0.00
    row = table.rows[-1]
    assert row[3] == f"{full['lad_mean']:.2f} ± {full['lad_shuffle_std']:.2f}"
    assert table.columns[-2:] == ["LAD subset std", "PriDe subset std"]
    assert "std over the 5 evaluation shuffles (the paper's band" in table.caption


def _cli_run(tmp_path: Path, name: str, n: int = 4, **arguments) -> Path:
    return write_run_dir(tmp_path / name, SyntheticModel(num_candidates=n), items=10, **arguments)


def test_table3_lists_every_refused_pair(tmp_path, capsys):
    r4, r8 = _cli_run(tmp_path, "r4"), _cli_run(tmp_path, "r8", n=8)
    a6, t6 = _cli_run(tmp_path, "a6", n=6), _cli_run(tmp_path, "t3", n=3)
    runs = load_runs([r4, r8, a6, t6])
    result = ablate(runs, only=["table3"])
    assert not result.tables
    pairs = [m.reason.split(":")[0] for m in result.missing]
    names = ["r4", "r8", "a6", "t3"]
    assert pairs == [f"{a} → {b}" for a in names for b in names if a != b]  # all 12
    with pytest.raises(AnalysisError) as e:
        transfer_table(runs)
    assert len(e.value.missing) == 12 and "t3 → r4" in str(e.value)

    out = tmp_path / "out"
    assert main(["ablate", str(r4), str(r8), "--only", "table3", "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert "table3: r4 → r8: Table 3 transfers" in err and "table3: r8 → r4: Table" in err
    # Next to a table that is made: every refused pair in the output and in summary.json.
    assert main(["ablate", str(r4), str(r8), "--only", "table3,table7", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "table3: r4 → r8" in printed and "table3: r8 → r4" in printed
    summary = json.loads((out / "summary.json").read_text())
    assert [m["reason"].split(":")[0] for m in summary["missing"]] == ["r4 → r8", "r8 → r4"]


def test_no_calibration_check_is_honoured_for_transfer(tmp_path, capsys):
    native, at336 = _cli_run(tmp_path, "native"), _cli_run(tmp_path, "at336", image_size=336)
    runs = load_runs([native, at336])
    with pytest.raises(AnalysisError, match="--no-calibration-check"):
        transfer_table(runs)
    table = transfer_table(runs, AblateOptions(check_calibration=False))
    pairs = {(p["calibration"], p["records"], p["method"]): p for p in table.data["pairs"]}
    assert len(pairs) == 6 and not table.missing
    moved = pairs["native", "at336", "lad"]["transferred"]["acc"]
    assert moved == direct(runs[1], "lad", runs[0].calibration)["acc"]
    assert "without checking" in table.caption and "--no-calibration-check" in table.caption
    # N and the layer count are still checked.
    r8 = load_run(_cli_run(tmp_path, "r8", n=8))
    unchecked = transfer_table([*runs, r8], AblateOptions(check_calibration=False))
    assert len(unchecked.missing) == 4 and all("same N" in m.reason for m in unchecked.missing)

    out = tmp_path / "out"
    args = ["ablate", str(native), str(at336), "--only", "table3", "--out", str(out)]
    assert main(args) == 1
    assert "skip this check on purpose (--no-calibration-check)" in capsys.readouterr().err
    assert main([*args, "--no-calibration-check"]) == 0
    assert "without checking" in (out / "table3_transfer.md").read_text()


def test_a_missing_calibration_jsonl_is_named(tmp_path, capsys):
    run = _cli_run(tmp_path, "run")
    (run / "calibration.jsonl").unlink()
    with pytest.raises(AnalysisError, match=r"calibration\.jsonl is missing") as e:
        load_run(run).calibration_items()
    assert "--calibration file" not in str(e.value)
    assert main(["ablate", str(run), "--only", "fig6a"]) == 1
    err = capsys.readouterr().err
    assert f"run holds no calibration records: {run / 'calibration.jsonl'} is missing" in err
    assert main(["ablate", str(run), "--calibration-items", "3"]) == 1
    assert "calibration.jsonl is missing" in capsys.readouterr().err


def test_top_k_above_the_layer_count_is_clamped_everywhere(run4, tmp_path, monkeypatch):
    import lad.outputs.ablate.report as report

    options = AblateOptions(MethodOptions(top_k=20), ks=(1, 20), sizes=(3,), subsets=2)
    result = ablate([run4], options, only=["table4", "fig6a", "fig6b", "table7", "table8"])
    assert not result.missing or all(m.analysis == "table8" for m in result.missing)
    tables = {t.key: t for t in result.tables}
    assert set(tables) == {"table4", "fig6a", "fig6b", "table7", "table8"}
    for table in tables.values():
        assert "K = 20 (= all 12)" in table.caption, table.key
    fig6b = {r["tau"]: r for r in tables["fig6b"].data["points"]}
    assert fig6b[5.0]["acc"] == direct(run4, "lad", top_k=12)["acc"]
    table7 = tables["table7"].data["runs"][0]["methods"]
    assert table7["lad"]["acc"] == direct(run4, "lad", top_k=12)["acc"]
    rows = rows_by(tables["table4"], "strategy", "prior", "k")
    assert rows["Dynamic", True, 20]["k_shown"] == "20 (= all 12)"
    assert rows["Dynamic", True, 20]["acc"] == direct(run4, "lad", top_k=12)["acc"]

    drawn = {}

    def keep(fig, path):
        drawn[path.name] = [
            (ax.get_title(), [t.get_text() for t in ax.get_yticklabels()]) for ax in fig.axes
        ]

    monkeypatch.setattr(report, "_save", keep)
    write_ablation(result, tmp_path)
    _, labels = drawn["table4_ablation.png"][0]
    assert "Dynamic ✓ K=20 (= all 12)" in labels and "Dynamic ✓ K=1" in labels
    assert "Attn Readout – K=20 (= all 12)" in labels
    for name in ("fig6a_calibration_size.png", "fig6b_temperature.png", "table7_divergence.png"):
        assert "K = 20 (= all 12)" in drawn[name][0][0], name
    md = (tmp_path / "table4_ablation.md").read_text()
    assert "| Dynamic | ✓ | 20 (= all 12) |" in md
