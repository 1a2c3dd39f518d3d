"""Small datasets in MS-COCO / Flickr8k file formats and a tiny random CLIP, all made locally."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from PIL import Image

COLOURS = ["red", "green", "blue", "yellow", "black", "white"]
THINGS = ["dog", "cat", "bus", "kite", "boat", "horse", "pizza", "train"]
WORDS = ["a", "the", "on", "in", "with", "near", "photo", "of", *COLOURS, *THINGS]


def make_images(folder: Path, count: int, seed: int = 0) -> list[str]:
    """`count` JPEGs of coloured rectangles; similar colours make visual neighbours."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    names = []
    for i in range(count):
        base = rng.integers(0, 256, size=3)
        pixels = np.tile(base, (48, 64, 1)).astype(np.uint8)
        for _ in range(3):
            x, y = rng.integers(0, 48), rng.integers(0, 32)
            pixels[y : y + 16, x : x + 16] = rng.integers(0, 256, size=3)
        name = f"img_{i:04d}.jpg"
        Image.fromarray(pixels).save(folder / name, quality=95)
        names.append(name)
    return names


def make_captions(count: int, seed: int = 0) -> list[list[str]]:
    """Two or three captions of random words per image (varied enough that a random CLIP's text
    cosines spread out); image i and i + count/2 share their first caption, so the text filter
    always has pairs to remove (cosine 1)."""
    rng = np.random.default_rng(seed + 1)
    captions = []
    for _ in range(count):
        own = [
            " ".join(rng.choice(WORDS, size=int(rng.integers(3, 10))))
            for _ in range(int(rng.integers(2, 4)))
        ]
        captions.append(own)
    half = count // 2
    for i in range(half):
        captions[i + half][0] = captions[i][0]
    return captions


def write_coco(root: Path, count: int = 40, seed: int = 0) -> dict[str, Path]:
    """images/, captions.json and instances.json in MS-COCO's format."""
    names = make_images(root / "images", count, seed)
    captions = make_captions(count, seed)
    rng = np.random.default_rng(seed + 2)
    images = [
        {"id": 1000 + i, "file_name": n, "height": 48, "width": 64} for i, n in enumerate(names)
    ]
    caption_ann = [
        {"id": len(images) * j + i, "image_id": 1000 + i, "caption": c}
        for i, caps in enumerate(captions)
        for j, c in enumerate(caps)
    ]
    instance_ann = [
        {"id": 10 * i + k, "image_id": 1000 + i, "category_id": int(c), "area": 1.0}
        for i in range(count)
        for k, c in enumerate(rng.choice([1, 2, 3], size=int(rng.integers(1, 3)), replace=False))
    ]
    paths = {"images": root / "images", "captions": root / "captions.json"}
    paths["instances"] = root / "instances.json"
    paths["captions"].write_text(json.dumps({"images": images, "annotations": caption_ann}))
    paths["instances"].write_text(
        json.dumps({"images": images, "annotations": instance_ann, "categories": []})
    )
    return paths


def write_flickr(root: Path, count: int = 40, seed: int = 0) -> dict[str, Path]:
    """images/ and Flickr8k.token.txt in Flickr8k's format."""
    names = make_images(root / "images", count, seed)
    lines = [
        f"{name}#{k}\t{caption}"
        for name, caps in zip(names, make_captions(count, seed), strict=True)
        for k, caption in enumerate(caps)
    ]
    token = root / "Flickr8k.token.txt"
    token.write_text("\n".join(lines) + "\n")
    return {"images": root / "images", "captions": token}


def make_tiny_clip(folder: Path) -> Path:
    """A random-init CLIPModel with a word-level tokenizer and an image processor, saved with
    save_pretrained so it loads back by path exactly like a hub checkpoint."""
    import torch
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors
    from transformers import CLIPConfig, CLIPImageProcessor, CLIPModel, PreTrainedTokenizerFast

    specials = ["<pad>", "<unk>", "<bos>", "<eos>"]  # eos id 3: not the legacy id 2
    vocab = {w: i for i, w in enumerate([*specials, *WORDS])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.TemplateProcessing(
        single="<bos> $A <eos>", special_tokens=[("<bos>", 2), ("<eos>", 3)]
    )
    PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", unk_token="<unk>", bos_token="<bos>",
        eos_token="<eos>",
    ).save_pretrained(folder)  # fmt: skip
    config = CLIPConfig(
        text_config={
            "vocab_size": len(vocab), "hidden_size": 32, "intermediate_size": 64,
            "num_hidden_layers": 2, "num_attention_heads": 2, "max_position_embeddings": 32,
            "pad_token_id": 0, "bos_token_id": 2, "eos_token_id": 3,
        },
        vision_config={
            "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
            "num_attention_heads": 2, "image_size": 32, "patch_size": 8,
        },
        projection_dim=16,
    )  # fmt: skip
    torch.manual_seed(0)
    CLIPModel(config).save_pretrained(folder)
    CLIPImageProcessor(
        size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32}
    ).save_pretrained(folder)
    return folder
