"""The head atlas's pure scores on hand-made attention patterns, and Spearman's ρ."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from model_worker.analysis.atlas import (
    induction_scores,
    previous_token_scores,
    repeated_sequences,
    spearman,
    top_k,
)
from model_worker.patching.engine import label_saliency
from tests.tiny_models import EXAMPLE_PROMPT, tiny_llama


def test_repeated_sequences_repeat_their_first_half() -> None:
    ids = repeated_sequences(list(range(3, 30)), 4, 10, torch.Generator().manual_seed(0))
    assert ids.shape == (4, 20)
    assert torch.equal(ids[:, :10], ids[:, 10:])
    assert all(len(set(row[:10].tolist())) == 10 for row in ids)  # no repeats inside a copy


def test_a_perfect_induction_head_and_a_previous_token_head() -> None:
    half, seq = 5, 10
    induction = torch.zeros(seq, seq)
    previous = torch.zeros(seq, seq)
    for i in range(seq):
        previous[i, max(i - 1, 0)] = 1.0
        induction[i, i - half + 1 if i >= half else 0] = 1.0
    pattern = torch.stack([induction, previous])[None, None]  # [L=1, B=1, H=2, S, S]
    assert induction_scores(pattern, half).tolist() == [[1.0, 0.0]]
    # issue 38.7: every token of the second copy counts, its first too (skipped before)
    first_only = torch.zeros(1, 1, 1, seq, seq)
    first_only[..., half, 1] = 1.0
    assert induction_scores(first_only, half).item() == pytest.approx(1 / half)
    prev = previous_token_scores(pattern)
    assert prev[0, 1] == 1.0 and prev[0, 0] < 0.5


def test_spearman_is_a_rank_correlation() -> None:
    x = np.array([0.1, 0.5, 0.2, 3.0])
    assert spearman(np.stack([x, x**3])) == pytest.approx(1.0)
    assert spearman(np.stack([x, -x])) == pytest.approx(-1.0)
    assert np.isnan(spearman(np.stack([x, np.ones(4)])))
    batched = spearman(np.stack([np.stack([x, x]), np.stack([x, -x])]))  # [2, 2, n] → [2]
    assert batched.tolist() == pytest.approx([1.0, -1.0])
    assert top_k(x, 2) == [3, 1]


def test_label_saliency_is_per_head_and_adds_over_positions() -> None:
    """|A ⊙ ∂L/∂A| per head [L, H], non-negative; fewer label positions give less."""
    loaded = tiny_llama()
    ids = loaded.tokenizer(EXAMPLE_PROMPT, return_tensors="pt").input_ids[0]
    target = loaded.tokenizer.get_vocab()["foo"]
    labels = [2, 5, 8, 11]
    found = label_saliency(loaded, ids, target, labels)
    assert found.shape == (3, 4) and bool((found >= 0).all()) and float(found.sum()) > 0
    one = label_saliency(loaded, ids, target, [2])
    assert bool((one <= found + 1e-7).all())  # a subset of positions sums to less
