"""Generation for the prompting baselines (paper §5.1, docs/baselines.md): replies decoded from
the record's own pass.

One prompt forward gives the record and starts decoding from its KV cache (self-consistency's S
paths share it). Sampling draws with a generator seeded from (seed, item id, ordering), so a
record's replies do not depend on the batch it falls in: the same on a rerun and on resume.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from lad.backends.batches import Prefill, batched
from lad.backends.hf import Backend, decode_steps, repeat_rows
from lad.core.labels import LabelScheme
from lad.core.records import Record
from lad.errors import BackendError

if TYPE_CHECKING:
    from lad.core.items import Request


@dataclass(frozen=True)
class GenerationOptions:
    """samples: paths per prompt; temperature 0 = greedy; top_k 0 = no top-k cut."""

    max_new_tokens: int = 1024
    samples: int = 1
    temperature: float = 0.0
    top_k: int = 0
    seed: int = 0

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1 or self.samples < 1 or self.top_k < 0:
            raise BackendError(
                "max_new_tokens and samples must be >= 1 and top_k >= 0; got "
                f"{self.max_new_tokens}, {self.samples}, {self.top_k}"
            )
        if not self.temperature >= 0:
            raise BackendError(f"The 'temperature' parameter must be >= 0. Got {self.temperature}")
        if self.samples > 1 and self.temperature == 0:
            raise BackendError("several samples need a temperature > 0 (greedy paths are equal)")


def generation_records(
    backend: Backend,
    requests: Iterable[Request],
    *,
    template: str,
    scheme: LabelScheme,
    options: GenerationOptions,
    batch_size: int = 1,
) -> Iterator[Record]:
    """One record per request, its replies in `extra`, yielded as each batch finishes."""
    for batch in batched(requests, batch_size):
        records, pre, inputs = backend.score_prepared(
            backend.prepare(batch, template, scheme), keep_cache=True
        )
        generators = [_generator(options.seed, it.id, t, backend.device) for it, t, _ in batch]
        paths = decode(backend, pre, inputs["attention_mask"], generators, options)
        tok = backend.processor.tokenizer
        stops = stop_tokens(backend)
        s = options.samples
        for b, rec in enumerate(records):
            mine = paths[b * s : (b + 1) * s]
            replies = [p[:-1] if p and p[-1] in stops else p for p in mine]  # less the stop token
            rec.extra.update(
                template=template,
                replies=[tok.decode(p, skip_special_tokens=True) for p in replies],
                generated_tokens=[len(p) for p in mine],
            )
            yield rec


def stop_tokens(backend: Backend) -> set[int]:
    """End-of-answer and EOS: either ends a reply."""
    eos = backend.processor.tokenizer.eos_token_id
    return {backend.end_of_answer_id()} | (set() if eos is None else {int(eos)})


def _generator(seed: int, item: str, ordering: int, device: torch.device) -> torch.Generator:
    digest = hashlib.sha256(f"{seed}\n{item}\n{ordering}".encode()).digest()
    gen = torch.Generator(device=device)
    gen.manual_seed(int.from_bytes(digest[:8], "little") & ((1 << 63) - 1))
    return gen


def next_tokens(
    logits: torch.Tensor, generators: list[torch.Generator], options: GenerationOptions
) -> torch.Tensor:
    """(R,) next token per row of logits (R, V); row r draws from generators[r // samples]."""
    if options.temperature == 0:
        return logits.argmax(dim=-1)
    scaled = logits.float() / options.temperature
    if options.top_k and options.top_k < scaled.shape[-1]:
        kth = scaled.topk(options.top_k, dim=-1).values[:, -1:]  # (R, 1)
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    probs = scaled.softmax(dim=-1)
    s = options.samples
    rows = [
        torch.multinomial(probs[r], 1, generator=generators[r // s]) for r in range(probs.shape[0])
    ]
    return torch.cat(rows)


@torch.no_grad()
def decode(
    backend: Backend,
    pre: Prefill,
    mask: torch.Tensor,
    generators: list[torch.Generator],
    options: GenerationOptions,
) -> list[list[int]]:
    """Token ids of every path (B·S rows, request-major), continuing the prompt's cache."""
    s = options.samples
    cache = repeat_rows(pre.cache, len(pre.logits), s, mask.device)
    logits, mask = pre.logits.repeat_interleave(s, dim=0), mask.repeat_interleave(s, dim=0)
    stops = torch.tensor(sorted(stop_tokens(backend)), device=mask.device)
    rows = logits.shape[0]
    done = torch.zeros(rows, dtype=torch.bool, device=mask.device)
    steps: list[torch.Tensor] = []
    for step in range(options.max_new_tokens):
        token = next_tokens(logits, generators, options).masked_fill(done, int(stops[0]))
        steps.append(torch.where(done, -1, token))
        done |= torch.isin(token, stops)
        if bool(done.all()) or step == options.max_new_tokens - 1:
            break
        mask = torch.cat([mask, mask.new_ones((rows, 1))], dim=1)
        logits = decode_steps(backend, token[:, None], mask, cache)[:, -1]
    table = torch.stack(steps, dim=1).tolist()  # (R, steps)
    return [[t for t in row if t >= 0] for row in table]
