"""Eq. 6's attention rows inside vLLM's workers (docs/backends.md, "The vLLM engine").

vLLM computes attention in fused kernels that return no weights. A forward pre-hook on each of
the language decoder's `Attention` layers sees that layer's q and k after RoPE (M-RoPE too), as
(tokens, heads · head_dim) rows of the whole scheduled step. For each request lad asked about
(its SamplingParams' `extra_args["lad_capture"]`, a tag, and `"lad_row"`, the position of its
last prompt token), the hook keeps the request's keys while its prompt is prefilled, chunk by
chunk, and in the step that holds that token computes softmax(q·Kᵀ·scale) over the keys up to
it, grouped-query heads matched to their KV head, and sums the heads: O(T) per layer. The sums
are taken by the driver (`lad_take`), with the head count, so that tensor-parallel shards
(a share of the heads each) and pipeline stages (a share of the layers) merge exactly.

`CaptureWorker` is vLLM's `worker_extension_cls`: its methods join the worker's and are called
by name through `collective_rpc`, in-process or in worker processes alike.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import torch

TAG, ROW = "lad_capture", "lad_row"  # the keys of SamplingParams.extra_args
_LAYER = re.compile(r"layers\.(\d+)\.")


@dataclass
class _Request:
    """One captured request: keys of its prompt so far per layer, and the finished rows."""

    row: int  # position of the last prompt token, whose attention is Eq. 6's
    keys: dict[int, list[torch.Tensor]] = field(default_factory=dict)
    sums: dict[int, torch.Tensor] = field(default_factory=dict)  # layer -> (row + 1,) head sum
    errors: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class _Slot:
    """A captured request's tokens in one step: rows [first, first + count) of q and k, which
    hold positions start … start + count - 1."""

    tag: str
    first: int
    count: int
    start: int


class _State:
    """The hooks' bookkeeping in one worker."""

    def __init__(self, runner: Any) -> None:
        self.runner = runner
        self.requests: dict[str, _Request] = {}
        self.errors: list[str] = []
        self.heads = 0  # query heads of this worker's decoder layers (its tensor-parallel share)
        self._step: tuple[Any, list[_Slot]] | None = None

    def slots(self, metadata: Any) -> list[_Slot]:
        """The captured requests of the step whose attention metadata this is (every layer of a
        step shares one object, so this runs once a step)."""
        if self._step is not None and self._step[0] is metadata:
            return self._step[1]
        runner = self.runner
        ids = runner.input_batch.req_ids
        starts = metadata.query_start_loc.tolist()
        lengths = metadata.seq_lens.tolist()
        slots = []
        for i, req_id in enumerate(ids):
            params = runner.requests[req_id].sampling_params
            extra = getattr(params, "extra_args", None) or {}
            tag = extra.get(TAG)
            if tag is None:
                continue
            count = starts[i + 1] - starts[i]
            start = lengths[i] - count
            if tag not in self.requests:
                self.requests[tag] = _Request(int(extra[ROW]))
            slots.append(_Slot(tag, starts[i], count, start))
        self._step = (metadata, slots)
        return slots

    def hook(self, layer: int, module: Any, query: torch.Tensor, key: torch.Tensor) -> None:
        from vllm.forward_context import get_forward_context, is_forward_context_available

        if not is_forward_context_available():
            return
        metadata = get_forward_context().attn_metadata
        if metadata is None:  # a dummy run (profiling, warm-up)
            return
        if not isinstance(metadata, dict):
            self.errors.append(
                "vLLM ran this step as micro-batches (a list of attention metadata), which the "
                "capture does not read; turn micro-batching (dbo) off"
            )
            return
        metadata = metadata.get(module.layer_name)
        if metadata is None:
            return
        h, h_kv, d = module.num_heads, module.num_kv_heads, module.head_size
        for slot in self.slots(metadata):
            self._capture(layer, slot, query, key, (h, h_kv, d), module.impl.scale)

    def _capture(
        self,
        layer: int,
        slot: _Slot,
        query: torch.Tensor,
        key: torch.Tensor,
        shape: tuple[int, int, int],
        scale: float,
    ) -> None:
        h, h_kv, d = shape
        req = self.requests[slot.tag]
        if slot.start > req.row:  # past the captured token (a label step or a decode step)
            return
        kept = req.keys.setdefault(layer, [])
        if slot.start == 0:  # a new prefill (or one recomputed after preemption)
            kept.clear()
            req.sums.pop(layer, None)
        seen = sum(k.shape[0] for k in kept)
        if seen != slot.start:
            req.errors.append(
                f"layer {layer}: the request's keys before position {slot.start} were not "
                f"computed in this engine's steps (only {seen} were): prefix caching or a KV "
                "connector skipped them"
            )
            return
        rows = slice(slot.first, slot.first + slot.count)
        keys = key[rows].reshape(slot.count, h_kv, d)
        end = req.row - slot.start + 1  # tokens of this chunk up to the captured one
        if end > slot.count:  # the captured token comes in a later chunk
            kept.append(keys.float())
            return
        keys = torch.cat([*kept, keys[:end].float()])  # (row + 1, H_kv, D)
        q = query[slot.first + end - 1].reshape(h_kv, h // h_kv, d).float()  # (H_kv, G, D)
        scores = torch.bmm(q, keys.permute(1, 2, 0)) * scale  # (H_kv, G, row + 1)
        req.sums[layer] = scores.softmax(-1).sum((0, 1))
        del req.keys[layer]


class CaptureWorker:
    """vLLM's worker extension (`worker_extension_cls`): the capture's install and read-out."""

    def lad_install(self) -> dict[str, Any]:
        """Hook every decoder Attention layer; what the driver checks before any request."""
        from vllm.model_executor.layers.attention import Attention
        from vllm.v1.attention.backend import AttentionType

        runner = self.model_runner  # type: ignore[attr-defined]
        if not (hasattr(runner, "input_batch") and hasattr(runner, "requests")):
            return {
                "problem": "vLLM's V2 model runner is not supported: set VLLM_USE_V2_MODEL_RUNNER=0"
            }
        state = getattr(self, "_lad_state", None)
        if state is not None:
            return state.installed
        state = _State(runner)
        layers, problems = [], []
        for module in runner.get_model().modules():
            if not isinstance(module, Attention) or module.attn_type != AttentionType.DECODER:
                continue
            found = _LAYER.search(module.layer_name + ".")
            if found is None:
                problems.append(f"attention layer {module.layer_name} has no layer index")
                continue
            if module.sliding_window is not None:
                problems.append(f"layer {module.layer_name} attends in a sliding window")
            if getattr(module.impl, "logits_soft_cap", None):
                problems.append(f"layer {module.layer_name} soft-caps its attention logits")
            if getattr(module, "use_mm_prefix", False):
                problems.append(f"layer {module.layer_name} attends bidirectionally on images")
            layer = int(found.group(1))
            state.heads = int(module.num_heads)
            module.register_forward_pre_hook(_pre_hook(state, layer), with_kwargs=True)
            layers.append(layer)
        state.installed = {"layers": sorted(layers), "problem": "; ".join(problems) or None}
        self._lad_state = state  # type: ignore[attr-defined]
        return state.installed

    def lad_take(self, tags: list[str]) -> dict[str, Any]:
        """The finished head sums of `tags` (layer -> (T,) list), forgotten here, the errors
        met on them, and those met on no request in particular (kept for every caller)."""
        state: _State = self._lad_state  # type: ignore[attr-defined]
        rows, errors = {}, {}
        for tag in tags:
            req = state.requests.pop(tag, None)
            if req is not None:
                rows[tag] = {layer: row.tolist() for layer, row in req.sums.items()}
                errors[tag] = req.errors
        return {
            "rows": rows,
            "errors": errors,
            "common": list(state.errors),
            "heads": state.heads,
        }

    def lad_drop(self, tags: list[str]) -> None:
        """Forget `tags` (requests that failed or were aborted)."""
        state: _State = self._lad_state  # type: ignore[attr-defined]
        for tag in tags:
            state.requests.pop(tag, None)


def _pre_hook(state: _State, layer: int) -> Any:
    def hook(module: Any, args: tuple, kwargs: dict) -> None:
        query = args[0] if args else kwargs["query"]
        key = args[1] if len(args) > 1 else kwargs["key"]
        state.hook(layer, module, query, key)

    return hook
