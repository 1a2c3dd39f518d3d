"""python benchmarks/bench_threads.py [--cases idle after busy] [--threads 1 2 auto] [--items 40]
[--before 30] [--repeats 1] [--out FILE]

Seconds for the demo model's records of `--items` shapes items (N = 4, one ordering each, batch
size 4; the evaluation stage of `lad eval`) under each torch CPU thread count, in three cases
the benchmark makes itself:

- idle: the machine as it is;
- after: two runs in a row: the measured run starts the moment a job that kept every CPU busy
  for `--before` seconds ends (a Python loop per CPU, as a previous run of lad does), so the
  1-minute load average still counts that job;
- busy: while a Python loop keeps every CPU busy.

"auto" is lad's own choice (lad.backends.threads: the cores free when the model loads); a number
is LAD_NUM_THREADS. Each measurement runs in a fresh process and reports the thread count torch
used, how it was chosen, the busy CPUs lad sampled, the 1-minute load average then and the count
the load average would have given (the rule before issue 34), and whether its records equal, bit
for bit, those of the first measurement. The table gives, per case, lad's time over the best
fixed count's. Writes JSON to runs/ (or --out).
"""

from __future__ import annotations

import argparse
import contextlib
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
from lad.backends.threads import available_cpus, choose_threads
from lad.data.items import read_items
from lad.core.labels import get_scheme
load = os.getloadavg()[0]
items = read_items(sys.argv[1])
backend = load_backend("demo", device="cpu")
requests = [(it, 0, list(range(it.num_candidates))) for it in items]
start = time.perf_counter()
records = list(backend.records(requests, scheme=get_scheme("digits"), batch_size=4))
seconds = time.perf_counter() - start
print(json.dumps({"seconds": seconds, "threads": backend.threads.count,
                  "chosen_by": backend.threads.chosen_by, "busy": backend.threads.busy,
                  "load": load, "load_rule": choose_threads({}, available_cpus(), load),
                  "logprobs": [r.logprobs for r in records],
                  "attention": [r.attention for r in records]}))
"""
CASES = ("idle", "after", "busy")


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


def cpus() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


class Busy:
    """A Python loop on every CPU this process may use, from entering until leaving."""

    def __enter__(self) -> Busy:
        loop = "print(flush=True)\nwhile True: pass"
        self.loops = [
            subprocess.Popen([sys.executable, "-c", loop], stdout=subprocess.PIPE)
            for _ in range(cpus())
        ]
        for p in self.loops:
            p.stdout.readline()  # running
        return self

    def __exit__(self, *exc: object) -> None:
        for p in self.loops:
            p.kill()
            p.wait()
            p.stdout.close()


def run_case(case: str, items: Path, settings: list[str], before: float, repeats: int) -> list:
    """Each setting's measurements in `case`, `repeats` rounds of all settings in turn (so a
    change in the machine's other load falls on every setting alike)."""
    runs: list[list[dict]] = [[] for _ in settings]
    with Busy() if case == "busy" else contextlib.nullcontext():
        time.sleep(1 if case == "busy" else 0)
        for _ in range(repeats):
            for i, threads in enumerate(settings):
                if case == "after":
                    with Busy():
                        time.sleep(before)
                runs[i].append(measure(items, threads))  # after: the moment the job ended
    return runs


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", nargs="+", choices=CASES, default=list(CASES))
    parser.add_argument("--threads", nargs="+", default=["1", "2", "auto"])
    parser.add_argument("--items", type=int, default=40)
    parser.add_argument(
        "--before", type=float, default=30.0, help="seconds of the busy job before 'after'"
    )
    parser.add_argument("--repeats", type=int, default=1, help="the minimum of this many runs")
    parser.add_argument("--out", default="runs/bench_threads.json", help="JSON to write")
    return parser


def versus_best_fixed(rows: list[dict]) -> None:
    """Each "auto" row's seconds over the fastest fixed count's of its case, and that count."""
    for case in {r["case"] for r in rows}:
        fixed = [r for r in rows if r["case"] == case and r["setting"] != "auto"]
        if not fixed:
            continue
        best = min(fixed, key=lambda r: r["seconds"])
        for r in rows:
            if r["case"] == case and r["setting"] == "auto":
                r["vs_best_fixed"] = round(r["seconds"] / best["seconds"], 3)
                r["best_fixed_threads"] = best["threads"]


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
        for case in args.cases:
            made_in_case = run_case(case, items, args.threads, args.before, args.repeats)
            for threads, runs in zip(args.threads, made_in_case, strict=True):
                best = min(runs, key=lambda r: r["seconds"])
                made = (best["logprobs"], best["attention"])
                reference = reference or made
                busy = best["busy"]
                rows.append(
                    {"case": case, "setting": threads, "threads": best["threads"],
                     "chosen_by": best["chosen_by"],
                     "busy_cpus": None if busy is None else round(busy, 2),
                     "load_average": round(best["load"], 2), "load_rule": best["load_rule"],
                     "seconds": round(best["seconds"], 3), "same_records": made == reference}
                )  # fmt: skip
                r = rows[-1]
                print(
                    f"{case:>5}  setting {threads:>4}  threads {r['threads']} ({r['chosen_by']})  "
                    f"load avg {r['load_average']:5.2f}  {r['seconds']:7.2f} s  "
                    f"same records {r['same_records']}",
                    flush=True,
                )
    versus_best_fixed(rows)
    print(
        "\n| case | setting | threads | chosen by | busy CPUs | load avg | load-avg rule "
        "| seconds | vs best fixed (its threads) |\n|---|---|---|---|---|---|---|---|---|"
    )
    for r in rows:
        busy = "" if r["busy_cpus"] is None else f"{r['busy_cpus']:.2f}"
        ratio = (
            f"{r['vs_best_fixed']:.2f}× ({r['best_fixed_threads']})" if "vs_best_fixed" in r else ""
        )
        print(
            f"| {r['case']} | {r['setting']} | {r['threads']} | {r['chosen_by']} | {busy} "
            f"| {r['load_average']:.2f} | {r['load_rule']} | {r['seconds']:.2f} | {ratio} |"
        )
    report = {
        "benchmark": "bench_threads",
        "items": args.items,
        "before_seconds": args.before,
        "repeats": args.repeats,
        "cpus": cpus(),
        "machine": platform.machine(),
        "python": platform.python_version(),
        "rows": rows,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    print(f"written: {args.out}")


if __name__ == "__main__":
    main()
