"""benchmarks/bench_throughput.py runs on a CPU at a trivial size and writes its JSON."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_throughput.py"


@pytest.mark.parametrize("shape", ["7b", "256m"])
def test_bench_throughput_runs_tiny_on_cpu(
    shape: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    spec = importlib.util.spec_from_file_location("bench_throughput", SCRIPT)
    bench = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "bench_throughput", bench)
    spec.loader.exec_module(bench)
    out = tmp_path / "bench.json"
    argv = ["bench_throughput.py", "--device", "cpu", "--shape", shape, "--tiny", "--ns", "2"]
    argv += ["3", "--batch-size", "2", "--batches", "2", "--repeats", "1", "--json", str(out)]
    monkeypatch.setattr(sys, "argv", argv)
    bench.main()
    report = json.loads(out.read_text())
    assert [row["n"] for row in report["rows"]] == [2, 3]
    modes = {"plain", "record", "lad", "serial", "prep"} | ({"stock"} if shape == "7b" else set())
    for row in report["rows"]:
        assert set(row["prompts_per_s"]) == modes
        assert all(v > 0 for v in row["prompts_per_s"].values())
        assert row["tflop_per_prompt"] > 0 and row["flop_bound_prompts_per_s"] > 0
        assert row["memory_mib"]["plain"] > 0 and row["lad_over_plain_memory"] > 0.9
        assert row["image_tokens_per_prompt"] > 0
    assert "lad/plain rec/plain" in capsys.readouterr().out
