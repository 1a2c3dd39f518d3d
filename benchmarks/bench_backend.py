"""python benchmarks/bench_backend.py [--layers 24] [--ns 4 8 12] [--out runs/bench_backend.json]
       [--remote FOLDER]

Per-prompt cost of lad's record versus a plain forward, on a tiny random-init LLaVA-1.5 whose
shape is realistic where the cost comes from: 24 decoder layers, 256 image tokens per image, so a
12-image prompt is ~3,200 tokens. For N = 4, 8, 12:
  (a) plain: one SDPA forward that yields vanilla's next-token logits;
  (b) lad:   lad's record: the same forward through the capture function (Eq. 6 rows for every
             layer), with the "1" of "10".."12" riding along, and exact scoring;
  (c) eager: capture through eager `output_attentions`, the way the paper's code does it.
With --remote FOLDER (a remote-code checkpoint's files, e.g. LLaVA-OneVision-1.5-8B-Instruct's,
run under the transformers its code needs), the model is that folder shrunk by
lad.testing.remote (2 decoder layers), pictures resized to 448 px (256 tokens each), and (b) is
the capture by hooks on its own SDPA calls (lad.backends.remote); (c) is left out (the published
eager attention does not run). Targets: (b)/(a) <= 1.05 in time and <= 1.02 in peak memory at
every N. Times are the minimum
(least disturbed by other load) and median over interleaved repeats; peak memory is measured in
a fresh process per (N, mode): CUDA peak allocated over the loaded model, or on CPU the peak
of tensor storage allocated during the work and alive at once (tracked per op), and the peak
resident set of the process (sampled every millisecond; noisy by tens of MiB from the allocator).
Prints a table and writes JSON to runs/ (the committed benchmarks/bench_backend.json is replaced
only when --out names it).
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
import transformers

from lad.backends import load_backend
from lad.backends.hf import Backend, evidence
from lad.core.labels import get_scheme
from lad.data.items import Item
from lad.testing.tiny import TinySize, build_tiny_model

MODES = ("plain", "lad", "eager")
REMOTE_SIDE = 448  # --remote: pictures resized to 448 px, 16 x 16 tokens of 28 px each
DIGITS = get_scheme("digits")


def make_model(folder: Path, layers: int) -> Path:
    size = TinySize(
        text_layers=layers,
        hidden=256,
        heads=4,
        kv_heads=2,
        intermediate=688,
        vision_layers=1,
        vision_hidden=64,
        image_side=224,  # 16x16 patches of 14 px: 256 image tokens per image
    )
    return build_tiny_model("llava", folder / "model", size=size)


def make_item(folder: Path, n: int) -> Item:
    from PIL import Image

    gen = torch.Generator().manual_seed(n)
    paths = []
    for i in range(n):
        pixels = (torch.rand(240, 320, 3, generator=gen) * 255).to(torch.uint8).numpy()
        paths.append(folder / f"n{n}_{i}.png")
        Image.fromarray(pixels).save(paths[-1])
    return Item(f"n{n}", "a red circle next to a blue square", paths, 0)


def make_remote(folder: Path, source: str) -> Path:
    from lad.testing.remote import save_shrunk_remote

    return save_shrunk_remote(source, folder / Path(source).name)


def load(model: str, device: str, remote: bool) -> Backend:
    extra = {"trust_remote_code": True, "image_size": REMOTE_SIDE} if remote else {}
    return load_backend(model, device=device, quiet=True, **extra)


def modes(backend: Backend) -> tuple[str, ...]:
    return MODES[:2] if backend.arch.remote_code else MODES


def prepared(backend: Backend, item: Item) -> tuple[Any, dict[str, Any], Any]:
    req = (item, 0, list(range(item.num_candidates)))
    texts, images = backend.build_prompts([req], "vanilla", DIGITS)
    inputs, spans = backend.encode([req], texts, images)
    return req, inputs, spans


def run_mode(backend: Backend, mode: str, inputs: dict[str, Any], spans: Any) -> None:
    """One prompt's worth of work in `mode` (inputs already tokenised; same for every mode)."""
    n = len(spans[0])
    if mode == "plain":  # the last position's logits only (logits_to_keep, or the head's input)
        kwargs = {**inputs, "use_cache": False}
        with torch.no_grad(), backend.forward.last_logits(backend.model, kwargs, 1):
            backend.model(**kwargs)
        return
    if mode == "lad":
        pre, _ = backend.score_encoded(inputs, spans, backend.label_trie(DIGITS, n))
    else:
        pre = backend.prefill(inputs, "eager", keep_cache=False)
    evidence(pre.rows[0], spans[0])


def set_mode(backend: Backend, mode: str) -> None:
    if backend.arch.remote_code:  # its own SDPA throughout; the hooks capture inside records
        return
    impl = {"plain": "sdpa", "lad": "lad_capture", "eager": "lad_capture"}[mode]
    backend.model.set_attn_implementation({"text_config": impl})


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def time_all(backend: Backend, item: Item, repeats: int) -> tuple[dict[str, float], ...]:
    _, inputs, spans = prepared(backend, item)
    times: dict[str, list[float]] = {m: [] for m in modes(backend)}
    for r in range(repeats + 1):
        for mode in times:
            set_mode(backend, mode)
            sync()
            start = time.perf_counter()
            run_mode(backend, mode, inputs, spans)
            sync()
            if r:  # the first round warms up
                times[mode].append(time.perf_counter() - start)
    set_mode(backend, "lad")
    return {m: min(t) for m, t in times.items()}, {
        m: statistics.median(t) for m, t in times.items()
    }


def _rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20


def _sampled_peak(work: Any) -> float:
    """Peak resident set (MiB) while `work()` runs, sampled every millisecond by a thread."""
    peak = [_rss_mib()]
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], _rss_mib())
            time.sleep(0.001)

    thread = threading.Thread(target=sample)
    thread.start()
    try:
        work()
    finally:
        done.set()
        thread.join()
    return max(peak[0], _rss_mib())


class _LiveTensors:
    """Peak bytes of tensor storage created and alive during a block (CPU stand-in for CUDA's
    peak allocated): every op's outputs are counted once per storage until they are freed."""

    def __init__(self) -> None:
        from torch.utils._python_dispatch import TorchDispatchMode

        tracker = self

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                out = func(*args, **(kwargs or {}))
                for t in torch.utils._pytree.tree_leaves(out):
                    if isinstance(t, torch.Tensor):
                        tracker.add(t)
                return out

        self.mode = Mode()
        self.live = 0
        self.peak = 0
        self.seen: set[int] = set()

    def add(self, t: torch.Tensor) -> None:
        storage = t.untyped_storage()
        key = storage.data_ptr()
        if key in self.seen or storage.nbytes() == 0:
            return
        self.seen.add(key)
        self.live += storage.nbytes()
        self.peak = max(self.peak, self.live)
        weakref.finalize(storage, self.drop, key, storage.nbytes())

    def drop(self, key: int, nbytes: int) -> None:
        self.seen.discard(key)
        self.live -= nbytes


def tensor_peak(work: Any) -> float:
    """Peak MiB of tensors allocated by `work()` and alive at the same time."""
    tracker = _LiveTensors()
    with tracker.mode:
        work()
    return tracker.peak / 2**20


def memory_child(model: str, folder: str, n: int, mode: str, device: str, remote: bool) -> None:
    """Runs in a fresh process: prints {"before": MiB, "peak": MiB} of one prompt in `mode`."""
    backend = load(model, device, remote)
    item = make_item(Path(folder), n)
    _, inputs, spans = prepared(backend, item)
    set_mode(backend, mode)
    if backend.device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated() / 2**20
        run_mode(backend, mode, inputs, spans)
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() / 2**20
        tensors = peak - before
    else:
        before = _rss_mib()
        peak = _sampled_peak(lambda: run_mode(backend, mode, inputs, spans))
        tensors = tensor_peak(lambda: run_mode(backend, mode, inputs, spans))
    print(json.dumps({"before": before, "peak": peak, "tensors": tensors}))


def memory(
    model: Path, folder: Path, n: int, mode: str, device: str, remote: bool
) -> dict[str, float]:
    cmd = [sys.executable, __file__, "--child", str(model), str(folder), str(n), mode, device]
    cmd += ["remote"] * remote
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=24)
    parser.add_argument("--ns", type=int, nargs="+", default=[4, 8, 12])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--out", default="runs/bench_backend.json", help="JSON to write")
    parser.add_argument("--no-memory", action="store_true", help="times only, no memory runs")
    parser.add_argument(
        "--remote", metavar="FOLDER", help="a remote-code checkpoint's files, shrunk and measured"
    )
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    return parser


def main() -> None:
    args = parser().parse_args()
    if args.child:
        model, folder, n, mode, device, *remote = args.child
        memory_child(model, folder, int(n), mode, device, bool(remote))
        return
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        remote = args.remote is not None
        model = make_remote(folder, args.remote) if remote else make_model(folder, args.layers)
        backend = load(str(model), args.device, remote)
        rows = []
        for n in args.ns:
            item = make_item(folder, n)
            _, inputs, _ = prepared(backend, item)
            secs, medians = time_all(backend, item, args.repeats)
            mem = (
                {}
                if args.no_memory
                else {m: memory(model, folder, n, m, args.device, remote) for m in modes(backend)}
            )
            tokens = int(inputs["input_ids"].shape[1])
            rows.append(
                {"n": n, "tokens": tokens, "seconds": secs, "median_seconds": medians,
                 "memory_mib": mem}
            )  # fmt: skip
    (report_times if args.no_memory else report_table)(rows)
    report = {
        "benchmark": "bench_backend",
        "device": str(backend.device),
        "cpu": platform.processor() or platform.machine(),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "model": Path(args.remote).name if remote else "tiny LLaVA-1.5",
        "transformers": transformers.__version__,
        "layers": backend.num_layers,
        "repeats": args.repeats,
        "rows": rows,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    print(f"written: {args.out}")


def _cell(value: float | None, spec: str) -> str:
    """`value` formatted by `spec`, or a dash where the mode was not run (--remote: eager)."""
    width = int(spec.split(".")[0].lstrip(">") or 0)
    return format(value, spec) if value is not None else format("–", f">{width}")


def _ratio(top: float | None, bottom: float | None) -> float | None:
    return None if top is None or bottom is None else top / bottom


def report_times(rows: list[dict[str, Any]]) -> None:
    head = f"{'plain ms':>8} {'lad ms':>8} {'eager ms':>8} | {'b/a':>5} {'c/b':>5}"
    print(f"{'N':>3} {'tokens':>6} | {head}")
    for row in rows:
        s = {k: 1e3 * v for k, v in row["seconds"].items()}
        print(
            f"{row['n']:>3} {row['tokens']:>6} | {s['plain']:>8.2f} {s['lad']:>8.2f} "
            f"{_cell(s.get('eager'), '>8.2f')} | {s['lad'] / s['plain']:>5.2f} "
            f"{_cell(_ratio(s.get('eager'), s['lad']), '>5.2f')}"
        )
    print("time: minimum over repeats (median in the JSON).")


def report_table(rows: list[dict[str, Any]]) -> None:
    head = (
        f"{'N':>3} {'tokens':>6} | {'plain s':>7} {'lad s':>7} {'eager s':>7} | {'b/a':>5} "
        f"{'c/b':>5} | {'tensors a':>9} {'b':>7} {'c':>7} MiB | {'b/a':>5} {'c/b':>5} | "
        f"{'RSS a':>6} {'b':>6} {'c':>6} MiB | {'b/a':>5}"
    )
    print(head)
    print("-" * len(head))
    for row in rows:
        s, m = row["seconds"], row["memory_mib"]
        ten = {k: v["tensors"] for k, v in m.items()}
        rss = {k: v["peak"] for k, v in m.items()}
        eager_mem = _cell(_ratio(ten.get("eager"), ten["lad"]), ">5.1f")
        print(
            f"{row['n']:>3} {row['tokens']:>6} | {s['plain']:>7.2f} {s['lad']:>7.2f} "
            f"{_cell(s.get('eager'), '>7.2f')} | {s['lad'] / s['plain']:>5.2f} "
            f"{_cell(_ratio(s.get('eager'), s['lad']), '>5.2f')} | "
            f"{ten['plain']:>9.1f} {ten['lad']:>7.1f} {_cell(ten.get('eager'), '>7.1f')}     | "
            f"{ten['lad'] / ten['plain']:>5.3f} {eager_mem} | "
            f"{rss['plain']:>6.0f} {rss['lad']:>6.0f} {_cell(rss.get('eager'), '>6.0f')}     | "
            f"{rss['lad'] / rss['plain']:>5.3f}"
        )
    print(
        "time: minimum over repeats. tensors: peak of tensor storage allocated during the work "
        "(CUDA: peak allocated over the loaded model). RSS: peak resident set of the process."
    )


if __name__ == "__main__":
    main()
