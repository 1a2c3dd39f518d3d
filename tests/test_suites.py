"""Mixed items files and suites (docs/suites.md, docs/formats.md "Mixed runs"): a mixed run's
cells equal each cell run alone (byte-equal records, equal metrics); the built-in suites' paper
numbers are the paper's text; `lad suite run table5` on the demo model prints Table 5's layout
with the paper's LLaVA-OV row beside lad's; a suite of shapes cells at several N and the
released-schema fixtures of MMIU, MuirBench and BLINK runs on the demo model, only rescores
its finished cells on a rerun, and its table holds each run's own numbers."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from lad.cli import main
from lad.data.items import read_items
from lad.suites import load_suite
from tests.data_fixtures import make_images
from tests.test_benchmarks_end_to_end import _downloads
from tests.test_data_mmiu import FAKE, FORGERY_OPTIONS, _write_parquet

PAPER = Path(os.environ.get("LAD_PAPER_TEXT", "/work/shared/reference/paper-2605.11591.txt"))
FAST = ["--num-shuffles", "2", "--calibration-items", "2", "--quiet", "--device", "cpu"]
METHODS = ["--methods", "vanilla,pride,lad,attn-purified,perm-avg"]


def _shapes_mixed(root: Path) -> Path:
    """A mixed items file: shapes items at N = 3 and 4, two tasks at each N."""
    lines = []
    for n in (3, 4):
        assert main(["data", "shapes", "-n", str(n), "--items", "8", "--seed", str(n),
                     "--out", str(root / f"s{n}")]) == 0  # fmt: skip
        for k, line in enumerate((root / f"s{n}" / "items.jsonl").read_text().splitlines()):
            obj = json.loads(line)
            obj["id"] = f"n{n}-{obj['id']}"
            obj["images"] = [f"s{n}/{p}" for p in obj["images"]]
            obj["task"] = "alpha" if k % 2 else "beta"
            lines.append(json.dumps(obj))
    path = root / "mixed.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_a_mixed_run_refuses_a_bad_orders_file_before_any_write(tmp_path, capsys):
    """Each part's requests are made with its items, before the run begins: a bad --orders is
    refused leaving no run directory, naming the user's file (not the part's copy of it)."""
    mixed = _shapes_mixed(tmp_path)
    ids = [json.loads(line)["id"] for line in mixed.read_text().splitlines()]
    orders = tmp_path / "bad.orders.jsonl"
    rows = [{"item": i, "order": [0, 1, 2] if i.startswith("n3-") else [0, 1, 2, 3]} for i in ids]
    rows[-1]["order"] = [0, 0, 1, 2]
    orders.write_text("".join(json.dumps(r) + "\n" for r in rows))
    run = tmp_path / "run"
    args = ["eval", "--data", str(mixed), "--orders", str(orders), "--out", str(run), *FAST[2:]]
    assert main(args) == 1
    error = capsys.readouterr().err
    assert f"{orders} (its N = 4 items):" in error and "is not a permutation" in error, error
    assert not run.exists()


def test_a_mixed_run_gives_each_cell_as_run_alone(tmp_path, capsys):
    mixed = _shapes_mixed(tmp_path)
    run = tmp_path / "run"
    assert main(["eval", "--data", str(mixed), "--out", str(run), *FAST, *METHODS]) == 0
    printed = capsys.readouterr().out
    assert "overall (item-weighted)" in printed and "task alpha" in printed
    cells = json.loads((run / "cells.json").read_text())["cells"]
    assert [(c["task"], c["num_candidates"]) for c in cells] == [
        ("beta", 3), ("alpha", 3), ("beta", 4), ("alpha", 4)
    ]  # fmt: skip
    metrics = json.loads((run / "metrics.json").read_text())
    for cell in cells:
        n, part = cell["num_candidates"], run / cell["part"]
        held = {json.loads(line)["item"] for line in (part / "calibration.jsonl").open()}
        ids = [i for i in cell["items"] if i not in held]
        alone_items = tmp_path / f"{cell['task']}{n}.jsonl"
        alone_items.write_text(
            "".join(line for line in mixed.open() if json.loads(line)["id"] in ids)
        )
        mine = [line for line in (part / "records.jsonl").open() if json.loads(line)["item"] in ids]
        orders = tmp_path / f"{cell['task']}{n}.orders.jsonl"
        orders.write_text("".join(mine))
        alone = tmp_path / f"alone-{cell['task']}{n}"
        args = ["eval", "--data", str(alone_items), "-n", str(n), "--out", str(alone)]
        args += ["--calibration", str(part / "calibration.json"), "--orders", str(orders)]
        assert main([*args, "--quiet", "--device", "cpu", *METHODS]) == 0
        assert (alone / "records.jsonl").read_bytes() == "".join(mine).encode()
        alone_metrics = json.loads((alone / "metrics.json").read_text())
        name = f"{cell['task']} N={n}"
        assert metrics["cells"][name]["methods"] == alone_metrics["methods"]
        assert metrics["cells"][name]["num_items"] == len(ids)
    # groups: item-weighted means of the cells, with the weights shown
    overall = metrics["groups"]["overall"]
    assert overall["weights"] == {k: v["num_items"] for k, v in metrics["cells"].items()}
    total = sum(overall["weights"].values())
    expected = sum(w * metrics["cells"][k]["methods"]["lad"]["acc"]
                   for k, w in overall["weights"].items()) / total  # fmt: skip
    assert overall["methods"]["lad"]["acc"] == pytest.approx(expected)
    assert set(metrics["groups"]["task"]) == {"alpha", "beta"}
    assert set(metrics["groups"]["num_candidates"]) == {"3", "4"}

    # resumed: the same bytes, nothing made again; its calibrations as --calibration DIR
    before = {p: p.read_bytes() for p in run.rglob("*.jsonl")}
    assert main(["eval", "--data", str(mixed), "--out", str(run), *FAST, *METHODS]) == 0
    assert {p: p.read_bytes() for p in run.rglob("*.jsonl")} == before
    again = tmp_path / "again"
    held = {
        json.loads(line)["item"]
        for n in (3, 4)
        for line in (run / f"n{n}" / "calibration.jsonl").open()
    }
    evaluated = tmp_path / "evaluated.jsonl"
    evaluated.write_text(
        "".join(line for line in mixed.open() if json.loads(line)["id"] not in held)
    )
    args = ["eval", "--data", str(evaluated), "--out", str(again), "--calibration", str(run)]
    records = "".join((run / f"n{n}" / "records.jsonl").read_text() for n in (3, 4))
    (tmp_path / "all.orders.jsonl").write_text(records)
    assert main([*args, "--orders", str(tmp_path / "all.orders.jsonl"), *FAST[4:], *METHODS]) == 0
    for n in (3, 4):
        assert (again / f"n{n}" / "records.jsonl").read_bytes() == (
            run / f"n{n}" / "records.jsonl"
        ).read_bytes()
    assert json.loads((again / "metrics.json").read_text())["cells"] == metrics["cells"]

    # every reader of a run understands it: report (one row per cell) and ablate (its parts)
    assert main(["report", str(run), "--out", str(tmp_path / "report")]) == 0
    page = (tmp_path / "report" / "index.html").read_text()
    assert "<td>alpha N=4</td>" in page and "overall (item-weighted)" in page
    assert main(["ablate", str(run), "--out", str(tmp_path / "ablate"), "--only", "fig5"]) == 0
    capsys.readouterr()
    part = run / "n4"
    args = ["score", "--records", str(part / "records.jsonl"), "--calibration"]
    args += [str(part / "calibration.json"), "--methods", "vanilla,lad"]
    assert main([*args, "--out", str(tmp_path / "p.jsonl")]) == 0
    table = capsys.readouterr().out
    lad_acc = metrics["cells"]["alpha N=4"]["methods"]["lad"]["acc"]
    assert re.search(rf"^alpha N=4 +2 +[\d.]+ +{lad_acc:.2f}", table, re.M), table
    args = ["metrics", "--records", str(part / "records.jsonl"), "--predictions"]
    assert main([*args, str(tmp_path / "p.jsonl"), "--json"]) == 0
    measured = json.loads(capsys.readouterr().out)
    assert (
        measured["cells"]["alpha N=4"]["methods"]["lad"]
        == (metrics["cells"]["alpha N=4"]["methods"]["lad"])
    )


def test_calibration_folder_must_hold_every_n(tmp_path, capsys):
    mixed = _shapes_mixed(tmp_path)
    folder = tmp_path / "cal"
    folder.mkdir()
    args = ["eval", "--data", str(mixed), "--out", str(tmp_path / "r"), "--calibration"]
    assert main([*args, str(folder), *FAST[:4]]) == 1
    err = capsys.readouterr().err
    assert "no calibration.n3.json" in err and str(folder) in err
    assert not (tmp_path / "r").exists()


# ---------------------------------------------------------------- the paper's numbers


def _paper_lines(start: str, stop: str) -> list[str]:
    lines = PAPER.read_text(encoding="utf-8").splitlines()
    at = next(k for k, line in enumerate(lines) if line.startswith(start))
    out = []
    for line in lines[at:]:
        if line.strip().startswith(stop):
            break
        out.append(line)
    return out


METHOD_NAMES = {
    "Vanilla": "vanilla",
    "Instruction": "instruction",
    "CoT": "cot",
    "PriDe": "pride",
    "Self-Consistency": "self-consistency",
    "Ours": "lad",
}
TABLES = [("Table 1.", "raw logits", 4), ("Table 6.", "D.2.", 8)]


@pytest.mark.skipif(not PAPER.is_file(), reason="the paper's text is not here (LAD_PAPER_TEXT)")
@pytest.mark.parametrize(
    ("table", "stop", "n"), [("Table 1.", "raw logits", 4), ("Table 6.", "D.2.", 8)]
)
def test_table1_numbers_are_the_papers(table, stop, n):
    paper = load_suite("table1").paper
    models = ["Qwen2.5-VL-3B", "LLaVA-OneVision-8B", "InternVL-3-8B"]
    number = re.compile(r"(\d+\.\d+)±(\d+\.\d+)\s+(\d+\.\d+)\s+(\d+\.\d+)")
    setting, seen, checked = "random", set(), 0
    for line in _paper_lines(table, stop):
        m = re.match(r"\s*(?:Random|Adversarial)?\s*(" + "|".join(METHOD_NAMES) + r")\s+(.*)", line)
        groups = number.findall(m.group(2)) if m else []
        if len(groups) != 3:
            continue
        method = METHOD_NAMES[m.group(1)]
        if method in seen:
            setting, seen = "adversarial", set()
        seen.add(method)
        for model, values in zip(models, groups, strict=True):
            stored = paper[model][f"coco {setting} N={n}"][method]
            assert [stored[k] for k in ("acc", "acc_std", "rstd", "cons")] == [
                float(v) for v in values
            ], (model, setting, method)
            checked += 1
    stored = sum(len(v) for m in models for k, v in paper[m].items() if k.endswith(f"N={n}"))
    assert checked == stored == (36 if n == 4 else 30)


@pytest.mark.skipif(not PAPER.is_file(), reason="the paper's text is not here (LAD_PAPER_TEXT)")
def test_table5_numbers_are_the_papers():
    paper = load_suite("table5").paper["LLaVA-OV"]
    row = re.compile(r"^(\w+ \w+)\s+(\d+\.\d)\s+(\d+\.\d)\s+(\d+\.\d)\s+([−-]\d+\.\d)")
    found = {}
    for line in _paper_lines("Table 5.", "5.7."):
        m = row.match(line.strip())
        if m:
            found[m.group(1)] = [float(v.replace("−", "-")) for v in m.groups()[1:]]
    assert set(found) == set(paper)
    for task, (vanilla, purattn, ours, delta) in found.items():
        got = paper[task]
        assert [got["vanilla"]["acc"], got["attn-purified"]["acc"], got["lad"]["acc"]] == [
            vanilla, purattn, ours
        ]  # fmt: skip
        assert got["lad"]["delta_rstd"] == delta


# ---------------------------------------------------------------- suites on the demo model

TABLE5_TASKS = {
    "forensic_detection_forgerynet": "Low-level-semantic",
    "forensic_detection_blink": "Low-level-semantic",
    "emotion_recognition_expw": "Discrete-temporal",
    "emotion_recognition_findingemo": "Discrete-temporal",
    "text2image_retrieval": "High-level-obj-semantic",
    "visual_quality_assessment_ve_lol_l": "Low-level-semantic",
}


def _mmiu_six(root: Path) -> Path:
    """MMIU's all.parquet and pictures in its released layout, seven 4-picture questions for each
    of Table 5's tasks (what lad data mmiu reads)."""
    rows = []
    for t, (task, relationship) in enumerate(TABLE5_TASKS.items()):
        folder = root / relationship / task
        names = make_images(folder, 28, seed=t)
        for q in range(7):
            paths = []
            for i in range(4):
                name = f"{task}_{q}_{i}.jpg"
                (folder / names[4 * q + i]).rename(folder / name)
                paths.append(f"./{relationship}/{task}/{name}")
            rows.append({
                "task": task, "visual_input_component": "natural image", "source": task,
                "options": FORGERY_OPTIONS, "question": FAKE,
                "context": "Select from the following choices.\n" + FORGERY_OPTIONS,
                "input_image_path": paths, "output": "ABCD"[q % 4],
            })  # fmt: skip
    _write_parquet(root / "all.parquet", rows)
    return root


def test_table5_on_the_demo_model_prints_the_papers_row_beside_lads(tmp_path, capsys):
    mmiu = _mmiu_six(tmp_path / "MMIU")
    out = tmp_path / "t5"
    args = ["suite", "run", "table5", "--model", "demo", "--data-root", str(mmiu)]
    assert main([*args, "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "Table 5" in printed
    head = next(line for line in printed.splitlines() if line.startswith("cell"))
    assert head.split()[1:] == ["Vanilla", "PriDe", "Blank", "PurAttn", "Ours", "ΔRStd"]
    lines = printed.splitlines()
    for task in ("forensic forgerynet", "visual quality"):
        at = next(k for k, line in enumerate(lines) if line.startswith(task))
        assert "lad demo" in lines[at]
        lad = json.loads((out / "demo" / task.replace(" ", "-") / "metrics.json").read_text())
        shown = [float(v) for v in lines[at].split()[-6:]]
        m = lad["methods"]
        wanted = [m[k]["acc"] for k in ("vanilla", "pride", "blank", "attn-purified", "lad")]
        assert shown == pytest.approx([*wanted, m["lad"]["delta_rstd"]], abs=0.006)
        assert "paper LLaVA-OV" in lines[at + 1]
        assert "Δ demo − paper LLaVA-OV" in lines[at + 2]
    # forgerynet's paper row: the paper has no PriDe or blank column
    assert "35.00           -           -       86.00       87.40      -39.70" in printed
    # rerun: every cell finished, skipped, the same table
    assert main([*args, "--out", str(out)]) == 0
    again = capsys.readouterr().out
    assert again.count(": finished") == 6
    assert again.split("\n", 6)[-1] == printed.split("\n", 6)[-1]


def test_a_suite_refuses_a_missing_folder_before_any_work(tmp_path, capsys):
    args = ["suite", "run", "table5", "--model", "demo", "--data-root", str(tmp_path / "MMIU")]
    assert main([*args, "--out", str(tmp_path / "out")]) == 1
    assert capsys.readouterr().err.strip() == (
        f"Error: {tmp_path / 'MMIU'}: no such folder (mmiu's data, your download)"
    )
    assert not (tmp_path / "out").exists()
    (tmp_path / "MMIU").mkdir()
    assert main([*args, "--out", str(tmp_path / "out")]) == 1
    assert "all.parquet: not found (mmiu's questions" in capsys.readouterr().err
    args = ["suite", "run", "table1", "--data-root", str(tmp_path), "--out", str(tmp_path / "o")]
    assert main(args) == 1
    assert f"{tmp_path / 'COCO'}: no such folder (coco's data" in capsys.readouterr().err


DEMO_SUITE = """
name = "demo"
title = "demo suite"
[benchmarks.shapes]
kind = "shapes"
[benchmarks.mmiu]
kind = "mmiu"
folder = "MMIU"
[benchmarks.muirbench]
kind = "muirbench"
folder = "MUIRBENCH"
[benchmarks.blink]
kind = "blink"
folder = "BLINK"
[settings]
methods = ["vanilla", "attn-purified", "lad"]
num_shuffles = 2
device = "cpu"
[[cells]]
id = "shapes N=3"
benchmark = "shapes"
num_candidates = 3
items = 6
[[cells]]
id = "shapes N=5"
benchmark = "shapes"
num_candidates = 5
items = 6
[[cells]]
id = "forgerynet"
benchmark = "mmiu"
task = "forensic_detection_forgerynet"
labels = "image-ordinals"
[[cells]]
id = "muir retrieval"
benchmark = "muirbench"
task = "Visual Retrieval"
labels = "upper"
[[cells]]
id = "blink similarity"
benchmark = "blink"
task = "Visual_Similarity"
labels = "upper"
[[models]]
name = "demo"
path = "demo"
[paper.demo."shapes N=3"]
lad = { acc = 50.0 }
"""


def test_a_demo_suite_runs_every_cell_and_tables_their_numbers(tmp_path, capsys):
    _downloads(tmp_path)
    suite = tmp_path / "demo.toml"
    suite.write_text(DEMO_SUITE)
    out = tmp_path / "out"
    assert main(["suite", "run", str(suite), "--data-root", str(tmp_path), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    rows = [line for line in printed.splitlines() if "lad demo" in line]
    assert len(rows) == 5 * 3  # five cells × three methods
    cells = {
        "shapes N=3": "shapes-N-3",
        "shapes N=5": "shapes-N-5",
        "forgerynet": "forgerynet",
        "muir retrieval": "muir-retrieval",
        "blink similarity": "blink-similarity",
    }
    for cell, folder in cells.items():
        methods = json.loads((out / "demo" / folder / "metrics.json").read_text())["methods"]
        line = next(line for line in printed.splitlines() if line.startswith(cell + " "))
        assert line.split()[len(cell.split())] == "vanilla"  # the cell's first row: vanilla
        shown = [float(v) for v in line.split()[-3:]]
        wanted = [methods["vanilla"][k] for k in ("acc", "rstd", "cons")]
        assert shown == pytest.approx(wanted, abs=0.006)
    assert read_items(out / "data" / "blink-similarity.jsonl")[0].num_candidates == 2
    diff = next(line for line in printed.splitlines() if "Δ demo − paper demo" in line)
    lad = json.loads((out / "demo" / "shapes-N-3" / "metrics.json").read_text())["methods"]["lad"]
    assert diff.split()[-3:] == [f"{lad['acc'] - 50.0:+.2f}", "-", "-"]
    # a rerun skips every finished cell and prints the same table
    assert main(["suite", "run", str(suite), "--data-root", str(tmp_path), "--out", str(out)]) == 0
    again = capsys.readouterr().out
    assert again.count(": finished") == 5
    assert again.split("\n", 5)[-1] == printed.split("\n", 5)[-1]


SHAPES_SUITE = """
name = "mine"
[benchmarks.shapes]
kind = "shapes"
[settings]
methods = ["vanilla", "lad"]
num_shuffles = 2
items = 6
device = "cpu"
[[cells]]
id = "s3"
num_candidates = 3
"""


def test_a_rerun_rescores_a_finished_cell_under_changed_scoring_settings(tmp_path, capsys):
    """A scoring setting (Eq. 1's average here) changed since a cell finished: the rerun makes no
    record again and scores the stored ones anew, as a rerun of the cell's lad eval would."""
    suite = tmp_path / "mine.toml"
    suite.write_text(SHAPES_SUITE)
    run = ["suite", "run", str(suite), "--model", "demo", "--out"]

    def lad_acc(out: Path) -> float:
        return json.loads((out / "demo" / "s3" / "metrics.json").read_text())["methods"]["lad"][
            "acc"
        ]

    assert main([*run, str(tmp_path / "a")]) == 0
    before, records = lad_acc(tmp_path / "a"), (tmp_path / "a/demo/s3/records.jsonl").read_bytes()
    suite.write_text(SHAPES_SUITE.replace("items = 6", 'items = 6\nattn_mean = "raw"'))
    capsys.readouterr()
    assert main([*run, str(tmp_path / "a")]) == 0
    assert "[1/1] demo · s3: finished, rescored" in capsys.readouterr().out
    assert (tmp_path / "a/demo/s3/records.jsonl").read_bytes() == records
    assert main([*run, str(tmp_path / "fresh")]) == 0
    assert lad_acc(tmp_path / "a") == lad_acc(tmp_path / "fresh") != before


def test_table1_on_the_demo_model_shows_the_papers_three_models(tmp_path):
    import dataclasses

    from lad.evaluate import run_suite
    from tests.data_fixtures import make_tiny_clip, write_coco

    write_coco(tmp_path / "COCO")
    clip = str(make_tiny_clip(tmp_path / "clip"))
    suite = load_suite("table1")
    coco = dataclasses.replace(
        suite.benchmarks["coco"],
        paths={"images": "images", "captions": "captions.json", "instances": "instances.json"},
        options={"clip": clip},
    )
    cells = [c for c in suite.cells if c.id in ("coco random N=4", "coco adversarial N=4")]
    settings = {"methods": ("vanilla", "pride", "lad"), "items": 4, "num_shuffles": 2}
    suite = dataclasses.replace(
        suite,
        benchmarks={**suite.benchmarks, "coco": coco},
        cells=cells,
        settings={**settings, "device": "cpu"},
    )
    said = []
    result = run_suite(suite, tmp_path / "out", data_roots=[str(tmp_path)], model="demo",
                       compare="InternVL-3-8B", say=said.append)  # fmt: skip
    assert said == [
        "[1/2] demo · coco random N=4: running",
        "[2/2] demo · coco adversarial N=4: running",
    ]
    for cell in ("coco random N=4", "coco adversarial N=4"):
        lad = json.loads((result.runs["demo"][cell] / "metrics.json").read_text())["methods"]
        for method in ("vanilla", "pride", "lad"):
            rows = {r.source: r.values for r in result.rows if (r.cell, r.method) == (cell, method)}
            assert rows["lad demo"] == pytest.approx(
                [lad[method][k] for k in ("acc", "acc_std", "rstd", "cons")]
            )
            for model in ("Qwen2.5-VL-3B", "LLaVA-OneVision-8B", "InternVL-3-8B"):
                paper = suite.paper[model][cell][method]
                assert rows[f"paper {model}"] == [
                    paper[k] for k in ("acc", "acc_std", "rstd", "cons")
                ]
            delta = [
                a - b for a, b in zip(rows["lad demo"], rows["paper InternVL-3-8B"], strict=True)
            ]
            assert rows["Δ demo − paper InternVL-3-8B"] == pytest.approx(delta)
    assert "paper LLaVA-OneVision-8B" in result.table and "98.66" in result.table


def test_where_a_suites_benchmarks_live(tmp_path):
    from lad.errors import DataError
    from lad.suites.data import benchmark_roots

    path = tmp_path / "mine.toml"
    path.write_text(
        '[benchmarks.mmiu]\nkind = "mmiu"\nroot = "MMIU"\n'
        '[benchmarks.blink]\nkind = "blink"\n'
        '[[cells]]\nbenchmark = "mmiu"\ntask = "t"\n[[cells]]\nbenchmark = "blink"\ntask = "u"\n'
    )
    suite = load_suite(path)
    assert [c.id for c in suite.cells] == ["t", "u"]
    with pytest.raises(DataError, match=r"needs the folder of blink: pass --data-root DIR"):
        benchmark_roots(suite, [])
    roots = benchmark_roots(suite, ["blink=/b"])
    assert roots == {"mmiu": tmp_path / "MMIU", "blink": Path("/b")}
    assert benchmark_roots(suite, ["/data"]) == {
        "mmiu": Path("/data/mmiu"),
        "blink": Path("/data/blink"),
    }
    assert benchmark_roots(suite, ["/data", "mmiu=/m"])["mmiu"] == Path("/m")
    path.write_text('[benchmarks.mmiu]\nkind = "mmiu"\nqestions = "x"\n[[cells]]\ntask = "t"\n')
    with pytest.raises(DataError, match=r"mine.toml: \[benchmarks.mmiu\] unknown key 'qestions'"):
        load_suite(path)
    path.write_text('[settings]\nmodel = "x"\n[benchmarks.s]\nkind = "shapes"\n[[cells]]\n')
    with pytest.raises(DataError, match=r"\[settings\] 'model' is not a run setting a suite sets"):
        load_suite(path)
    with pytest.raises(DataError, match=r"nope: neither a suite file nor a built-in suite"):
        load_suite("nope")


SETTING = '[benchmarks.s]\nkind = "shapes"\n[settings]\n{}\n[[cells]]\nnum_candidates = 3\n'


@pytest.mark.parametrize(
    ("given", "read"),
    [
        ("tau = 5", {"tau": 5.0}),
        ("tau = inf", {"tau": float("inf")}),
        ("top_k = 3", {"top_k": 3}),
        ("blank_alpha = 0.5", {"blank_alpha": 0.5}),
        ('blank_alpha = "entropy"', {"blank_alpha": "entropy"}),
        ("layer_range = [0, 3]", {"layer_range": (0, 3)}),
        ('layer_range = "0,3"', {"layer_range": (0, 3)}),
        ('layers = "0,2"', {"layers": (0, 2)}),
        ("image_size = 64", {"image_size": 64}),
    ],
)
def test_a_suites_settings_take_their_lad_eval_options_types(tmp_path, given, read):
    """Every setting takes its option's type (MethodOptions' and RecordSpec's as EvalConfig's)."""
    path = tmp_path / "s.toml"
    path.write_text(SETTING.format(given))
    assert load_suite(path).settings == read


@pytest.mark.parametrize(
    ("given", "says"),
    [
        ('tau = "5"', "[settings] tau must be a number, got '5'"),
        ("tau = -1", "[settings] tau must be >= 0, got -1.0"),
        ("top_k = 0", "[settings] top_k must be >= 1, got 0"),
        ("image_size = 0", "[settings] image_size must be >= 1, got 0"),
        ('layer_range = "a,b"', "[settings] layer_range must be an array of whole numbers"),
        (
            "layer_range = [3, 0]",
            "[settings] layer_range: The 'layer_range' parameter must be (first, last)",
        ),
        (
            'blank_alpha = "x"',
            "[settings] blank_alpha: The 'blank_alpha' parameter must be a finite number >= 0",
        ),
        ("sofa_sigma = 2", "cell 's N=3': --sofa-sigma must be a number in [0, 1] or 'auto'"),
    ],
)
def test_a_wrong_setting_is_refused_naming_the_file_and_key(tmp_path, capsys, given, says):
    path = tmp_path / "s.toml"
    path.write_text(SETTING.format(given))
    assert main(["suite", "run", str(path), "--model", "demo", "--out", str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"Error: {path}: {says}"), err
    assert not (tmp_path / "out").exists()


def test_a_few_paper_numbers_read_by_eye():
    """Spot values typed from the paper's PDF tables, independent of the text's layout."""
    table1 = load_suite("table1").paper
    assert table1["LLaVA-OneVision-8B"]["coco random N=4"]["lad"] == {
        "acc": 98.66, "acc_std": 0.36, "rstd": 0.88, "cons": 96.50
    }  # fmt: skip
    assert table1["Qwen2.5-VL-3B"]["coco adversarial N=4"]["self-consistency"]["acc"] == 42.20
    assert table1["InternVL-3-8B"]["coco adversarial N=8"]["lad"]["cons"] == 35.20
    assert "self-consistency" not in table1["InternVL-3-8B"]["coco random N=8"]  # Table 6 lacks it
    table5 = load_suite("table5").paper["LLaVA-OV"]
    assert table5["forensic blink"]["attn-purified"]["acc"] == 27.9
    assert table5["visual quality"]["lad"] == {"acc": 53.0, "delta_rstd": -35.0}


def test_suite_list_names_the_built_ins(capsys):
    assert main(["suite", "list"]) == 0
    names = [line.split()[0] for line in capsys.readouterr().out.splitlines()]
    assert names == ["blink", "muirbench", "table1", "table5"]
