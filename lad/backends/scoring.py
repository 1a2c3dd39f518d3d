"""Exact label scoring (docs/backends.md "Exact labels", paper Appendix B).

log P(c_k|x) is the sum, over the steps of c_k's tokens, of a softmax restricted to the tokens that
can validly come next (a trie of all labels' tokenisations); where a label is complete at a node
that also continues, the end-of-answer token joins that node's valid set. A step with one valid
token contributes 0, so only branching nodes below the root need a decoding step.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from lad.errors import BackendError

Prefix = tuple[int, ...]


@dataclass(frozen=True)
class LabelTrie:
    """The labels' token sequences and the trie nodes that need next-token logits.

    labels: (N,) token ids of each label, as the model would produce them after the prompt.
    eos: the end-of-answer token id.
    paths: the maximal prefixes fed to the decoding step; every branching non-root node is a
           prefix of one of them (empty when one softmax at the prompt's end suffices).
    """

    labels: tuple[Prefix, ...]
    eos: int
    paths: tuple[Prefix, ...]

    @classmethod
    def build(cls, labels: list[list[int]], eos: int, names: list[str]) -> LabelTrie:
        seqs = tuple(tuple(t) for t in labels)
        for k, seq in enumerate(seqs):
            if not seq:
                raise BackendError(f"label {names[k]!r} tokenises to nothing")
            if seqs.index(seq) != k:
                raise BackendError(
                    f"labels {names[seqs.index(seq)]!r} and {names[k]!r} tokenise identically"
                )
        trie = cls(seqs, eos, ())
        needed = [p for p in trie.nodes() if p and len(trie.valid(p)) > 1]
        paths = [p for p in needed if not any(len(q) > len(p) and q[: len(p)] == p for q in needed)]
        return cls(seqs, eos, tuple(sorted(paths)))

    def nodes(self) -> set[Prefix]:
        return {seq[:i] for seq in self.labels for i in range(len(seq) + 1)}

    def valid(self, prefix: Prefix) -> list[int]:
        """Tokens that may follow `prefix`, sorted; the end-of-answer token if a label ends here."""
        n = len(prefix)
        nxt = {seq[n] for seq in self.labels if len(seq) > n and seq[:n] == prefix}
        if nxt and prefix in self.labels:
            nxt.add(self.eos)
        return sorted(nxt)

    def where(self, prefix: Prefix) -> tuple[int, int]:
        """(path index, position in it) whose decoding-step logits follow a non-root prefix."""
        for m, path in enumerate(self.paths):
            if path[: len(prefix)] == prefix:
                return m, len(prefix) - 1
        raise AssertionError(f"prefix {prefix} is not on a decoding path")


@dataclass(frozen=True)
class RepetitionPenalty:
    """The repetition penalty of the label steps' logits (docs/methods.md), as transformers'
    RepetitionPenaltyLogitsProcessor applies it in `generate`: the logit of every token already
    in the sequence (the prompt's tokens, image tokens included, and the label's tokens before
    the step), each once, is divided by `penalty` where positive and multiplied where negative.

    seen: (B, V) bool, the tokens of each prompt (left padding excluded: `seen_tokens`).
    """

    penalty: float
    seen: torch.Tensor

    def apply(self, logits: torch.Tensor, prefix: Prefix) -> torch.Tensor:
        """`logits` (B, V) after the prompt and the label tokens `prefix`, penalised."""
        seen = self.seen
        if prefix:
            seen = seen.clone()
            seen[:, [t for t in prefix if t < seen.shape[1]]] = True
        p = self.penalty  # the same element-wise operations as transformers', bit for bit
        return torch.where(seen, torch.where(logits < 0, logits * p, logits / p), logits)


def seen_tokens(input_ids: torch.Tensor, attention_mask: torch.Tensor, vocab: int) -> torch.Tensor:
    """(B, V) bool: which of the V output tokens occur in each prompt (padding left out; ids the
    output layer lacks, which it cannot produce, are ignored as transformers does)."""
    ids = input_ids.masked_fill(attention_mask == 0, vocab).clamp(max=vocab)  # (B, T)
    seen = torch.zeros(ids.shape[0], vocab + 1, dtype=torch.bool, device=ids.device)
    return seen.scatter_(1, ids, True)[:, :vocab]


def label_logprobs(
    trie: LabelTrie,
    root_logits: torch.Tensor,
    path_logits: torch.Tensor | None,
    penalty: RepetitionPenalty | None = None,
) -> torch.Tensor:
    """log P(c_k|x) for every label: (B, N), float64.

    root_logits (B, V): next-token logits at the prompt's last token.
    path_logits (B, M, D, V): logits after each token of each decoding path (None if M == 0).
    penalty: applied to each step's logits before the restricted softmax (None: none).
    """
    out = []
    for seq in trie.labels:
        total = torch.zeros(root_logits.shape[0], dtype=torch.float64, device=root_logits.device)
        steps = [*seq, trie.eos] if trie.valid(seq) else list(seq)
        for i, token in enumerate(steps):
            prefix = seq[:i]
            valid = trie.valid(prefix)
            if len(valid) == 1:
                continue
            if prefix:
                m, pos = trie.where(prefix)
                logits = path_logits[:, m, pos]  # type: ignore[index]
            else:
                logits = root_logits
            if penalty is not None:
                logits = penalty.apply(logits, prefix)
            restricted = logits[:, valid].double().log_softmax(dim=-1)  # (B, |valid|)
            total = total + restricted[:, valid.index(token)]
        out.append(total)
    return torch.stack(out, dim=1)
