"""The Python API (Debiaser), `lad calibrate`, `lad predict`, and a report over runs of two N."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from lad import Debiaser
from lad.cli import main
from lad.data.items import read_items
from lad.data.shapes import build_shapes, shapes_vocabulary
from lad.errors import CalibrationError, DataError
from lad.evaluate import evaluate
from lad.outputs.report import write_report
from lad.run.config import eval_config
from lad.testing.tiny import build_tiny_model


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("tiny") / "qwen"
    return str(build_tiny_model("qwen2_vl", path, words=shapes_vocabulary()))


@pytest.fixture(scope="module")
def items(tmp_path_factory) -> list:
    root = tmp_path_factory.mktemp("bench")
    path = build_shapes(root, num_candidates=3, items=3, split="calibration", image_size=32)
    return read_items(path)


def test_fit_predict_save_load(tiny, items, tmp_path):
    debiaser = Debiaser(tiny, batch_size=2, device="cpu")
    with pytest.raises(CalibrationError, match="not fitted yet"):
        debiaser.predict("a red circle", items[0].images)
    debiaser.fit(items[:2])
    choice = debiaser.predict(items[2].query, items[2].images)
    assert choice.labels == ["1", "2", "3"]
    assert np.isclose(sum(choice.prob_before), 1) and np.isclose(sum(choice.prob_after), 1)
    assert np.isclose(sum(choice.posterior), 1)
    assert len(choice.layers) == 2 and 0 <= choice.lad < 3 and 0 <= choice.vanilla < 3
    assert choice.vanilla == int(np.argmax(choice.prob_before))
    assert choice.lad == int(np.argmax(choice.prob_after))

    debiaser.save(tmp_path / "cal.json")
    again = Debiaser(tiny, batch_size=1, device="cpu").load(tmp_path / "cal.json")
    other = again.predict(items[2].query, items[2].images)
    assert np.allclose(other.prob_after, choice.prob_after, atol=1e-6)
    # Fitting twice gives the same calibration.
    refit = Debiaser(tiny, batch_size=2, device="cpu", backend=debiaser.backend).fit(items[:2])
    assert np.allclose(refit.calibration_.log_bias, debiaser.calibration_.log_bias)


def test_predict_refuses_missing_image_and_wrong_n(tiny, items, tmp_path):
    debiaser = Debiaser(tiny, device="cpu").fit(items[:1])
    with pytest.raises(DataError, match=r"nope\.png"):
        debiaser.predict("a red circle", [*items[0].images[:2], tmp_path / "nope.png"])
    with pytest.raises(CalibrationError, match="N = 3"):
        debiaser.predict("a red circle", items[0].images[:2])


def test_cli_calibrate_and_predict(tiny, items, tmp_path, capsys):
    data = tmp_path / "cal.jsonl"
    data.write_text(
        "".join(
            json.dumps(
                {
                    "id": it.id,
                    "query": it.query,
                    "images": [str(p) for p in it.images],
                    "answer": it.answer,
                }
            )
            + "\n"
            for it in items
        )
    )
    cal = tmp_path / "calibration.json"
    assert (
        main(
            [
                "calibrate",
                "--model",
                tiny,
                "--data",
                str(data),
                "--items",
                "2",
                "--out",
                str(cal),
                "--device",
                "cpu",
                "-q",
            ]
        )
        == 0
    )
    assert json.loads(cal.read_text())["num_items"] == 2
    assert (tmp_path / "calibration.records.jsonl").is_file()
    capsys.readouterr()
    images = [str(p) for p in items[2].images]
    args = ["predict", "--model", tiny, "--calibration", str(cal), "--query", items[2].query]
    assert main([*args, *images, "--json", "--device", "cpu"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) >= {"vanilla", "lad", "prob_before", "prob_after", "posterior", "layers"}
    assert main([*args, *images, "--device", "cpu"]) == 0
    assert "LAD chooses" in capsys.readouterr().out


def test_report_over_runs_of_two_n(tiny, tmp_path):
    runs = []
    for n in (2, 3):
        config = eval_config(
            model=tiny,
            data="shapes",
            num_candidates=n,
            items=3,
            calibration_items=1,
            num_shuffles=2,
            batch_size=4,
            device="cpu",
            quiet=True,
            methods=("vanilla", "lad"),
        )
        evaluate(config, tmp_path / f"n{n}")
        runs.append(tmp_path / f"n{n}")
    page = write_report(runs, tmp_path / "report")
    assert (tmp_path / "report" / "acc_vs_n.png").stat().st_size > 1000
    assert "Accuracy against N" in Path(page).read_text()
