"""python benchmarks/bench_threads.py [--threads 1 2 auto] [--load 0 2] [--items 40] [--out FILE]

Seconds for the demo model's records of `--items` shapes items (N = 4, one ordering each, batch
size 4; the evaluation stage of `lad eval`) under each torch CPU thread count, on this machine
as it is and with `--load` extra busy processes (each a Python loop on one core, started for
the measurement and stopped after it). "auto" is lad's own choice (lad.backends.threads: the
CPUs free when the model loads); a number is LAD_NUM_THREADS. Each measurement runs in a fresh
process and reports the thread count torch used, the 1-minute load average when the model
loaded, and whether its records equal, bit for bit, those of the first setting. Prints a table
and writes JSON to runs/ (or --out).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CHILD = """
import json, os, sys, time
from lad.backends import load_backend
from lad.data.items import read_items
from lad.core.labels import get_scheme
import torch
load = os.getloadavg()[0]
items = read_items(sys.argv[1])
backend = load_backend("demo", device="cpu")
requests = [(it, 0, list(range(it.num_candidates))) for it in items]
start = time.perf_counter()
records = list(backend.records(requests, scheme=get_scheme("digits"), batch_size=4))
seconds = time.perf_counter() - start
print(json.dumps({"seconds": seconds, "threads": torch.get_num_threads(), "load": load,
                  "logprobs": [r.logprobs for r in records],
                  "attention": [r.attention for r in records]}))
"""


def measure(items: Path, threads: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "LAD_NUM_THREADS")}
    if threads != "auto":
        env["LAD_NUM_THREADS"] = threads
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(items)], env=env, capture_output=True, text=True
    )
    if out.returncode:
        raise SystemExit(out.stderr)
    return json.loads(out.stdout.strip().splitlines()[-1])


def busy(count: int) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", nargs="+", default=["1", "2", "auto"])
    parser.add_argument("--load", type=int, nargs="+", default=[0, 2], help="extra busy processes")
    parser.add_argument("--items", type=int, default=40)
    parser.add_argument("--repeats", type=int, default=1, help="the minimum of this many runs")
    parser.add_argument("--out", default="runs/bench_threads.json", help="JSON to write")
    return parser


def main() -> None:
    args = parser().parse_args()

    sys.path.insert(0, str(ROOT))
    from lad.data.shapes import build_shapes

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        items = build_shapes(
            tmp, num_candidates=4, setting="random", items=args.items, split="eval", seed=0,
            image_size=64, max_shapes=2, position_weights=None,
        )  # fmt: skip
        reference = None
        for load in args.load:
            workers = busy(load)
            try:
                time.sleep(2 if load else 0)
                for threads in args.threads:
                    runs = [measure(items, threads) for _ in range(args.repeats)]
                    best = min(runs, key=lambda r: r["seconds"])
                    made = (best["logprobs"], best["attention"])
                    reference = reference or made
                    rows.append(
                        {"extra_load": load, "setting": threads, "threads": best["threads"],
                         "load_average": round(best["load"], 2), "seconds": best["seconds"],
                         "same_records": made == reference}
                    )  # fmt: skip
                    r = rows[-1]
                    print(
                        f"extra load {load}  LAD_NUM_THREADS {threads:>4}  torch threads "
                        f"{r['threads']}  load avg {r['load_average']:5.2f}  "
                        f"{r['seconds']:7.2f} s  same records {r['same_records']}",
                        flush=True,
                    )
            finally:
                for w in workers:
                    w.kill()
                    w.wait()
    print(f"\n{'extra load':>10} {'setting':>8} {'threads':>8} {'load avg':>9} {'seconds':>9}")
    for r in rows:
        print(
            f"{r['extra_load']:>10} {r['setting']:>8} {r['threads']:>8} "
            f"{r['load_average']:>9.2f} {r['seconds']:>9.2f}"
        )
    report = {
        "benchmark": "bench_threads",
        "items": args.items,
        "cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "machine": platform.machine(),
        "python": platform.python_version(),
        "rows": rows,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    print(f"written: {args.out}")


if __name__ == "__main__":
    main()
