"""python benchmarks/gpu_equality.py --device cuda --json equality.json

The equalities worth checking where the GPU path differs from the CPU one, on lad's tiny
random-init models (Qwen2.5-VL, Qwen2-VL, SmolVLM/Idefics3, LLaVA-1.5):
  cpu-vs-device   float32 records on the device against the CPU's (vanilla choices identical);
  fast-vs-eager   the capture against eager output_attentions, float32 and bfloat16;
  packed-vision   lad_vision against transformers' SDPA vision tower (Qwen), records;
  prefetch        records with prefetching + pinned non-blocking copies + batch b+1 queued
                  before b is read, against the serial path: byte-identical;
  host-syncs      device syncs during one prefill, capture vs plain forward (CUDA only,
                  torch.cuda.set_sync_debug_mode): the capture must add none;
  kernels         CUDA kernels per decoder layer that the capture adds (torch.profiler).
Prints one line per check and writes JSON; exits 1 if a check fails. With --device cpu it runs
what needs no GPU (to test this script).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
import torch

from lad.backends import load_backend
from lad.backends import vision as vis
from lad.backends.hf import Backend
from lad.core.labels import get_scheme
from lad.core.records import RecordWriter
from lad.data.items import Item
from lad.testing.tiny import TinySize, build_tiny_model

DIGITS = get_scheme("digits")
ARCHS = ("qwen2_5_vl", "qwen2_vl", "idefics3", "llava")
TOL_DTYPES = ("float32", "bfloat16")
# Tolerances: float32 device vs CPU (TF32 convolutions, other reduction orders; seen 1.3e-3),
# fast vs eager (float32 1e-5; bfloat16: eager itself rounds its scores to bfloat16).
TOL = {"cpu-vs-device": 5e-3, "fast-vs-eager-float32": 1e-5, "fast-vs-eager-bfloat16": 5e-3}
TOL["packed-vision-float32"] = 1e-4
TOL["packed-vision-bfloat16"] = 5e-2


def _images(folder: Path) -> list[Path]:
    from PIL import Image

    rng = np.random.default_rng(0)
    paths = []
    for i in range(6):
        paths.append(folder / f"{i}.jpg")
        pixels = (rng.random((40 + 11 * i, 70 - 5 * i, 3)) * 255).astype("uint8")
        Image.fromarray(pixels).save(paths[-1])
    return paths


def _requests(images: list[Path]) -> list[tuple[Item, int, list[int]]]:
    captions = ["a red star", "a blue circle next to a much longer description", "green"]
    items = [Item(f"q{k}", captions[k % 3], images[k : k + 4], k % 4) for k in range(3)]
    return [(it, t, [(t + i) % 4 for i in range(4)]) for it in items for t in range(2)]


def _max_diffs(a: list, b: list) -> dict[str, float]:
    pairs = list(zip(a, b, strict=True))
    att = max(float(np.abs(np.subtract(x.attention, y.attention)).max()) for x, y in pairs)
    lp = max(float(np.abs(np.subtract(x.logprobs, y.logprobs)).max()) for x, y in pairs)
    same = all(np.argmax(x.logprobs) == np.argmax(y.logprobs) for x, y in pairs)
    return {"attention": att, "logprobs": lp, "same_vanilla_choices": bool(same)}


def _records(backend: Backend, reqs: list, **kwargs: Any) -> list:
    return list(backend.records(reqs, scheme=DIGITS, batch_size=3, **kwargs))


def _jsonl(backend: Backend, reqs: list, path: Path, **kwargs: Any) -> bytes:
    with RecordWriter(path) as writer:
        for rec in backend.records(reqs, scheme=DIGITS, batch_size=2, **kwargs):
            writer.write(rec)
    return path.read_bytes()


def _syncs(work: Callable[[], Any]) -> int:
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            work()
            torch.cuda.set_sync_debug_mode(0)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    return sum("synchroniz" in str(w.message) for w in caught)


def _kernels(work: Callable[[], Any]) -> int:
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        work()
        torch.cuda.synchronize()
    return sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)


def check_arch(arch: str, folder: Path, device: str, reqs: list, out: dict[str, Any]) -> None:
    size = TinySize(image_side=84, vision_layers=4) if arch.startswith("qwen") else None
    path = build_tiny_model(arch, folder / arch, size=size)
    cpu = load_backend(str(path), device="cpu", dtype="float32")
    reference = _records(cpu, reqs, prefetch=0)
    checks: dict[str, Any] = {}
    backends = {"float32": cpu}
    if device == "cuda":
        backends = {d: load_backend(str(path), device="cuda", dtype=d) for d in TOL_DTYPES}
        checks["cpu-vs-device"] = _max_diffs(_records(backends["float32"], reqs), reference)
    for dtype, backend in backends.items():
        fast = _records(backend, reqs)
        eager = _records(backend, reqs, capture="eager")
        checks[f"fast-vs-eager-{dtype}"] = _max_diffs(fast, eager)
        if backend.arch.packed_vision:
            backend.model.set_attn_implementation({"vision_config": "sdpa"})
            stock = _records(backend, reqs)
            vis.use_packed_vision(backend.model)
            checks[f"packed-vision-{dtype}"] = _max_diffs(fast, stock)
        overlap = backend.overlap
        try:
            backend.overlap = False  # serial: prepare, run, read, one batch after the other
            serial = _jsonl(backend, reqs, folder / f"{arch}-{dtype}-serial.jsonl", prefetch=0)
            backend.overlap = True  # CUDA's default; on a CPU run, the same order of calls
            made = _jsonl(backend, reqs, folder / f"{arch}-{dtype}-prefetch.jsonl", prefetch=3)
        finally:
            backend.overlap = overlap
        checks[f"prefetch-{dtype}"] = {"byte_identical": made == serial}
    out[arch] = checks


def check_costs(folder: Path, reqs: list, out: dict[str, Any]) -> None:
    """Syncs and kernels the capture adds to a bfloat16 prefill on CUDA, per decoder layer: the
    difference between a 12-layer and a 4-layer tiny LLaVA, so per-forward work cancels."""
    counts = {}
    for layers in (4, 12):
        path = build_tiny_model("llava", folder / f"llava{layers}", size=TinySize(layers))
        backend = load_backend(str(path), device="cuda", dtype="bfloat16")
        counts[layers] = _device_costs(backend, reqs)
    added = [counts[n]["kernels"]["capture"] - counts[n]["kernels"]["plain"] for n in (4, 12)]
    out["llava-bfloat16"] = {
        "host-syncs": counts[12]["syncs"],
        "kernels": {"added_per_layer": (added[1] - added[0]) / 8, "added_per_forward": added},
    }


def _device_costs(backend: Backend, reqs: list) -> dict[str, Any]:
    encoded = backend.prepare(reqs[:2], "vanilla", DIGITS)  # two prompts, left padded
    inputs = backend.to_device(encoded.inputs)

    def capture() -> None:
        backend.prefill(inputs, "fast", keep_cache=False)

    def plain() -> None:
        backend.model.set_attn_implementation({"text_config": "sdpa"})
        try:
            with torch.no_grad():
                backend.model(**inputs, use_cache=False, logits_to_keep=1)
        finally:
            backend.model.set_attn_implementation({"text_config": "lad_capture"})

    capture()  # warm up
    plain()
    return {
        "syncs": {"capture": _syncs(capture), "plain": _syncs(plain)},
        "kernels": {"capture": _kernels(capture), "plain": _kernels(plain)},
    }


def verdicts(results: dict[str, Any]) -> list[tuple[str, bool, str]]:
    lines = []
    for arch, checks in results.items():
        for name, value in checks.items():
            if name.startswith("prefetch"):
                ok = value["byte_identical"]
            elif name == "host-syncs":
                ok = value["capture"] <= value["plain"]
            elif name == "kernels":
                ok = value["added_per_layer"] <= 6
            else:
                tol = TOL[name]
                ok = value["attention"] <= tol and value["logprobs"] <= tol
                ok = ok and value["same_vanilla_choices"]
            lines.append((f"{arch} {name}", ok, json.dumps(value)))
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--archs", nargs="+", choices=ARCHS, default=list(ARCHS))
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device here")
    results: dict[str, Any] = {}
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        reqs = _requests(_images(folder))
        for arch in args.archs:
            check_arch(arch, folder, args.device, reqs, results)
            if args.json:
                Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
        if args.device == "cuda":
            check_costs(folder, reqs, results)
            if args.json:
                Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    lines = verdicts(results)
    for name, ok, detail in lines:
        print(f"{'ok  ' if ok else 'FAIL'} {name}: {detail}")
    print(f"{sum(ok for _, ok, _ in lines)}/{len(lines)} checks passed in "
          f"{time.perf_counter() - start:.0f} s")  # fmt: skip
    if not all(ok for _, ok, _ in lines):
        sys.exit(1)


if __name__ == "__main__":
    main()
