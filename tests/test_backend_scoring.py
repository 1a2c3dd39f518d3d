"""Label trie and restricted-softmax scoring (Appendix B), on synthetic logits: no model needed."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lad.backends.batches import batched
from lad.backends.hf import evidence
from lad.backends.scoring import LabelTrie, label_logprobs
from lad.errors import BackendError

EOS = 0
VOCAB = 12


def _fake_logits(
    trie: LabelTrie, batch: int, seed: int
) -> tuple[torch.Tensor, torch.Tensor | None]:
    g = torch.Generator().manual_seed(seed)
    root = torch.randn(batch, VOCAB, generator=g)
    if not trie.paths:
        return root, None
    depth = max(len(p) for p in trie.paths)
    return root, torch.randn(batch, len(trie.paths), depth, VOCAB, generator=g)


label_sets = st.lists(
    st.lists(st.integers(1, VOCAB - 1), min_size=1, max_size=3).map(tuple),
    min_size=1,
    max_size=8,
    unique=True,
)


@settings(max_examples=60, deadline=None)
@given(labels=label_sets, seed=st.integers(0, 1000))
def test_probabilities_sum_to_one(labels: list[tuple[int, ...]], seed: int) -> None:
    trie = LabelTrie.build([list(t) for t in labels], EOS, [str(t) for t in labels])
    root, paths = _fake_logits(trie, 3, seed)
    logp = label_logprobs(trie, root, paths)
    assert logp.shape == (3, len(labels))
    torch.testing.assert_close(logp.exp().sum(-1), torch.ones(3, dtype=torch.float64))


def test_single_token_labels_are_one_softmax() -> None:
    trie = LabelTrie.build([[3], [5], [7]], EOS, ["a", "b", "c"])
    assert trie.paths == ()
    root = torch.randn(2, VOCAB)
    expected = root[:, [3, 5, 7]].double().log_softmax(-1)
    torch.testing.assert_close(label_logprobs(trie, root, None), expected)


def test_prefix_label_uses_end_of_answer_after_one_decoding_step() -> None:
    # "1", "10", "2": after "1" the valid set is {"0", EOS}.
    trie = LabelTrie.build([[1], [1, 10], [2]], EOS, ["1", "10", "2"])
    assert trie.paths == ((1,),)
    assert trie.valid((1,)) == [EOS, 10]
    root = torch.randn(1, VOCAB)
    step = torch.randn(1, 1, 1, VOCAB)
    logp = label_logprobs(trie, root, step)[0]
    first = root[0, [1, 2]].double().log_softmax(-1)
    second = step[0, 0, 0, [EOS, 10]].double().log_softmax(-1)
    expected = torch.stack([first[0] + second[0], first[0] + second[1], first[1]])
    torch.testing.assert_close(logp, expected)


def test_identical_tokenisations_are_an_error() -> None:
    with pytest.raises(BackendError, match="labels 'x' and 'y' tokenise identically"):
        LabelTrie.build([[4], [4]], EOS, ["x", "y"])


def test_evidence_sums_each_span() -> None:
    rows = torch.arange(12, dtype=torch.float32).reshape(2, 6)  # (L, T)
    out = evidence(rows, [(1, 3), (4, 6)])
    assert out.tolist() == [[3.0, 9.0], [15.0, 21.0]]


def test_batches_split_on_size_and_on_candidate_count() -> None:
    class It:
        def __init__(self, n: int) -> None:
            self.num_candidates = n
            self.is_text = False  # picture candidates (Item.is_text)

    reqs = [(It(n), 0, []) for n in (4, 4, 4, 8, 8, 4)]
    sizes = [[r[0].num_candidates for r in b] for b in batched(reqs, 2)]
    assert sizes == [[4, 4], [4], [8, 8], [4]]
    texts = [It(4) for _ in range(3)]
    texts[1].is_text = True  # one kind of candidate per batch, too
    kinds = [[r[0].is_text for r in b] for b in batched([(t, 0, []) for t in texts], 4)]
    assert kinds == [[False], [True], [False]]
