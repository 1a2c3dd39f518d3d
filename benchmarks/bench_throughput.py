"""python benchmarks/bench_throughput.py --device cuda --shape 7b [--ns 4 8 12] [--batch-size 8]

End-to-end prompts per second of lad's records, against the plain batched forward on the same
prompts, for a model of a real checkpoint's architecture and size built in memory (random init
under the target device and dtype with `_from_config`; nothing downloaded, nothing saved):

  7b    Qwen2.5-VL-7B-Instruct   28 x 3584, 28/4 heads, MLP 18944; vision 32 x 1280, window 112
  2b    Qwen2-VL-2B-Instruct     28 x 1536, 12/2 heads, MLP 8960;  vision 32 x 1280
  256m  SmolVLM-256M-Instruct    30 x 576, 9/3 heads, MLP 1536;    vision 12 x 768, 512 px

(`--tiny` shrinks any of them to a few layers for a CPU run; the architecture stays.) The
tokenizer and processor come from lad.testing.tiny's builders; the model is wrapped in lad's own
`Backend` exactly as `load_backend` sets it up (capture function on the language decoder, lad's
packed vision attention on Qwen towers). Images are JPEG files on disk (448 x 448 by default).

Modes, each timed over the same `--batches` batches of `--batch-size` prompts per N:
  plain   the batched forward alone (SDPA everywhere, vanilla's next-token logits), from
          already processed inputs in host memory: the model's share of the work;
  record  lad's record from the same processed inputs (`Backend.score_prepared`: forward with
          the capture, exact label scoring, records), batch after batch: the capture's cost;
  lad     `Backend.records`: images from disk -> processor -> forward with capture -> exact
          label scoring -> records, preparation prefetched in worker threads (the default);
  serial  the same with `prefetch=0`: preparation in the main loop;
  stock   plain, but the vision tower on transformers' own SDPA attention (Qwen only);
  prep    the input preparation alone (images, processor), prefetched as in `lad`: the most
          prompts/s the host can feed, whatever the model.
Also per N: FLOPs of one prompt (torch.utils.flop_counter on a plain forward, attention
included) and the FLOP-bound prompts/s at the device's peak rate (`--peak-tflops`, or measured
with a dense matmul in the model's dtype); peak tensor memory of one batch, plain vs lad (CUDA:
max_memory_allocated above the model; CPU: live tensor storage, as bench_backend.py measures it).
Times are the minimum over `--repeats` rounds after a warm-up batch per mode. Writes JSON
(after every N, so a run cut short keeps what it measured).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch

from lad.backends import capture as cap
from lad.backends import vision
from lad.backends.archs import arch_for
from lad.backends.hf import PREFETCH, Backend, Encoded
from lad.backends.load import Checkpoint
from lad.backends.pipeline import prefetched
from lad.backends.settings import LoadSettings
from lad.core.labels import get_scheme
from lad.data.items import Item
from lad.testing.tiny import ARCHITECTURES, TinySize, build_tiny_parts

DIGITS = get_scheme("digits")
MODES = ("plain", "record", "lad", "serial", "stock", "prep")


@dataclass(frozen=True)
class Shape:
    """A published checkpoint's architecture: lad.testing.tiny arch, sizes lad.testing.tiny takes,
    and the
    config fields it does not (set by name on the text / vision / top-level config)."""

    checkpoint: str
    arch: str
    size: TinySize
    text: dict[str, Any] = field(default_factory=dict)
    vision: dict[str, Any] = field(default_factory=dict)
    top: dict[str, Any] = field(default_factory=dict)
    processor: dict[str, Any] = field(default_factory=dict)
    image_processor: dict[str, Any] = field(default_factory=dict)
    image_side: int = 448


QWEN_ROPE = {"rope_type": "default", "rope_theta": 1000000.0, "mrope_section": [16, 24, 24]}
SHAPES = {
    "7b": Shape(
        "Qwen/Qwen2.5-VL-7B-Instruct",
        "qwen2_5_vl",
        TinySize(
            text_layers=28,
            hidden=3584,
            heads=28,
            kv_heads=4,
            intermediate=18944,
            vision_layers=32,
            vision_hidden=1280,
            vision_heads=16,
            patch=14,
            image_side=448,
            max_positions=128000,
        ),
        text={"vocab_size": 152064, "rope_parameters": QWEN_ROPE, "rms_norm_eps": 1e-6},
        vision={
            "intermediate_size": 3420,
            "out_hidden_size": 3584,
            "window_size": 112,
            "fullatt_block_indexes": [7, 15, 23, 31],
        },
        top={"tie_word_embeddings": False},
    ),
    "2b": Shape(
        "Qwen/Qwen2-VL-2B-Instruct",
        "qwen2_vl",
        TinySize(
            text_layers=28,
            hidden=1536,
            heads=12,
            kv_heads=2,
            intermediate=8960,
            vision_layers=32,
            vision_hidden=1280,
            vision_heads=16,
            patch=14,
            image_side=448,
            max_positions=32768,
        ),
        text={"vocab_size": 151936, "rope_parameters": QWEN_ROPE, "rms_norm_eps": 1e-6},
        vision={"mlp_ratio": 4, "hidden_size": 1536},
        top={"tie_word_embeddings": True},
    ),
    "256m": Shape(
        "HuggingFaceTB/SmolVLM-256M-Instruct",
        "idefics3",
        TinySize(
            text_layers=30,
            hidden=576,
            heads=9,
            kv_heads=3,
            intermediate=1536,
            vision_layers=12,
            vision_hidden=768,
            vision_heads=12,
            patch=16,
            image_side=512,
            max_positions=8192,
        ),
        text={
            "vocab_size": 49280,
            "head_dim": 64,
            "rms_norm_eps": 1e-5,
            "rope_parameters": {"rope_type": "default", "rope_theta": 100000.0},
        },
        vision={"intermediate_size": 3072},
        top={"scale_factor": 4, "tie_word_embeddings": False},
        processor={"image_seq_len": 64},  # (512 / 16)^2 / 4^2
        # As published: resize to 2048 px on the long side, then (no splitting) to 512.
        image_processor={"size": {"longest_edge": 2048}, "max_image_size": {"longest_edge": 512}},
    ),
}
# --tiny: same architectures, a few narrow layers, small images (still several windows each).
TINY = {
    "7b": Shape(
        "tiny Qwen2.5-VL",
        "qwen2_5_vl",
        TinySize(vision_layers=4, image_side=112),
        vision={"fullatt_block_indexes": [1, 3]},
        image_side=112,
    ),
    "2b": Shape("tiny Qwen2-VL", "qwen2_vl", TinySize(image_side=112), image_side=112),
    "256m": Shape(
        "tiny SmolVLM",
        "idefics3",
        TinySize(image_side=64, patch=16),
        top={"scale_factor": 4},
        processor={"image_seq_len": 1},
        image_side=64,
    ),
}


def _set(config: Any, values: dict[str, Any]) -> None:
    for name, value in values.items():
        if not hasattr(config, name):
            raise AttributeError(f"{type(config).__name__} has no field {name!r}")
        setattr(config, name, value)


def build_backend(shape: Shape, device: torch.device, dtype: torch.dtype) -> Backend:
    """The shape's model, random-init in place on `device`, wrapped as load_backend would."""
    config, processor = build_tiny_parts(shape.arch, size=shape.size)
    _set(config.get_text_config(), shape.text)
    _set(config.vision_config, shape.vision)
    _set(config, shape.top)
    _set(processor, shape.processor)
    _set(processor.image_processor, shape.image_processor)
    processor.tokenizer.padding_side = "left"
    arch = arch_for(config)
    cap.register()
    impl = {"text_config": cap.CAPTURE_IMPL, "vision_config": "sdpa", "": "sdpa"}
    cls = getattr(__import__("transformers"), ARCHITECTURES[shape.arch].model_class)
    torch.manual_seed(0)
    with torch.device(device):
        model = cls._from_config(config, dtype=dtype, attn_implementation=impl).eval()
    if arch.packed_vision:
        vision.use_packed_vision(model)
    name, options = shape.checkpoint, dict(arch.image_options)
    settings = LoadSettings(name)
    return Backend(Checkpoint(name, settings, config, processor, arch, options, name, False), model)


def write_images(folder: Path, count: int, side: int) -> list[Path]:
    """JPEG photos stand-ins: smooth random colour fields (decode cost of real photos)."""
    from PIL import Image

    paths = []
    for i in range(count):
        gen = torch.Generator().manual_seed(i)
        small = torch.rand(3, 8, 8, generator=gen)
        field_ = torch.nn.functional.interpolate(small[None], size=(side, side), mode="bicubic")
        noise = 0.05 * torch.rand(3, side, side, generator=gen)
        pixels = ((field_[0] + noise).clamp(0, 1) * 255).to(torch.uint8).permute(1, 2, 0)
        paths.append(folder / f"img{i}.jpg")
        Image.fromarray(pixels.numpy()).save(paths[-1], quality=90)
    return paths


def make_requests(images: list[Path], n: int, count: int) -> list[tuple[Item, int, list[int]]]:
    reqs = []
    for k in range(count):
        chosen = [images[(k + i) % len(images)] for i in range(n)]
        item = Item(f"n{n}-{k}", "a red circle next to a blue square", chosen, k % n)
        reqs.append((item, 0, list(range(n))))
    return reqs


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def set_text_attention(backend: Backend, impl: str) -> None:
    backend.model.set_attn_implementation({"text_config": impl})


def set_vision_attention(backend: Backend, stock: bool) -> None:
    if backend.arch.packed_vision:
        impl = "sdpa" if stock else vision.VISION_IMPL
        backend.model.set_attn_implementation({"vision_config": impl})


@torch.no_grad()
def plain_forward(backend: Backend, encoded: Encoded) -> None:
    backend.model(**backend.to_device(encoded.inputs), use_cache=False, logits_to_keep=1)


def run_mode(
    backend: Backend, mode: str, reqs: list, encoded: list[Encoded], batch: int, prefetch: int
) -> None:
    """One pass of `mode` over all the prompts."""
    if mode == "prep":
        batches = [reqs[i : i + batch] for i in range(0, len(reqs), batch)]
        prepare = partial(backend.prepare, template="vanilla", scheme=DIGITS, pooled=True)
        for _ in prefetched(batches, prepare, ahead=prefetch):
            pass
        return
    if mode == "record":
        for enc in encoded:
            backend.score_prepared(enc)
        return
    if mode in ("plain", "stock"):
        set_text_attention(backend, "sdpa")
        set_vision_attention(backend, stock=mode == "stock")
        try:
            for enc in encoded:
                plain_forward(backend, enc)
        finally:
            set_text_attention(backend, cap.CAPTURE_IMPL)
            set_vision_attention(backend, stock=False)
        return
    ahead = 0 if mode == "serial" else prefetch
    for _ in backend.records(reqs, scheme=DIGITS, batch_size=batch, prefetch=ahead):
        pass


def timed(work: Callable[[], None], device: torch.device) -> float:
    sync(device)
    start = time.perf_counter()
    work()
    sync(device)
    return time.perf_counter() - start


def flops_per_prompt(backend: Backend, encoded: Encoded) -> float:
    """FLOPs of one prompt's plain forward, counted op by op (SDPA included on every device)."""
    from torch.utils.flop_counter import FlopCounterMode, sdpa_flop_count

    def cpu_sdpa(q_shape: Any, k_shape: Any, v_shape: Any, *args: Any, **kwargs: Any) -> int:
        return sdpa_flop_count(q_shape, k_shape, v_shape)

    aten = torch.ops.aten
    mapping = {aten._scaled_dot_product_flash_attention_for_cpu: cpu_sdpa}
    set_text_attention(backend, "sdpa")
    try:
        with FlopCounterMode(display=False, custom_mapping=mapping) as counter:
            plain_forward(backend, encoded)
    finally:
        set_text_attention(backend, cap.CAPTURE_IMPL)
    return counter.get_total_flops() / len(encoded.batch)


def measured_peak_tflops(device: torch.device, dtype: torch.dtype) -> tuple[float, str]:
    """Dense matmul rate on this device in the model's dtype: best of a few runs."""
    side = 8192 if device.type == "cuda" else 1024
    a = torch.randn(side, side, device=device, dtype=dtype)
    b = torch.randn(side, side, device=device, dtype=dtype)
    a @ b  # warm up

    def ten() -> None:
        for _ in range(10):
            a @ b

    best = min(timed(ten, device) for _ in range(5)) / 10
    return 2 * side**3 / best / 1e12, f"measured: {dtype} matmul {side}^3, best of 5 x 10"


def peak_memory_mib(work: Callable[[], None], device: torch.device) -> float:
    """Peak tensor memory (MiB) of `work` above what was allocated before it."""
    if device.type == "cuda":
        sync(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        work()
        sync(device)
        return (torch.cuda.max_memory_allocated(device) - before) / 2**20
    from bench_backend import tensor_peak

    return tensor_peak(work)


def measure_n(
    backend: Backend, images: list[Path], n: int, args: argparse.Namespace, peak: float
) -> dict[str, Any]:
    b = args.batch_size
    reqs = make_requests(images, n, b * args.batches)
    batches = [reqs[i : i + b] for i in range(0, len(reqs), b)]
    encoded = [backend.prepare(batch, "vanilla", DIGITS) for batch in batches]
    modes = [m for m in args.modes if m != "stock" or backend.arch.packed_vision]
    for mode in modes:  # warm-up: one batch each
        run_mode(backend, mode, batches[0], encoded[:1], b, args.prefetch)
    seconds: dict[str, list[float]] = {m: [] for m in modes}
    for _ in range(args.repeats):
        for mode in modes:
            work = partial(run_mode, backend, mode, reqs, encoded, b, args.prefetch)
            seconds[mode].append(timed(work, backend.device))
    pps = {m: len(reqs) / min(t) for m, t in seconds.items()}
    flops = flops_per_prompt(backend, backend.prepare(reqs[:1], "vanilla", DIGITS))
    one = encoded[0]

    def lad_batch() -> None:
        backend.score_prepared(one)

    def plain_batch() -> None:
        set_text_attention(backend, "sdpa")
        try:
            plain_forward(backend, one)
        finally:
            set_text_attention(backend, cap.CAPTURE_IMPL)

    memory = {
        "plain": peak_memory_mib(plain_batch, backend.device),
        "lad": peak_memory_mib(lad_batch, backend.device),
    }
    tokens = one.inputs["attention_mask"].sum(-1).double().mean().item()
    row = {
        "n": n,
        "prompts": len(reqs),
        "tokens_per_prompt": tokens,
        "image_tokens_per_prompt": sum(e - s for s, e in one.spans[0]),
        "tflop_per_prompt": flops / 1e12,
        "flop_bound_prompts_per_s": peak * 1e12 / flops,
        "seconds": seconds,
        "prompts_per_s": pps,
        "lad_over_plain_time": pps["plain"] / pps["lad"],
        "lad_share_of_flop_bound": pps["lad"] * flops / (peak * 1e12),
        "memory_mib": memory,
        "lad_over_plain_memory": memory["lad"] / memory["plain"],
    }
    for mode in ("record", "serial", "stock", "prep"):
        if mode in pps:
            row[f"{mode}_over_plain_time"] = pps["plain"] / pps[mode]
    return row


def print_row(row: dict[str, Any], first: bool) -> None:
    pps = row["prompts_per_s"]
    modes = [m for m in MODES if m in pps]
    record = row.get("record_over_plain_time")
    if first:
        head = (
            f"{'N':>3} {'tokens':>7} {'TFLOP':>7} {'bound p/s':>10} | "
            + " ".join(f"{m + ' p/s':>11}" for m in modes)
            + f" | {'lad/plain':>9} {'rec/plain':>9} | {'MiB plain':>9} {'lad':>9} {'ratio':>6}"
        )
        print(head)
        print("-" * len(head))
    mem = row["memory_mib"]
    print(
        f"{row['n']:>3} {row['tokens_per_prompt']:>7.0f} {row['tflop_per_prompt']:>7.3g} "
        f"{row['flop_bound_prompts_per_s']:>10.4g} | "
        + " ".join(f"{pps[m]:>11.4g}" for m in modes)
        + f" | {row['lad_over_plain_time']:>9.3f} "
        + (f"{record:>9.3f}" if record else f"{'-':>9}")
        + f" | {mem['plain']:>9.1f} {mem['lad']:>9.1f} {row['lad_over_plain_memory']:>6.3f}",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--shape", choices=sorted(SHAPES), default="7b")
    parser.add_argument("--tiny", action="store_true", help="a few narrow layers (CPU runs)")
    parser.add_argument("--dtype", choices=["bfloat16", "float32"], default=None)
    parser.add_argument("--ns", type=int, nargs="+", default=[4, 8, 12])
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--batches", type=int, default=3, help="batches per timed round")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    parser.add_argument("--image-side", type=int, default=None, help="pixels (default: shape's)")
    parser.add_argument("--prefetch", type=int, default=PREFETCH, help="batches prepared ahead")
    parser.add_argument("--peak-tflops", type=float, default=None)
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    parser.add_argument("--json", default=None, help="write the results here")
    args = parser.parse_args()
    if "plain" not in args.modes or "lad" not in args.modes:
        parser.error("--modes must include plain and lad")
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device here")
    dtype = getattr(torch, args.dtype or ("bfloat16" if device.type == "cuda" else "float32"))
    shape = (TINY if args.tiny else SHAPES)[args.shape]
    side = args.image_side or shape.image_side
    started = time.perf_counter()
    backend = build_backend(shape, device, dtype)
    built = time.perf_counter() - started
    if args.peak_tflops:
        peak, peak_source = args.peak_tflops, "given (--peak-tflops)"
    else:
        peak, peak_source = measured_peak_tflops(device, dtype)
    params = sum(p.numel() for p in backend.model.parameters())
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else None
    print(
        f"{shape.checkpoint} shape ({params / 1e9:.2f} B parameters, built in {built:.1f} s), "
        f"{gpu or platform.processor() or platform.machine()}, {dtype}, batch {args.batch_size}, "
        f"{side} px images; peak {peak:.4g} TFLOP/s ({peak_source})",
        flush=True,
    )
    report = {
        "benchmark": "bench_throughput",
        "shape": args.shape,
        "tiny": args.tiny,
        "checkpoint": shape.checkpoint,
        "parameters": params,
        "device": str(device),
        "gpu": gpu,
        "dtype": str(dtype),
        "torch": torch.__version__,
        "transformers": __import__("transformers").__version__,
        "batch_size": args.batch_size,
        "prefetch": args.prefetch,
        "batches": args.batches,
        "repeats": args.repeats,
        "image_side": side,
        "peak_tflops": peak,
        "peak_source": peak_source,
        "rows": [],
    }
    with tempfile.TemporaryDirectory() as tmp:
        images = write_images(Path(tmp), max(args.ns) + 3, side)
        for i, n in enumerate(args.ns):
            row = measure_n(backend, images, n, args, peak)
            report["rows"].append(row)
            print_row(row, first=i == 0)
            if args.json:
                Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    print(
        "p/s: prompts per second (minimum time over repeats). bound: peak / FLOPs per prompt. "
        "lad/plain, rec/plain: time per prompt of lad end to end / of lad's record from processed "
        "inputs, over the plain forward's. MiB: peak tensor memory of one batch above the model, "
        "plain forward vs lad's record, and their ratio."
    )
    if args.json:
        print(f"written: {args.json}")


if __name__ == "__main__":
    main()
