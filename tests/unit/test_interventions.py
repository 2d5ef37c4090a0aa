"""Interventions: head zeroing, final-residual addition, position-free attention."""

from __future__ import annotations

import torch

from model_worker.model.capture import RunCache, run_with_cache
from model_worker.model.interventions import (
    add_to_final_residual,
    positionless_heads,
    zero_heads,
)
from model_worker.model.loading import LoadedModel
from tests.tiny_models import EXAMPLE_PROMPT, tiny_gpt2


def capture(loaded: LoadedModel) -> RunCache:
    ids = loaded.tokenizer(EXAMPLE_PROMPT, return_tensors="pt")["input_ids"]
    return run_with_cache(loaded.model, loaded.adapter, loaded.geometry, ids)


def head_slice(cache: RunCache, layer: int, head: int, d_head: int) -> torch.Tensor:
    return cache.z[layer, :, :, head * d_head : (head + 1) * d_head]


def test_zeroed_head_writes_nothing_and_others_are_untouched(tiny_model: LoadedModel) -> None:
    d = tiny_model.geometry.d_head
    before = capture(tiny_model)
    with zero_heads(tiny_model, [(1, 2)]):
        after = capture(tiny_model)
    assert torch.count_nonzero(head_slice(after, 1, 2, d)) == 0
    assert torch.count_nonzero(head_slice(before, 1, 2, d)) > 0
    for head in (0, 1, 3):  # the other heads of that layer read the same input
        assert torch.allclose(head_slice(after, 1, head, d), head_slice(before, 1, head, d))
    assert torch.allclose(after.z[0], before.z[0])  # earlier layers unchanged
    assert not torch.allclose(after.logits, before.logits)
    assert torch.allclose(capture(tiny_model).logits, before.logits)  # hooks removed


def test_final_residual_addition(tiny_model: LoadedModel) -> None:
    before = capture(tiny_model)
    last = before.resid_final.shape[1] - 1
    vector = torch.randn(1, tiny_model.geometry.d_model)
    with add_to_final_residual(tiny_model, vector, torch.tensor([last])):
        after = capture(tiny_model)
    assert torch.allclose(after.resid_final[0, last], before.resid_final[0, last] + vector[0])
    assert torch.allclose(after.resid_final[0, :last], before.resid_final[0, :last])
    assert torch.allclose(after.logits[0, :last], before.logits[0, :last], atol=1e-6)
    assert not torch.allclose(after.logits[0, last], before.logits[0, last])


def test_positionless_gpt2_without_position_embeddings_changes_nothing() -> None:
    loaded = tiny_gpt2(seed=4)
    with torch.no_grad():
        loaded.model.get_submodule("transformer.wpe").weight.zero_()
    before = capture(loaded)
    with positionless_heads(loaded, [(0, 1), (2, 3)]):
        after = capture(loaded)
    assert torch.allclose(after.z, before.z, atol=1e-5)


def test_positionless_gpt2_changes_only_the_chosen_heads() -> None:
    loaded = tiny_gpt2(seed=4)
    d = loaded.geometry.d_head
    before = capture(loaded)
    with positionless_heads(loaded, [(1, 0)]):
        after = capture(loaded)
    assert not torch.allclose(head_slice(after, 1, 0, d), head_slice(before, 1, 0, d))
    for head in (1, 2, 3):
        assert torch.allclose(head_slice(after, 1, head, d), head_slice(before, 1, head, d))


def test_positionless_llama_is_attention_without_rotation() -> None:
    """Recomputed independently from the captured normed input and the adapter's weights."""
    from tests.tiny_models import tiny_llama

    loaded = tiny_llama(seed=2)
    g, layer, head = loaded.geometry, 1, 3
    with positionless_heads(loaded, [(layer, head)]):
        after = capture(loaded)
    w_q, b_q, w_k = loaded.adapter.w_qk(loaded.model, layer, g)
    x = after.normalized[layer, 0]  # [S, D]
    kv = g.kv_head(head)
    q = x @ w_q[head] + b_q[head]
    k = x @ w_k[kv]
    scores = q @ k.T / g.d_head**0.5
    seq = x.shape[0]
    scores = scores.masked_fill(~torch.ones(seq, seq, dtype=torch.bool).tril(), float("-inf"))
    expected = scores.softmax(-1) @ after.v[layer, 0, :, kv]
    assert torch.allclose(head_slice(after, layer, head, g.d_head)[0], expected, atol=1e-5)
    before = capture(loaded)
    assert not torch.allclose(before.z[layer], after.z[layer])
    assert torch.allclose(before.z[:layer], after.z[:layer])
