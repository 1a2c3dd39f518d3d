"""Every input lad refuses, one test per case (docs/errors.md).

Each case is a command a user could type. It must end in exactly one `Error: ...` line naming
the culprit (file, line, item or flag), exit code 1, no traceback, and it must come before any
model work: the model loader is replaced by one that fails the test.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from lad.cli import main
from lad.data.shapes import build_shapes
from lad.records import write_records
from tests.synthetic import SyntheticModel


@pytest.fixture(autouse=True)
def no_model(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a refused input must be caught before the model loads")

    monkeypatch.setattr("lad.backends.load_backend", refuse)


@pytest.fixture
def stored(tmp_path) -> Path:
    """records.jsonl, calibration.jsonl and a predictions file of a synthetic model."""
    model = SyntheticModel(num_candidates=4, num_layers=6)
    write_records(tmp_path / "records.jsonl", model.eval_records(6, num_shuffles=2))
    write_records(tmp_path / "calibration.jsonl", model.calibration_records(3))
    assert main(["score", *_score_inputs(tmp_path), "--out", str(tmp_path / "pred.jsonl")]) == 0
    return tmp_path


@pytest.fixture(scope="module")
def shapes(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("shapes")
    return build_shapes(root, num_candidates=3, items=4, split="eval", image_size=16)


def _score_inputs(d: Path) -> list[str]:
    return [
        "--records",
        str(d / "records.jsonl"),
        "--calibration-records",
        str(d / "calibration.jsonl"),
        "--method",
        "lad",
    ]


def refused(capsys, argv: list[str], pattern: str) -> str:
    """Run `lad ARGV`: exit 1 and one `Error:` line matching `pattern`; return that line."""
    capsys.readouterr()
    assert main([str(a) for a in argv]) == 1
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), err
    assert re.search(pattern, lines[0]), lines[0]
    return lines[0]


# ---------------------------------------------------------------- outputs over inputs (point 2)


def test_score_out_over_its_records(stored, capsys):
    before = (stored / "records.jsonl").read_bytes()
    refused(
        capsys,
        ["score", *_score_inputs(stored), "--out", stored / "records.jsonl"],
        r"--out .*records\.jsonl is the same file as --records",
    )
    assert (stored / "records.jsonl").read_bytes() == before


def test_score_out_over_its_records_spelled_otherwise(stored, capsys, monkeypatch):
    monkeypatch.chdir(stored)
    inputs = ["--records", "records.jsonl", "--calibration-records", "calibration.jsonl"]
    refused(
        capsys,
        ["score", *inputs, "--method", "vanilla", "--out", "./sub/../records.jsonl"],
        r"is the same file as --records records\.jsonl",
    )
    (stored / "link.jsonl").symlink_to(stored / "calibration.jsonl")
    refused(
        capsys,
        ["score", *inputs, "--method", "vanilla", "--out", "link.jsonl"],
        r"--out link\.jsonl is the same file as --calibration-records",
    )


def test_score_save_calibration_over_an_input_or_the_out(stored, capsys):
    refused(
        capsys,
        [
            "score",
            *_score_inputs(stored),
            "--save-calibration",
            stored / "calibration.jsonl",
            "--out",
            stored / "p.jsonl",
        ],
        r"--save-calibration .* is the same file as --calibration-records",
    )
    refused(
        capsys,
        [
            "score",
            *_score_inputs(stored),
            "--save-calibration",
            stored / "p.jsonl",
            "--out",
            stored / "p.jsonl",
        ],
        r"--save-calibration .*p\.jsonl is the same file as --out",
    )


def test_metrics_out_over_its_predictions(stored, capsys):
    refused(
        capsys,
        [
            "metrics",
            "--records",
            stored / "records.jsonl",
            "--predictions",
            stored / "pred.jsonl",
            "--out",
            stored / "pred.jsonl",
        ],
        r"--out .*pred\.jsonl is the same file as --predictions",
    )


def test_calibrate_out_over_its_items(shapes, capsys, tmp_path):
    copy = tmp_path / "items.jsonl"
    copy.write_bytes(shapes.read_bytes())
    for line in copy.read_text().splitlines():  # images resolve against the copy's folder
        for image in json.loads(line)["images"]:
            (tmp_path / image).parent.mkdir(exist_ok=True)
            (tmp_path / image).write_bytes((shapes.parent / image).read_bytes())
    before = copy.read_bytes()
    refused(
        capsys,
        ["calibrate", "--data", copy, "--out", copy],
        r"--out .*items\.jsonl is the same file as --data",
    )
    image = tmp_path / json.loads(before.splitlines()[0])["images"][0]
    refused(
        capsys,
        ["calibrate", "--data", copy, "--out", image],
        r"--out .*\.png is the same file as image",
    )
    assert copy.read_bytes() == before


def test_calibrate_records_file_over_its_items(shapes, capsys, tmp_path):
    # --out X.json writes X.records.jsonl beside it: that must not be the items file either.
    target = shapes.with_name("cal.records.jsonl")
    target.write_bytes(shapes.read_bytes())
    refused(
        capsys,
        ["calibrate", "--data", target, "--out", shapes.with_name("cal.json")],
        r"its records file .*cal\.records\.jsonl is the same file as --data",
    )


def test_data_import_out_over_the_official_file(tmp_path, capsys):
    official = tmp_path / "official.jsonl"
    official.write_text("[]")
    refused(
        capsys,
        ["data", "import", official, "--images", tmp_path, "--out", official],
        r"--out .*official\.jsonl is the same file as the official file",
    )


def test_data_coco_out_over_its_captions(tmp_path, capsys):
    captions = tmp_path / "captions.jsonl"
    captions.write_text("{}")
    refused(
        capsys,
        ["data", "coco", "--images", tmp_path, "--captions", captions, "--out", captions],
        r"--out .*captions\.jsonl is the same file as --captions",
    )
