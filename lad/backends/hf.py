"""HF transformers multi-image LLMs → records: one prefill per prompt, exact labels, Eq. 6 evidence.

The steps are separate small functions so later work can reuse them (generation reuses prompt
building; a mask change such as SoFA swaps `prefill`'s attention): build prompts → encode →
prefill (+ capture) → decode the label trie's open prefixes on the prompt's KV cache → score.
`records` prepares batch b+1.. (images, processor) in worker threads while batch b runs
(lad.backends.pipeline); Qwen2-VL / Qwen2.5-VL vision towers run through lad.backends.vision.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from functools import partial
from typing import TYPE_CHECKING, Any

import torch

from lad.backends import capture as cap
from lad.backends import text as text_lm
from lad.backends.archs import attention_layers
from lad.backends.batches import (
    Encoded,
    Prefill,
    Queued,
    batched,
    check_context,
    check_order,
    extend_inputs,
    make_record,
    positions,
)
from lad.backends.capture import evidence
from lad.backends.pipeline import ProcessorPool, prefetched
from lad.backends.prompting import (
    Replies,
    chat_text,
    check_data_text,
    check_round_trip,
    encode,
    reply_tokens,
)
from lad.backends.remote import Forward
from lad.backends.scoring import (
    LabelTrie,
    Prefix,
    RepetitionPenalty,
    label_logprobs,
    seen_tokens,
)
from lad.backends.threads import ThreadChoice
from lad.core.labels import LabelScheme
from lad.core.prompts import PromptTemplate, render_item, render_prompt, shown_pictures
from lad.core.records import Record
from lad.errors import BackendError, bad_parameter, check_choice
from lad.io.images import open_image

if TYPE_CHECKING:
    from lad.backends.load import Checkpoint
    from lad.core.items import Request

# Entered around a batch's prompt forward (and its label decoding) with (inputs, image spans).
MaskScope = Callable[[dict[str, Any], list[list[tuple[int, int]]]], AbstractContextManager[Any]]
CAPTURE_MODES = ("fast", "eager")
PROBE_CAPTION = "Two dogs run on the beach, and a red kite flies above them."
PREFETCH = 4  # batches prepared ahead of a GPU model, in as many worker threads


class Backend:
    """A loaded model that turns (item, ordering, order) requests into records."""

    def __init__(self, checkpoint: Checkpoint, model: Any) -> None:
        self.model_id = str(checkpoint.model)
        self.template_owner = checkpoint.owner  # named by chat-template errors
        self.model = model
        self.processor = checkpoint.processor
        self.arch = checkpoint.arch
        self.image_options = checkpoint.options
        # resize every picture to this square first (None: as is)
        self.image_size = checkpoint.settings.image_size
        # Label steps' logits penalised as transformers' RepetitionPenaltyLogitsProcessor does
        # (lad.backends.scoring.RepetitionPenalty); None or 1: not at all.
        self.repetition_penalty = checkpoint.settings.repetition_penalty
        text = model.config.get_text_config()
        # The decoder layers with softmax attention (all but in a hybrid): a record row each.
        self.attention_layers: list[int] = attention_layers(text)
        self.num_layers: int = len(self.attention_layers)
        # A hybrid model's records say which decoder layers their attention rows are.
        hybrid = self.num_layers != text.num_hidden_layers
        self.layers_extra = {"attention_layers": self.attention_layers} if hybrid else {}
        self.max_context: int = getattr(text, "max_position_embeddings", 1 << 30)
        # The token an image's placeholder expands to (the processor's image_token_id is wrong
        # for Gemma3; the config's is right for every supported architecture).
        self.image_token: int | None = getattr(model.config, "image_token_id", None)
        self.text_only = checkpoint.text_only  # a causal LM of text alone (no pictures)
        self.device = next(model.parameters()).device
        self.forward = Forward.of(model)  # its cache argument's name, logits_to_keep or not
        self._tries: dict[tuple[str, int], LabelTrie] = {}
        self._round_tripped: set[tuple[str, str, int, bool]] = set()  # (template, scheme, N, text)
        self._end_of_answer: int | None = None
        # Worker threads encode with their own processor copies; the original is used under lock.
        self._processors = ProcessorPool(self.processor)
        # Queue batch b+1 on the device before reading batch b's results back (records); on a
        # CPU the model computes synchronously and there is nothing to overlap.
        self.overlap = self.device.type == "cuda"
        # Hook for mask-level changes such as SoFA (lad.backends.sofa); None = the causal mask.
        self.mask_scope: MaskScope | None = None
        # torch's CPU thread count and how load_backend chose it; None on an accelerator.
        self.threads: ThreadChoice | None = None

    # ----------------------------------------------------------------- public

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
        """One record per request, in request order, yielded as each batch finishes.

        template: a prompt of lad.core.prompts.TEMPLATES by name (an item with a `question` gets its
        question variant), or a PromptTemplate for every item.
        prefetch: batches whose images and inputs are prepared ahead, in worker threads, while
        the model runs; 0: each batch in the calling thread when it is due; None: PREFETCH on
        CUDA, 0 on a CPU (where the model already uses every core). The records are the same;
        an error in a later batch is raised after the earlier batches' records.
        """
        check_choice("capture", capture, CAPTURE_MODES, BackendError)
        if prefetch is None:
            prefetch = PREFETCH if self.device.type == "cuda" else 0
        if prefetch < 0:
            raise bad_parameter("prefetch", ">= 0", prefetch, BackendError)
        prepare = partial(self.prepare, template=template, scheme=scheme, pooled=prefetch > 0)
        batches = prefetched(batched(requests, batch_size), prepare, ahead=prefetch)
        # On a GPU, batch b+1's forward is queued before batch b's results are read back, so the
        # device is not idle while the host turns b into records; on a CPU (no overlap) each batch
        # is read as soon as it is queued. Errors keep batch order.
        ahead = 1 if self.overlap else 0
        queued: list[Queued] = []
        while True:
            try:
                encoded = next(batches, None)
                if encoded is not None:
                    queued.append(self._queue(encoded, capture))
            except Exception:
                for earlier in queued:
                    yield from self._read(earlier)[0]
                raise
            while len(queued) > (0 if encoded is None else ahead):
                yield from self._read(queued.pop(0))[0]
            if encoded is None:
                return

    def label_trie(self, scheme: LabelScheme, num_candidates: int) -> LabelTrie:
        """The labels' trie: each label as the chat template writes the model's reply (cached)."""
        key = (scheme.name, num_candidates)
        if key not in self._tries:
            labels = scheme.labels(num_candidates)
            text = render_prompt("vanilla", "x", scheme, num_candidates)
            replies = self._replies(text, 0 if self.text_only else num_candidates, labels)
            self._tries[key] = LabelTrie.build(replies.labels, replies.end_of_answer, labels)
        return self._tries[key]

    def end_of_answer_id(self) -> int:
        """The token the chat template writes after a reply (EOS where it writes none)."""
        if self._end_of_answer is None:
            images = 0 if self.text_only else 2
            self._end_of_answer = self._replies("Which image?", images, ["1", "2"]).end_of_answer
        return self._end_of_answer

    def _replies(self, text: str, num_images: int, labels: list[str]) -> Replies:
        return reply_tokens(self.processor, text, num_images, labels, self.template_owner)

    # ----------------------------------------------------------------- steps

    def prepare(
        self,
        batch: list[Request],
        template: str | PromptTemplate,
        scheme: LabelScheme,
        *,
        pooled: bool = False,
    ) -> Encoded:
        """A batch's label trie, prompts, images and processor outputs (host side, no model).

        pooled: encode with a processor copy of this thread's own (safe in worker threads).
        """
        n, is_text = batch[0][0].num_candidates, batch[0][0].is_text
        with self._processors.lock:  # the original processor's tokenizer
            self._check_tokenizer(template, scheme, n, text=is_text)  # before the labels' tokens
            trie = self.label_trie(scheme, n)
        images = None
        with self._processors.borrowed() if pooled else nullcontext(self.processor) as proc:
            if is_text:
                inputs, spans = text_lm.encode_text(
                    proc, batch, template, scheme, self.template_owner, self.max_context
                )
            else:
                texts, images = self.build_prompts(batch, template, scheme, proc)
                inputs, spans = self._encode_host(batch, texts, images, proc)
        if self.device.type == "cuda":
            inputs = {k: v.pin_memory() if torch.is_tensor(v) else v for k, v in inputs.items()}
        return Encoded(batch, inputs, spans, trie, images)

    def _check_tokenizer(
        self,
        template: str | PromptTemplate,
        scheme: LabelScheme,
        num_candidates: int,
        text: bool = False,
    ) -> None:
        """Once per prompt template and N: the prompt's tokens must decode back to its text
        (lad.backends.prompting.check_round_trip). The caption is a fixed ASCII probe: a word the
        vocabulary lacks (an <unk>) is the data's matter, not a tokenizer loaded wrongly.
        text: the prompt of text candidates (lad.backends.text)."""
        key = (repr(template), scheme.name, num_candidates, text)
        if key in self._round_tripped:
            return
        proc, owner, n = self.processor, self.template_owner, num_candidates
        if text or self.text_only:
            text_lm.check_text_tokenizer(proc, template, scheme, n, owner)
        else:
            prompt = chat_text(proc, render_prompt(template, PROBE_CAPTION, scheme, n), n, owner)
            check_round_trip(proc.tokenizer, prompt, self.model_id)
        self._round_tripped.add(key)

    def picture(self, path: Any) -> Any:
        """One candidate image as the processor gets it: decoded, then resized to
        `image_size`² (bicubic, as the official code's 336×336) when one is set."""
        image = open_image(path)  # a bad file is a DataError naming it
        if self.image_size is None:
            return image
        from PIL import Image

        return image.resize((self.image_size, self.image_size), Image.Resampling.BICUBIC)

    def encode(
        self, batch: list[Request], texts: list[str], images: list[list[Any]]
    ) -> tuple[dict[str, Any], list[list[tuple[int, int]]]]:
        inputs, spans = self._encode_host(batch, texts, images, self.processor)
        return self.to_device(inputs), spans

    def to_device(self, inputs: dict[str, Any]) -> dict[str, Any]:
        """Inputs on the model's (first) device; from pinned memory the copy does not block."""
        return {
            k: v.to(self.device, non_blocking=True) if torch.is_tensor(v) else v
            for k, v in inputs.items()
        }

    def build_prompts(
        self,
        batch: list[Request],
        template: str | PromptTemplate,
        scheme: LabelScheme,
        processor: Any = None,
    ) -> tuple[list[str], list[list[Any]]]:
        """Chat-template texts and the images in presentation order, one per request, made with
        `processor` (a worker's copy) or else the backend's own; its tokenizer checked as
        `_check_tokenizer` says (a no-op after `prepare`'s check)."""
        proc = self.processor if processor is None else processor
        texts, images = [], []
        for item, _, order in batch:
            check_order(item, order)
            if self.text_only:
                raise BackendError(
                    f"item {item.id!r}: {self.model_id} is a text-only causal LM and cannot be "
                    "shown pictures; give the items text 'candidates' (docs/formats.md)"
                )
            check_data_text(proc.tokenizer, item)
            n = item.num_candidates
            text = render_item(template, item, scheme, n)
            context = len(item.context_images)
            texts.append(chat_text(proc, text, n, self.template_owner, context))
            images.append([self.picture(p) for p in shown_pictures(item, order)[0]])
        self._check_tokenizer(template, scheme, batch[0][0].num_candidates)
        return texts, images

    def _encode_host(
        self, batch: list[Request], texts: list[str], images: list[list[Any]], processor: Any
    ) -> tuple[dict[str, Any], list[list[tuple[int, int]]]]:
        markers = [processor.tokenizer.convert_tokens_to_ids(m) for m in self.arch.markers]
        inputs, all_spans = encode(
            processor, texts, images, self.image_options, self.image_token, markers, self.model_id
        )
        lengths = inputs["attention_mask"].sum(-1).tolist()
        spans = []  # each prompt's candidate spans in position order; context pictures' left out
        for (item, _, order), item_spans, length in zip(batch, all_spans, lengths, strict=True):
            if len(item_spans) != len(item.pictures):
                raise BackendError(
                    f"item {item.id!r}: the prompt has {len(item_spans)} image spans but the item "
                    f"has {len(item.pictures)} images (chat template or processor dropped some)"
                )
            spans.append([item_spans[k] for k in shown_pictures(item, order)[1]])
            image = sum(end - start for start, end in item_spans)
            check_context(item, length, self.max_context, image)
        return inputs, spans

    @torch.no_grad()
    def prefill(
        self, inputs: dict[str, Any], capture: str, keep_cache: bool = True, append: Prefix = ()
    ) -> Prefill:
        """One forward of the prompts; attention rows of the last prompt token in every layer.

        keep_cache: keep the KV cache for decoding steps (not needed when every label is one token).
        append: label tokens fed after the prompt in this same forward (one trie path); causal
        masking leaves the prompt's computation as it was, and no cache has to be kept.
        """
        d = len(append)
        kwargs = dict(extend_inputs(inputs, append), use_cache=keep_cache)
        if not self.arch.mrope:
            kwargs["position_ids"] = positions(kwargs["attention_mask"])
        last = self.forward.last_logits(self.model, kwargs, d + 1)  # logits of d + 1 steps only
        if capture == "eager":
            if self.arch.remote_code:
                why = f"lad does not switch {self.arch.name}'s own code to eager attention"
                raise BackendError(f"{self.model_id}: {why}; use capture='fast'")
            with self.text_attention("eager"), last:
                out = self.model(**kwargs, output_attentions=True)
            rows = cap.eager_rows(out.attentions, self.attention_layers, d)
        else:
            with cap.capturing(offset=d) as captured, last:
                out = self.model(**kwargs)
            rows = cap.stack_rows(
                captured.rows, self.attention_layers, self.device, self.model.config
            )
        logits = out.logits.float()  # (B, D + 1, V)
        paths = logits[:, None, 1:] if d else None  # (B, 1, D, V)
        return Prefill(logits[:, 0], self.forward.cache_of(out), rows, paths)

    @torch.no_grad()
    def _decode_paths(self, trie: LabelTrie, cache: Any, mask: torch.Tensor) -> torch.Tensor:
        """Logits after each token of each trie path, on the prompts' cache: (B, M, D, V)."""
        b, m = mask.shape[0], len(trie.paths)
        d = max(len(p) for p in trie.paths)
        ids = torch.full((b * m, d), trie.eos, dtype=torch.long, device=mask.device)
        step_mask = torch.zeros((b * m, d), dtype=mask.dtype, device=mask.device)
        for j, path in enumerate(trie.paths):
            ids[j::m, : len(path)] = torch.tensor(path, device=mask.device)
            step_mask[j::m, : len(path)] = 1
        cache = repeat_rows(cache, b, m, mask.device)  # not reused after
        full_mask = torch.cat([mask.repeat_interleave(m, dim=0), step_mask], dim=1)
        return decode_steps(self, ids, full_mask, cache).reshape(b, m, d, -1)

    def score_prepared(
        self, encoded: Encoded, capture: str = "fast", keep_cache: bool = False
    ) -> tuple[list[Record], Prefill, dict[str, Any]]:
        """Records of one batch prepared by `prepare`, from one prompt forward; also that
        forward and its inputs (keep_cache: as `score_encoded`)."""
        return self._read(self._queue(encoded, capture, keep_cache))

    def _queue(self, encoded: Encoded, capture: str, keep_cache: bool = False) -> Queued:
        """The batch's forward and scoring, queued on the device (on a CPU: done)."""
        inputs = self.to_device(encoded.inputs)
        pre, logprobs = self.score_encoded(inputs, encoded.spans, encoded.trie, capture, keep_cache)
        return Queued(encoded, inputs, pre, logprobs)

    def _read(self, queued: Queued) -> tuple[list[Record], Prefill, dict[str, Any]]:
        """Records of a queued batch: its results read back once, Eq. 6 summed on the host."""
        encoded, pre = queued.encoded, queued.prefill
        rows, logprobs = pre.rows.cpu(), queued.logprobs.cpu()  # (B, L, T), (B, N)
        lengths = encoded.inputs["attention_mask"].sum(-1).tolist()
        records = [
            make_record(
                req, logprobs[b], evidence(rows[b], spans), spans, lengths[b], self.layers_extra
            )
            for b, (req, spans) in enumerate(zip(encoded.batch, encoded.spans, strict=True))
        ]
        return records, pre, queued.inputs

    def score_encoded(
        self,
        inputs: dict[str, Any],
        spans: list[list[tuple[int, int]]],
        trie: LabelTrie,
        capture: str = "fast",
        keep_cache: bool = False,
    ) -> tuple[Prefill, torch.Tensor]:
        """The prompt forward (+ capture) and exact label log-probs (B, N) of encoded prompts.

        keep_cache: the returned Prefill's cache still holds exactly the prompt (label decoding
        runs on a copy), so generation can continue from the same pass.
        """
        scope = self.mask_scope(inputs, spans) if self.mask_scope else nullcontext()
        ride_along = len(trie.paths) == 1 and not keep_cache
        with scope:
            if ride_along:  # e.g. the "1" of "10".."12": no cache kept, no second forward
                pre = self.prefill(inputs, capture, keep_cache=False, append=trie.paths[0])
                paths = pre.path_logits
            else:
                pre = self.prefill(inputs, capture, keep_cache=keep_cache or bool(trie.paths))
                cache = copy.deepcopy(pre.cache) if trie.paths and keep_cache else pre.cache
                mask = inputs["attention_mask"]
                paths = self._decode_paths(trie, cache, mask) if trie.paths else None
        return pre, label_logprobs(trie, pre.logits, paths, self._penalty(inputs, pre.logits))

    def _penalty(self, inputs: dict[str, Any], logits: torch.Tensor) -> RepetitionPenalty | None:
        """The repetition penalty over each prompt's tokens, or None without one."""
        p = self.repetition_penalty
        if p is None or p == 1:
            return None
        seen = seen_tokens(inputs["input_ids"], inputs["attention_mask"], logits.shape[-1])
        return RepetitionPenalty(float(p), seen)

    @contextmanager
    def text_attention(self, impl: str) -> Iterator[None]:
        """The language model's attention set to `impl` inside, as it was after."""
        before = self.model.config.get_text_config()._attn_implementation
        key = None if self.text_only else "text_config"  # a text-only model has none to name
        self.model.set_attn_implementation(impl if key is None else {key: impl})
        try:
            yield
        finally:
            self.model.set_attn_implementation(before if key is None else {key: before})


@torch.no_grad()
def decode_steps(
    backend: Backend, ids: torch.Tensor, mask: torch.Tensor, cache: Any
) -> torch.Tensor:
    """Logits (R, D, V) of tokens `ids` (R, D) fed after the prompts in `cache`, each prompt's row
    repeated R / B times; `mask` (R, T + D) covers both (label paths, generation)."""
    pos = positions(mask)[:, -ids.shape[1] :]
    if backend.arch.mrope:  # the prompt forward's M-RoPE offsets, one per prompt
        deltas = backend.model.model.rope_deltas
        deltas = deltas.repeat_interleave(len(ids) // len(deltas), dim=0)
        pos = (pos + deltas).unsqueeze(0).expand(3, -1, -1)  # (3, R, D)
    steps = dict(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True)
    return backend.model(**steps, **backend.forward.cache(cache)).logits.float()


def repeat_rows(cache: Any, prompts: int, times: int, device: torch.device) -> Any:
    """`cache` with each prompt's row repeated `times` over, in place: (B*times, ...).
    reorder_cache also repeats a hybrid model's recurrent states (no batch_repeat_interleave)."""
    if times > 1:
        cache.reorder_cache(torch.arange(prompts, device=device).repeat_interleave(times))
    return cache
