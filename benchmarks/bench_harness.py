"""VENV/bin/python benchmarks/bench_harness.py [--items 40] [--out benchmarks/bench_harness.json]

The overhead of `--model lad` inside lmms-eval over `lad eval` on the same questions: ITEMS
shapes items (N = 4) as a local MuirBench parquet, each asked under its 4 cyclic shifts (lad's
muirbench_circular task; `lad eval --orders` with the same shifts), the embedded demo model on
the CPU, the same calibration.json. Times each whole command (process start, imports, data,
model load, every forward pass, metrics) and, for --model lad, the part lad's scorer spent
(records and methods). Run with the python of an environment that has the extra
(`pip install -e ".[lmms-eval]"`). Prints a table and writes JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from lad.data.items import cyclic_shift, read_items  # noqa: E402
from lad.harness import tasks_folder  # noqa: E402
from tests.harness_fixtures import local_task, shapes_muirbench  # noqa: E402

N = 4


LOG: list[str] = []


def _timed(*args: str, cwd: Path) -> float:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    start = time.perf_counter()
    done = subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        sys.exit(done.stdout[-2000:] + done.stderr[-2000:])
    LOG.append(done.stdout + done.stderr)
    return seconds


def _scored_seconds(log: str) -> float:
    """The time --model lad logged for its picture questions (records and methods)."""
    return float(re.search(r"lad: picture questions scored in ([\d.]+) s", log).group(1))


def _lad_metrics(audit: Path) -> dict[str, float]:
    entry = json.loads(audit.read_text())["tasks"]["bench"][str(N)]
    return {k: round(entry["methods"]["lad"][k], 2) for k in ("acc", "rstd", "cons")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[2])
    parser.add_argument("--items", type=int, default=40)
    parser.add_argument("--out", default=str(ROOT / "benchmarks/bench_harness.json"))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        parquet = shapes_muirbench(root / "eval", items=args.items, split="eval", n=N)
        cal = shapes_muirbench(root / "cal", items=5, split="calibration", n=N)
        tasks = local_task(
            root / "tasks", parquet, "bench", tasks_folder() / "muirbench_circular.yaml"
        )
        lad = ("-m", "lad")
        for name, path in (("eval", parquet), ("cal", cal)):
            _timed(*lad, "data", "muirbench", str(path), "--calibration-items", "0",
                   "--out", str(root / f"{name}.jsonl"), cwd=root)  # fmt: skip
        common = ("--model", "demo", "--labels", "upper", "--device", "cpu", "--quiet")
        calibration = root / "calibration.json"
        _timed(*lad, "calibrate", *common, "--data", str(root / "cal.jsonl"),
               "--out", str(calibration), cwd=root)  # fmt: skip
        with (root / "orders.jsonl").open("w") as f:
            for it in read_items(root / "eval.jsonl"):
                for s in range(N):
                    f.write(json.dumps({"item": it.id, "order": cyclic_shift(N, s)}) + "\n")
        lad_eval = _timed(
            *lad, "eval", *common, "--data", str(root / "eval.jsonl"),
            "--calibration", str(calibration), "-n", str(N), "--methods", "vanilla,lad",
            "--batch-size", "4",
            "--orders", str(root / "orders.jsonl"), "--out", str(root / "run"), cwd=root,
        )  # fmt: skip
        harness = _timed(
            "-m", "lmms_eval", "--model", "lad",
            "--model_args", f"model=demo,calibration={calibration},output={root}/lad",
            "--tasks", "bench", "--include_path", str(tasks), "--output_path", str(root / "out"),
            "--device", "cpu", "--batch_size", "4", cwd=root,
        )  # fmt: skip
        scored = _scored_seconds(LOG[-1])
        stages = json.loads((root / "run/run.json").read_text()).get("timing", {})
        # What calibration_docs=5 costs: fitted on the task's first 5 questions, also scored.
        _timed(
            "-m", "lmms_eval", "--model", "lad",
            "--model_args", f"model=demo,calibration_docs=5,output={root}/lad-docs",
            "--tasks", "bench", "--include_path", str(tasks), "--output_path", str(root / "out2"),
            "--device", "cpu", "--batch_size", "4", cwd=root,
        )  # fmt: skip
        fidelity = {
            name: _lad_metrics(root / folder / "lad_audit.json")
            for name, folder in (("calibration_file", "lad"), ("calibration_docs_5", "lad-docs"))
        }
    prompts = args.items * N
    result = {
        "prompts": prompts,
        "lad_eval_seconds": round(lad_eval, 2),
        "lad_eval_stages": stages,
        "model_lad_seconds": round(harness, 2),
        "model_lad_scoring_seconds": scored,
        "ratio": round(harness / lad_eval, 2),
        "extra_seconds": round(harness - lad_eval, 2),
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs",
        "lad_by_calibration": fidelity,
    }
    print(f"{prompts} prompts (N = {N}): lad eval {lad_eval:.1f} s, "
          f"lmms-eval --model lad {harness:.1f} s ({harness / lad_eval:.2f}x, "
          f"+{harness - lad_eval:.1f} s), of which lad scored the questions in {scored:.1f} s; "
          f"lad eval's evaluation stage {stages.get('evaluation', 0.0):.1f} s")  # fmt: skip
    for name, m in fidelity.items():
        print(f"LAD with {name}: Acc {m['acc']:.1f}, RStd {m['rstd']:.1f}, Cons. {m['cons']:.1f}")
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
