"""Everything lad knows about particular architectures, in one small table keyed by model_type.

To add an architecture: add an `Arch` row naming its `model_type`s, the marker tokens that belong
to an image's span besides the tokens its placeholder expands to, processor options that keep a
multi-image prompt short, and whether it needs 3-row M-RoPE position ids on decode steps.
How the answer is written (labels, end of answer) is not here: it is read from each checkpoint's
own chat template (lad.backends.prompting.reply_tokens). See docs/backends.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from lad.errors import BackendError


@dataclass(frozen=True)
class Arch:
    """Per-architecture facts.

    markers: tokens right before/after an image's expanded placeholder that are part of its span.
    image_options: processor call defaults (resolution / tiling), overridable by the user.
    mrope: Qwen-style (3, B, T) position ids, offset by `model.model.rope_deltas` after prefill.
    pixel_budget: the processor resizes each image to a pixel count within
                  size["shortest_edge"]..size["longest_edge"] (lad's min_pixels / max_pixels).
    packed_vision: the vision tower runs through lad.backends.vision (all images and windows of
        a batch in one attention call per layer).
    """

    name: str
    model_types: tuple[str, ...]
    markers: tuple[str, ...] = ()
    image_options: dict[str, Any] = field(default_factory=dict)
    mrope: bool = False
    pixel_budget: bool = False
    packed_vision: bool = False

    def processor_options(self, options: dict[str, Any] | None) -> dict[str, Any]:
        """The processor call's keyword arguments: this architecture's defaults, updated by the
        user's `options`, whose "min_pixels" / "max_pixels" set a pixel-budget processor's size
        (a processor call's own min_pixels / max_pixels are deprecated in transformers 5)."""
        user = dict(options or {})
        pixels = {k: user.pop(k) for k in ("min_pixels", "max_pixels") if k in user}
        merged = {**self.image_options, **user}
        if not pixels:
            return merged
        if not self.pixel_budget:
            budget = ", ".join(a.name for a in ARCHS if a.pixel_budget)
            raise BackendError(
                f"--min-pixels/--max-pixels set the pixel budget of {budget} processors; "
                f"{self.name} has none: use --image-size, or its own processor option with "
                "--image-option KEY=VALUE (docs/backends.md)"
            )
        size = dict(merged.get("size") or {})
        for key, edge in (("min_pixels", "shortest_edge"), ("max_pixels", "longest_edge")):
            if key in pixels:
                size[edge] = pixels[key]
        if size.get("shortest_edge", 0) > size.get("longest_edge", float("inf")):
            raise BackendError(
                f"--min-pixels {size['shortest_edge']} exceeds --max-pixels {size['longest_edge']}"
            )
        return {**merged, "size": size}


_QWEN_MARKERS = ("<|vision_start|>", "<|vision_end|>")
# 256 merged tokens (28x28 px each) per image at most: a 4-image prompt stays near 1,100 tokens.
_QWEN_PIXELS = {"size": {"shortest_edge": 56 * 56, "longest_edge": 256 * 28 * 28}}

ARCHS: tuple[Arch, ...] = (
    Arch("LLaVA-1.5", ("llava",)),
    Arch(
        "Qwen2-VL",
        ("qwen2_vl",),
        _QWEN_MARKERS,
        _QWEN_PIXELS,
        mrope=True,
        pixel_budget=True,
        packed_vision=True,
    ),
    Arch(
        "Qwen2.5-VL",
        ("qwen2_5_vl",),
        _QWEN_MARKERS,
        _QWEN_PIXELS,
        mrope=True,
        pixel_budget=True,
        packed_vision=True,
    ),
    Arch("LLaVA-OneVision", ("llava_onevision",)),
    Arch("InternVL", ("internvl",), ("<img>", "</img>"), {"crop_to_patches": False}),
    Arch("Idefics3/SmolVLM", ("idefics3", "smolvlm"), image_options={"do_image_splitting": False}),
    Arch("Gemma3", ("gemma3",), ("<start_of_image>", "<end_of_image>")),
)


def arch_for(config: Any) -> Arch:
    """The table row for a loaded model's config; an unknown architecture is a BackendError."""
    model_type = getattr(config, "model_type", None)
    for arch in ARCHS:
        if model_type in arch.model_types:
            return arch
    names = getattr(config, "architectures", None) or [type(config).__name__]
    supported = ", ".join(a.name for a in ARCHS)
    raise BackendError(
        f"Unsupported model architecture {names[0]} (model_type {model_type!r}). "
        f"lad supports: {supported}, and text-only causal LMs (AutoModelForCausalLM). See "
        "docs/backends.md to add one."
    )
