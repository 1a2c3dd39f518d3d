"""Issue 40, point 4: a run's inputs are read once and handed down. Counted: the files lad parses
(lad.io.files.read_text: items, calibration items, a checkpoint's config.json and
generation_config.json), not the reads of
transformers nor the SHA-256 of run.json's inputs (lad.run.runjson.file_digest)."""

from __future__ import annotations

import dataclasses
import sys
from collections import Counter
from pathlib import Path

import pytest

from lad.backends.checkpoint import MODEL_DIR
from lad.cli import main
from lad.data.shapes import build_shapes
from lad.evaluate import run_suite
from lad.io import files
from lad.run.rundir import RunDir
from lad.suites import Model, load_suite
from tests.test_suites import _mmiu_six

CONFIG = str(MODEL_DIR / "config.json")
GENERATION = str(MODEL_DIR / "generation_config.json")


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """Each file's parses from here on (a config.json read by an earlier test counts again)."""
    counted: Counter[str] = Counter()
    real = Path.read_bytes

    def read_bytes(self: Path) -> bytes:
        if sys._getframe(1).f_code is files.read_text.__code__:
            counted[str(self.resolve())] += 1
        return real(self)

    monkeypatch.setattr(Path, "read_bytes", read_bytes)
    monkeypatch.setattr("lad.backends.checkpoint._CONFIGS", {})
    return counted


def test_lad_eval_reads_its_items_and_the_models_config_once(tmp_path, reads):
    data = build_shapes(tmp_path / "s", num_candidates=3, items=8, split="eval")
    args = ["eval", "--data", str(data), "--num-candidates", "3", "--calibration-items", "2"]
    assert main([*args, "--num-shuffles", "2", "--methods", "vanilla,lad", "--quiet",
                 "--out", str(tmp_path / "run")]) == 0  # fmt: skip
    assert reads[str(Path(data).resolve())] == 1
    assert reads[CONFIG] == 1


def test_a_suite_reads_each_cells_items_and_the_models_config_once(tmp_path, reads):
    suite = load_suite("table5")
    suite = dataclasses.replace(
        suite,
        cells=suite.cells[:2],
        models=[Model("a", "demo"), Model("b", "demo")],
        settings={
            **suite.settings,
            "methods": ("vanilla", "lad"),
            "num_shuffles": 2,
            "repetition_penalty": "model",  # generation_config.json's (the demo's: none)
        },
    )
    mmiu = _mmiu_six(tmp_path / "MMIU")
    result = run_suite(suite, tmp_path / "out", data_roots=[str(mmiu)], say=lambda line: None)
    assert len(result.runs["a"]) == len(result.runs["b"]) == 2
    data = (tmp_path / "out" / "data").resolve()
    for cell in suite.cells[:2]:
        assert reads[str(data / f"{cell.slug}.jsonl")] == 1
        assert reads[str(data / f"{cell.slug}.calibration.jsonl")] == 1
    assert reads[CONFIG] == reads[GENERATION] == 1


def test_a_given_calibration_is_read_once_and_metrics_once_per_check(tmp_path, reads):
    data = build_shapes(tmp_path / "s", num_candidates=3, items=8, split="eval")
    args = ["eval", "--data", str(data), "--num-candidates", "3", "--calibration-items", "2",
            "--num-shuffles", "2", "--methods", "vanilla,lad", "--quiet"]  # fmt: skip
    assert main([*args, "--out", str(tmp_path / "fit")]) == 0
    calibration = tmp_path / "fit" / "calibration.json"
    reads.clear()
    assert main([*args, "--calibration", str(calibration), "--out", str(tmp_path / "run")]) == 0
    assert reads[str(calibration.resolve())] == 1
    metrics = tmp_path / "run" / "metrics.json"
    reads.clear()
    assert RunDir(tmp_path / "run").finished(RunDir(tmp_path / "run").arguments, ["lad"])
    assert reads[str(metrics.resolve())] == 1
