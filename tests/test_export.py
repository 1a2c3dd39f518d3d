"""`lad export --format facet-probe`: one Facet-Probe TrialRecord per (method, item, ordering) of a
run, a mixed run and a harness audit, checked against Facet-Probe's schema as its
`facet_probe.schema.TrialRecord` (tag v0.0.1, and main's commit beb327e) defines and reads
it, and, where Facet-Probe is installed (LAD_FACET_PROBE_PYTHON: a Python that imports
facet_probe), by its own reader and audit."""

from __future__ import annotations

import json
import os
import subprocess
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest

from lad.cli import main
from lad.data.items import read_items, write_items
from lad.data.shapes import build_shapes, shapes_vocabulary
from lad.evaluate import evaluate
from lad.harness.audit import write_rows_audit
from lad.outputs.export import facet_probe_trials
from lad.testing.tiny import build_tiny_model
from tests.runfiles import small_config

# Facet-Probe's TrialRecord, field by field (schema.py): name -> the types from_mapping keeps.
TRIAL_SCHEMA = {
    "facet": (str,),
    "dataset": (str,),
    "item_id": (str,),
    "ordering_idx": (int,),
    "permutation": (list,),
    "model": (str, type(None)),
    "answer_normalized": (str, type(None)),
    "gold_normalized": (str, type(None)),
    "correct": (bool, type(None)),
    "score_kind": (str, type(None)),
}
# Facet-Probe's facets (configs/facets.yaml)
FACETS = {"option_order", "evidence_chunk_order", "document_rank_order", "image_set_order",
          "mixed_modality_order", "dialog_turn_order", "few_shot_order"}  # fmt: skip


def check_trial(row: dict) -> None:
    """What Facet-Probe's TrialRecord.from_mapping reads a row as, and its invariants."""
    for key, kinds in TRIAL_SCHEMA.items():
        assert key in row and isinstance(row[key], kinds), (key, row.get(key))
    assert not isinstance(row["ordering_idx"], bool)
    assert row["facet"] in FACETS
    perm = row["permutation"]
    assert sorted(perm) == list(range(len(perm))) and all(type(i) is int for i in perm)
    if row["answer_normalized"] is not None:
        assert row["correct"] == (row["answer_normalized"] == row["gold_normalized"])


def fp_audit(rows: list[dict]) -> dict[str, dict[str, float]]:
    """Facet-Probe's item metrics (metrics.item_metrics), per model: flip = more than one
    distinct answer over an item's orderings; accuracy = mean of correct."""
    by = defaultdict(lambda: defaultdict(list))
    for r in rows:
        by[r["model"]][(r["facet"], r["dataset"], r["item_id"])].append(r)
    out = {}
    for model, items in by.items():
        flips = [len({t["answer_normalized"] for t in ts} - {None}) > 1 for ts in items.values()]
        accs = [np.mean([bool(t["correct"]) for t in ts]) for ts in items.values()]
        out[model] = {"flip_rate": float(np.mean(flips)), "acc": float(np.mean(accs) * 100)}
    return out


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("export")
    kw = {"num_candidates": 3, "setting": "random", "seed": 2, "image_size": 32}
    bench = (
        build_shapes(root / "eval", items=4, split="eval", **kw),
        build_shapes(root / "cal", items=2, split="calibration", **kw),
    )
    model = str(build_tiny_model("qwen2_vl", root / "model", words=shapes_vocabulary()))
    config = small_config(model, bench, num_candidates=3, dtype="float32",
                          methods=("vanilla", "pride", "lad", "perm-avg"))  # fmt: skip
    evaluate(config, root / "run")
    return root / "run"


def test_export_of_a_run_is_one_trial_per_method_item_and_ordering(run, tmp_path, capsys):
    out = tmp_path / "trials.jsonl"
    assert main(["export", str(run), "--format", "facet-probe", "--out", str(out)]) == 0
    assert "wrote 32 Facet-Probe trials" in capsys.readouterr().out
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    records = [json.loads(line) for line in (run / "records.jsonl").read_text().splitlines()]
    assert len(rows) == 4 * len(records) == 4 * 4 * 2
    keys = {(r["model"], r["item_id"], r["ordering_idx"]) for r in rows}
    assert len(keys) == len(rows)
    metrics = json.loads((run / "metrics.json").read_text())["methods"]
    audit = fp_audit(rows)
    for row in rows:
        check_trial(row)
        assert row["facet"] == "image_set_order" and row["dataset"] == "items"
        assert row["score_kind"] == "option_content_idx"
    by_key = {(r["item"], r["ordering"]): r for r in records}
    for row in rows:
        rec = by_key[(row["item_id"], row["ordering_idx"])]
        assert row["permutation"] == rec["order"]
        assert row["gold_normalized"] == str(rec["order"][rec["answer"]])
        assert row["answer_normalized"] == str(rec["order"][row["position"]])
    for method, m in metrics.items():
        got = audit[f"{json.loads((run / 'run.json').read_text())['arguments']['model']}:{method}"]
        assert got["acc"] == pytest.approx(m["acc"])  # the trials' accuracy is lad's Acc
        assert got["flip_rate"] * 100 == pytest.approx(100 - m["cons"])  # Facet-Probe's flip
    gold = {r["item_id"]: r["gold_normalized"] for r in rows}
    assert all(r["gold_normalized"] == gold[r["item_id"]] for r in rows)  # content, not place


def test_export_of_a_harness_audit_reads_its_rows(tmp_path):
    rows = []
    for item in range(3):
        for ordering in range(3):
            order = [(k + ordering) % 3 for k in range(3)]
            rows.append({"item": f"d{item}", "ordering": ordering, "order": order,
                         "answer": order.index(0), "prediction": 0 if item else -1})  # fmt: skip
    rows.append({**rows[1], "repeat": 1})  # asked again: no trial of its own
    write_rows_audit({"muirbench_circular": rows}, tmp_path, "lmms-eval samples")
    trials = list(facet_probe_trials(tmp_path))
    assert len(trials) == 9
    for t in trials:
        check_trial(t)
        assert t["dataset"] == "muirbench_circular" and t["facet"] == "image_set_order"
    none = [t for t in trials if t["item_id"] == "d0"]
    assert all(t["answer_normalized"] is None and t["correct"] is False for t in none)


def test_export_of_a_mixed_run_names_each_cell_s_task(tmp_path):
    parts = []
    for n, task in ((2, "pairs"), (3, "triples")):
        kw = {"num_candidates": n, "setting": "random", "seed": n, "image_size": 32}
        for it in read_items(build_shapes(tmp_path / f"d{n}", items=4, split="eval", **kw)):
            it.extra = {**it.extra, "task": task}
            parts.append(it)
    write_items(tmp_path / "mixed.jsonl", parts)
    model = str(build_tiny_model("qwen2_vl", tmp_path / "model", words=shapes_vocabulary()))
    config = small_config(model, (tmp_path / "mixed.jsonl", tmp_path / "mixed.jsonl"),
                          calibration_data=None, calibration_items=1, dtype="float32",
                          methods=("vanilla", "lad"))  # fmt: skip
    evaluate(config, tmp_path / "run")
    trials = list(facet_probe_trials(tmp_path / "run"))
    assert {(t["dataset"], t["num_candidates"]) for t in trials} == {("pairs", 2), ("triples", 3)}
    assert len(trials) == 2 * (3 + 3) * 2  # methods × evaluated items × shuffles
    for t in trials:
        check_trial(t)


def test_export_refuses_a_folder_that_is_no_run(tmp_path, capsys):
    assert main(["export", str(tmp_path), "--out", str(tmp_path / "t.jsonl")]) == 1
    assert capsys.readouterr().err.startswith("Error: ")


FACET_PROBE = os.environ.get("LAD_FACET_PROBE_PYTHON")


@pytest.mark.skipif(not FACET_PROBE, reason="LAD_FACET_PROBE_PYTHON (a Python with facet_probe)")
def test_facet_probe_s_own_reader_accepts_the_export(run, tmp_path):
    out = tmp_path / "trials.jsonl"
    assert main(["export", str(run), "--out", str(out)]) == 0
    script = (
        "import json, sys\n"
        "from facet_probe.metrics import read_jsonl, summarize_groups\n"
        "from facet_probe.schema import TrialRecord\n"
        "rows = read_jsonl(sys.argv[1])\n"
        "trials = [TrialRecord.from_mapping(r) for r in rows]\n"
        "assert all(t.permutation and t.correct is not None for t in trials)\n"
        "print(json.dumps(summarize_groups(rows)))\n"
    )
    done = subprocess.run([FACET_PROBE, "-c", script, str(out)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    groups = {g["model"]: g for g in json.loads(done.stdout)}
    metrics = json.loads((run / "metrics.json").read_text())["methods"]
    for method, m in metrics.items():
        group = next(g for name, g in groups.items() if name.endswith(f":{method}"))
        assert group["macro_accuracy"] * 100 == pytest.approx(m["acc"])
        assert group["flip_rate"] * 100 == pytest.approx(100 - m["cons"])
