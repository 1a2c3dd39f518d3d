"""Everything lad knows about particular architectures, in one small table keyed by model_type.

An architecture is one `Arch` row (docs/backends.md, "Adding an architecture"). How the answer is
written (labels, end of answer) is not here: it is read from each checkpoint's own chat template
(lad.backends.prompting.reply_tokens).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
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
    remote_code: the transformers release the model's own code (shipped with the checkpoint,
        config.json auto_map) is written for; loaded with trust_remote_code in an environment
        that has it, captured by lad.backends.remote, each image's span read from the token ids
        (its markers around the image tokens). None: transformers' own model.
    """

    name: str
    model_types: tuple[str, ...]
    markers: tuple[str, ...] = ()
    image_options: dict[str, Any] = field(default_factory=dict)
    mrope: bool = False
    pixel_budget: bool = False
    packed_vision: bool = False
    remote_code: str | None = None

    def processor_options(
        self, options: dict[str, Any] | None, processor: Any = None
    ) -> dict[str, Any]:
        """The processor call's keyword arguments: this architecture's defaults, updated by the
        user's `options`, whose "min_pixels" / "max_pixels" set a pixel-budget processor's size
        (a processor call's own min_pixels / max_pixels are deprecated in transformers 5); any
        other must be one `processor` takes (image_options_taken), which would ignore it."""
        user = dict(options or {})
        edges = {"min_pixels": "shortest_edge", "max_pixels": "longest_edge"}
        pixels = {edge: user.pop(key) for key, edge in edges.items() if key in user}
        taken = image_options_taken(processor)
        unknown = sorted(set(user) - taken) if taken is not None else []
        if unknown:
            name = type(processor).__name__
            raise BackendError(
                f"--image-option {unknown[0]}: the model's processor ({name}) takes no such "
                f"option; it takes {', '.join(sorted(taken))}"
            )
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
        size = {**(merged.get("size") or {}), **pixels}
        if size.get("shortest_edge", 0) > size.get("longest_edge", float("inf")):
            raise BackendError(
                f"--min-pixels {size['shortest_edge']} exceeds --max-pixels {size['longest_edge']}"
            )
        return {**merged, "size": size}


def image_options_taken(processor: Any) -> set[str] | None:
    """The image options a transformers processor's call takes: its images_kwargs and its image
    processor's valid_kwargs (transformers 5 declares both); None where unknown (no processor, or
    one of a checkpoint's own code, whose call may take more)."""
    declared = getattr(processor, "valid_processor_kwargs", None)
    if declared is None or not type(processor).__module__.startswith("transformers."):
        return None
    images = declared.__annotations__.get("images_kwargs")
    own = getattr(getattr(processor, "image_processor", None), "valid_kwargs", None)
    taken = {*getattr(images, "__annotations__", {}), *getattr(own, "__annotations__", {})}
    return taken - {"return_tensors"}  # lad's call sets it (prompting.tokenised)


_QWEN_MARKERS = ("<|vision_start|>", "<|vision_end|>")
# 256 merged tokens (28x28 px each) per image at most: a 4-image prompt stays near 1,100 tokens.
_QWEN_PIXELS = {"size": {"shortest_edge": 56 * 56, "longest_edge": 256 * 28 * 28}}
# Qwen3-VL / Qwen3.5 merge 32 px per token and upscale a picture to 65,536 pixels at least (64
# tokens, the model's own minimum); 256 tokens at most, as for Qwen2.5-VL.
_QWEN3_PIXELS = {"size": {"shortest_edge": 256 * 256, "longest_edge": 256 * 32 * 32}}


def _qwen(name: str, model_type: str, pixels: dict[str, Any], packed_vision: bool) -> Arch:
    """A Qwen row: its vision markers, a pixel budget, M-RoPE."""
    return Arch(
        name,
        (model_type,),
        _QWEN_MARKERS,
        pixels,
        mrope=True,
        pixel_budget=True,
        packed_vision=packed_vision,
    )


ARCHS: tuple[Arch, ...] = (
    Arch("LLaVA-1.5", ("llava",)),
    _qwen("Qwen2-VL", "qwen2_vl", _QWEN_PIXELS, packed_vision=True),
    _qwen("Qwen2.5-VL", "qwen2_5_vl", _QWEN_PIXELS, packed_vision=True),
    _qwen("Qwen3-VL", "qwen3_vl", _QWEN3_PIXELS, packed_vision=False),
    _qwen("Qwen3.5", "qwen3_5", _QWEN3_PIXELS, packed_vision=False),
    Arch("LLaVA-OneVision", ("llava_onevision",)),
    # RICE-ViT + Qwen3, 28 px per token as Qwen2.5-VL, 1-D RoPE; its code pins transformers 4.53.1.
    Arch(
        "LLaVA-OneVision-1.5",
        ("llavaonevision1_5",),
        _QWEN_MARKERS,
        _QWEN_PIXELS,
        pixel_budget=True,
        remote_code="4.53.1",
    ),
    Arch("InternVL", ("internvl",), ("<img>", "</img>"), {"crop_to_patches": False}),
    Arch("Idefics3/SmolVLM", ("idefics3", "smolvlm"), image_options={"do_image_splitting": False}),
    Arch("Gemma3", ("gemma3",), ("<start_of_image>", "<end_of_image>")),
)


# Kinds of decoder layer (a text config's `layer_types`) that have no softmax attention: Gated
# DeltaNet (Qwen3.5, Qwen3-Next), short convolutions (LFM2), Mamba blocks. They give no
# attention evidence; every other kind (full, sliding, chunked) does.
NO_SOFTMAX = ("linear_attention", "conv", "mamba")


def attention_layers(text_config: Any) -> list[int]:
    """The decoder layers with softmax attention, by index: all of them but in a hybrid model.

    text_config: a language model's config, or its dict as config.json holds it. A record has
    one attention row per such layer, in this order (docs/backends.md, "Hybrid models").
    """
    get = text_config.get if isinstance(text_config, dict) else partial(getattr, text_config)
    count = get("num_hidden_layers", None)
    kinds = get("layer_types", None) or [None] * (count or 0)
    return [i for i, kind in enumerate(kinds[:count]) if kind not in NO_SOFTMAX]


def arch_for(config: Any) -> Arch:
    """The table row for a loaded model's config; without one, a row of defaults where lad can
    tell that nothing about it needs one (`rowless`); otherwise a BackendError in one line."""
    model_type = getattr(config, "model_type", None)
    row = next((arch for arch in ARCHS if model_type in arch.model_types), None)
    return row or rowless(config)


def rowless(config: Any) -> Arch:
    """A row of defaults (no markers, the processor's own image options, 1-D positions) for an
    image-text-to-text model that has no row, where its config shows nothing lad would need one
    for: transformers loads it with AutoModelForImageTextToText, it names an image token, and
    it has no M-RoPE (whose decode-step position ids need `mrope`). Whether its decoder's
    attention goes through transformers' AttentionInterface shows in the first forward (the
    capture then refuses, naming the model type). docs/backends.md, "Adding an architecture"."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES

    model_type = getattr(config, "model_type", None)
    names = getattr(config, "architectures", None) or [type(config).__name__]
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    # the language model's rope settings (rope_parameters in transformers 5)
    rope = getattr(text, "rope_parameters", None) or getattr(text, "rope_scaling", None)
    why = None
    if model_type not in MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES:
        why = "transformers has no image-text-to-text model of that type"
    elif not isinstance(getattr(config, "image_token_id", None), int):
        why = "its config names no image_token_id"
    elif "mrope_section" in str(rope):
        why = "it uses M-RoPE, whose position ids on decoding steps need a row (mrope=True)"
    if why is None:
        return Arch(f"{model_type} (no row)", (model_type,))
    supported = ", ".join(a.name for a in ARCHS)
    raise BackendError(
        f"Unsupported model architecture {names[0]} (model_type {model_type!r}): {why}. lad "
        f"supports: {supported}, text-only causal LMs (AutoModelForCausalLM), and image-text "
        "models without M-RoPE whose decoder uses transformers' attention interface. See "
        "docs/backends.md to add one."
    )
