"""python benchmarks/bench_scoring.py [--records 5000] [--out runs/bench_scoring.json]

Time reading records and scoring them with all six record-based methods, from jsonl and from
Parquet: 5,000 evaluation records (1,000 items × 5 shuffles) with N = 8 and L = 36, a calibration
of 5 items × 8 shifts, and the evaluation items' 8 cyclic shifts for perm-avg. Targets: under 2 s
from jsonl (parsing included), under 0.5 s from Parquet. Prints a table and writes JSON to
runs/ (the committed benchmarks/bench_scoring.json is replaced only when --out names it).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lad.core.calibrate import Calibration
from lad.core.methods import METHODS, MethodOptions, predict
from lad.core.metrics import compute_metrics
from lad.core.records import read_records, write_records
from tests.synthetic import SyntheticModel

N, L, T = 8, 36, 5
TARGETS = {"jsonl": 2.0, "parquet": 0.5}
# The methods computed from the evaluation records and perm-avg's shifts (the generation
# baselines, SoFA and blank need records of their own stage, made by the model).
SCORED = [n for n, m in METHODS.items() if m.stage == "records" and m.extra in (None, "perm-avg")]


def make_files(folder: Path, num_records: int) -> dict[str, int]:
    model = SyntheticModel(num_candidates=N, num_layers=L)
    items = num_records // T
    sets = {
        "records": model.eval_records(items, num_shuffles=T),
        "calibration": model.calibration_records(5),
        "perm": model.perm_records(items),
    }
    for name, records in sets.items():
        for suffix in ("jsonl", "parquet"):
            write_records(folder / f"{name}.{suffix}", records)
    return {name: len(records) for name, records in sets.items()}


def score_all(folder: Path, suffix: str) -> dict[str, float]:
    """Seconds for each stage of: read, fit the calibration, score all methods, metrics."""
    t0 = time.perf_counter()
    records = read_records(folder / f"records.{suffix}")
    calibration_records = read_records(folder / f"calibration.{suffix}")
    perm = read_records(folder / f"perm.{suffix}")
    t1 = time.perf_counter()
    calibration = Calibration().fit(calibration_records)
    predictions = {
        m: predict(m, records, calibration, MethodOptions(), perm_records=perm) for m in SCORED
    }
    t2 = time.perf_counter()
    compute_metrics(records, predictions)
    t3 = time.perf_counter()
    return {"read": t1 - t0, "score": t2 - t1, "total": t2 - t0, "metrics": t3 - t2}


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=5000, help="evaluation records")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", default="runs/bench_scoring.json", help="JSON to write")
    return parser


def main() -> None:
    args = parser().parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        counts = make_files(folder, args.records)
        sizes = {p.name: p.stat().st_size for p in folder.iterdir()}
        results = {}
        for suffix in ("jsonl", "parquet"):
            runs = [score_all(folder, suffix) for _ in range(args.repeats)]
            results[suffix] = {k: statistics.median(r[k] for r in runs) for k in runs[0]}

    print(f"{counts['records']} records (N = {N}, L = {L}), {counts['calibration']} calibration, "
          f"{counts['perm']} perm-avg records; all {len(SCORED)} record-based methods; median of "
          f"{args.repeats}")  # fmt: skip
    print(
        f"{'format':<9}{'read s':>9}{'score s':>9}{'total s':>9}{'target s':>10}{'metrics s':>11}"
    )
    for suffix, r in results.items():
        ok = "ok" if r["total"] < TARGETS[suffix] else "SLOW"
        print(
            f"{suffix:<9}{r['read']:>9.3f}{r['score']:>9.3f}{r['total']:>9.3f}"
            f"{TARGETS[suffix]:>8.1f} {ok:<4}{r['metrics']:>8.3f}"
        )
    report = {
        "benchmark": "bench_scoring",
        "records": counts,
        "num_candidates": N,
        "num_layers": L,
        "methods": SCORED,
        "repeats": args.repeats,
        "seconds_median": results,
        "targets_seconds": TARGETS,
        "file_bytes": sizes,
        "python": platform.python_version(),
        "machine": platform.machine(),
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    print(f"written: {args.out}")


if __name__ == "__main__":
    main()
