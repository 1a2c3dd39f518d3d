"""ℓ2-normalised CLIP embeddings of images and captions, cached on disk (paper Appendix C).

Any CLIP-like transformers model (`get_image_features` and `get_text_features`) works. The cache
folder keeps `images.npy` + `images.txt` (resolved paths) and `texts.npy` + `texts.jsonl` (JSON
strings); a later build reuses every row it finds and computes only what is missing.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from lad.errors import BackendError, DataError
from lad.io.device import resolve_device
from lad.io.images import open_image

DEFAULT_CLIP = "openai/clip-vit-large-patch14"


@dataclass
class CacheStats:
    """Rows found in the cache (hits) and computed now (misses), per kind."""

    hits: dict[str, int] = field(default_factory=lambda: {"images": 0, "texts": 0})
    misses: dict[str, int] = field(default_factory=lambda: {"images": 0, "texts": 0})


def cache_dir_for(out: str | Path, model: str) -> Path:
    """The cache folder next to an output file: `.lad-clip-cache/<model slug>/`."""
    if Path(model).exists():
        resolved = str(Path(model).resolve())
        slug = f"{Path(model).name}-{hashlib.sha256(resolved.encode()).hexdigest()[:8]}"
    else:
        slug = model.replace("/", "--")
    return Path(out).resolve().parent / ".lad-clip-cache" / slug


class ClipEmbedder:
    """Loads a CLIP-like model once and embeds images or texts in batches, ℓ2-normalised."""

    def __init__(self, model: str = DEFAULT_CLIP, *, device: str = "auto", batch_size: int = 32):
        self.model_name = model
        self.device = resolve_device(device)
        self.batch_size = batch_size

    @functools.cached_property
    def _loaded(self) -> tuple:
        """(model, tokenizer, image processor), loaded on first use."""
        from transformers import AutoImageProcessor, AutoModel, AutoTokenizer

        try:
            model = AutoModel.from_pretrained(self.model_name).to(self.device).eval()
            tokenizer = AutoTokenizer.from_pretrained(self.model_name)
            processor = AutoImageProcessor.from_pretrained(self.model_name)
        except (OSError, ValueError) as e:
            raise BackendError(f"cannot load CLIP model {self.model_name!r}: {e}") from None
        if not hasattr(model, "get_image_features") or not hasattr(model, "get_text_features"):
            raise BackendError(
                f"{self.model_name!r} ({type(model).__name__}) is not CLIP-like: it lacks "
                "get_image_features / get_text_features"
            )
        return model, tokenizer, processor

    def embed_images(self, paths: Sequence[Path]) -> np.ndarray:
        model, _, processor = self._loaded

        def run(batch: Sequence[Path]) -> object:
            pixels = processor(images=[open_image(p) for p in batch], return_tensors="pt")
            return model.get_image_features(pixel_values=pixels["pixel_values"].to(self.device))

        return self._batched(paths, "images", run)

    def embed_texts(self, texts: Sequence[str]) -> np.ndarray:
        model, tokenizer, _ = self._loaded
        text_config = getattr(model.config, "text_config", model.config)
        max_length = getattr(text_config, "max_position_embeddings", 77)

        def run(batch: Sequence[str]) -> object:
            encoded = tokenizer(
                list(batch),
                padding=True,
                truncation=True,
                max_length=max_length,
                return_tensors="pt",
            )
            encoded = {k: v.to(self.device) for k, v in encoded.items() if k != "token_type_ids"}
            return model.get_text_features(**encoded)

        return self._batched(texts, "texts", run)

    def _batched(
        self, inputs: Sequence, what: str, run: Callable[[Sequence], object]
    ) -> np.ndarray:
        import torch
        from tqdm import tqdm

        chunks = []
        starts = range(0, len(inputs), self.batch_size)
        with torch.no_grad():
            for start in tqdm(starts, desc=f"CLIP {what}", unit="batch", leave=False):
                features = run(inputs[start : start + self.batch_size])
                # transformers 5 returns a model output whose pooler_output holds the features.
                features = getattr(features, "pooler_output", features)
                features = torch.nn.functional.normalize(features.float(), dim=-1)  # (B, D)
                chunks.append(features.cpu().numpy())
        return np.concatenate(chunks) if chunks else np.zeros((0, 0), np.float32)


class EmbeddingCache:
    """Embeddings keyed by image path or caption text, kept as npy + a list of keys."""

    def __init__(self, folder: str | Path, embedder: ClipEmbedder):
        self.folder = Path(folder)
        self.embedder = embedder
        self.stats = CacheStats()

    def images(self, paths: Sequence[Path]) -> np.ndarray:
        keys = [str(Path(p).resolve()) for p in paths]
        return self._lookup("images", keys, self.embedder.embed_images)

    def texts(self, texts: Sequence[str]) -> np.ndarray:
        return self._lookup("texts", list(texts), self.embedder.embed_texts)

    def _lookup(self, kind: str, keys: list[str], compute: Callable) -> np.ndarray:
        known, table = self._read(kind)
        missing = list(dict.fromkeys(k for k in keys if k not in known))
        self.stats.hits[kind] += len(keys) - sum(k not in known for k in keys)
        self.stats.misses[kind] += len(missing)
        if missing:
            new = compute(missing)
            table = new if table is None else np.concatenate([table, new])
            for k in missing:
                known[k] = len(known)
            self._write(kind, list(known), table)
        return table[[known[k] for k in keys]] if keys else np.zeros((0, 0), np.float32)

    def _paths(self, kind: str) -> tuple[Path, Path]:
        suffix = ".txt" if kind == "images" else ".jsonl"
        return self.folder / f"{kind}.npy", self.folder / f"{kind}{suffix}"

    def _read(self, kind: str) -> tuple[dict[str, int], np.ndarray | None]:
        npy, listing = self._paths(kind)
        if not npy.is_file() or not listing.is_file():
            return {}, None
        lines = listing.read_text(encoding="utf-8").splitlines()
        keys = lines if kind == "images" else [json.loads(line) for line in lines]
        table = np.load(npy)
        if table.shape[0] != len(keys):
            raise DataError(
                f"{self.folder}: cache is inconsistent ({table.shape[0]} rows in {npy.name}, "
                f"{len(keys)} in {listing.name}); delete the folder to rebuild it"
            )
        return {k: i for i, k in enumerate(keys)}, table

    def _write(self, kind: str, keys: list[str], table: np.ndarray) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        npy, listing = self._paths(kind)
        lines = keys if kind == "images" else [json.dumps(k) for k in keys]
        # Write both files beside the old ones, then swap, so an interrupted build leaves a
        # consistent cache.
        tmp_npy, tmp_listing = npy.with_suffix(".tmp.npy"), listing.with_suffix(".tmp")
        np.save(tmp_npy, table.astype(np.float32))
        tmp_listing.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
        os.replace(tmp_npy, npy)
        os.replace(tmp_listing, listing)
