"""Identities the analysis maths must satisfy exactly, on tiny random GPT-2 and Llama-GQA models."""

from __future__ import annotations

import pytest
import torch

from model_worker.analysis.contributions import (
    head_outputs,
    logprob_increase,
    part_increases,
    subhead_values,
    value_outputs,
    whole_increase,
)
from model_worker.analysis.head_unembedding import FactoredValues, head_unembedding
from model_worker.analysis.metrics import summarize_projections
from model_worker.analysis.position_views import (
    direct_value_logits,
    labels_first,
    position_views_fixed,
)
from model_worker.analysis.projection import FinalNorm, VocabProjector
from model_worker.model.capture import RunCache, run_with_cache
from model_worker.model.loading import LoadedModel
from model_worker.run.state import final_projector
from tests.tiny_models import EXAMPLE_PROMPT

ATOL = 1e-4


def capture(loaded: LoadedModel, prompt: str = EXAMPLE_PROMPT) -> tuple[RunCache, torch.Tensor]:
    ids = loaded.tokenizer(prompt, return_tensors="pt").input_ids
    return run_with_cache(loaded.model, loaded.adapter, loaded.geometry, ids), ids


def w_o(loaded: LoadedModel, layer: int) -> torch.Tensor:
    return loaded.adapter.w_o(loaded.model, layer, loaded.geometry)


def test_head_outputs_plus_bias_equal_attention_output(tiny_model: LoadedModel) -> None:
    cache, _ = capture(tiny_model)
    for layer in range(tiny_model.geometry.n_layers):
        heads = head_outputs(cache.z[layer, 0], w_o(tiny_model, layer))  # [S, H, D]
        bias = tiny_model.adapter.o_bias(tiny_model.model, layer)
        total = heads.sum(-2) + (0 if bias is None else bias)
        assert (total - cache.attn_out[layer, 0]).abs().max() <= ATOL


def test_subheadvalues_sum_to_the_head_output(tiny_model: LoadedModel) -> None:
    """Σ_p a_{h,p} v_p W_O^h = head_h at the last position; checks the GQA K/V mapping too."""
    cache, ids = capture(tiny_model)
    g, last = tiny_model.geometry, ids.shape[1] - 1
    kv = torch.tensor([g.kv_head(h) for h in range(g.n_heads)])
    for layer in range(g.n_layers):
        weights = w_o(tiny_model, layer)
        values = value_outputs(cache.v[layer, 0], weights, kv)  # [H, S, D]
        per_position = subhead_values(cache.pattern[layer, 0, :, last], values)
        heads = head_outputs(cache.z[layer, 0, last], weights)
        assert (per_position.sum(1) - heads).abs().max() <= ATOL


def test_attention_rows_are_causal_distributions(tiny_model: LoadedModel) -> None:
    cache, ids = capture(tiny_model)
    rows = cache.pattern[:, 0]  # [L, H, S, S]
    assert torch.allclose(rows.sum(-1), torch.ones_like(rows[..., 0]), atol=1e-5)
    assert rows.triu(1).abs().max() == 0


def test_residual_bookkeeping(tiny_model: LoadedModel) -> None:
    """resid_pre + attn + ffn = resid_post = next resid_pre; the last one enters the final norm."""
    cache, _ = capture(tiny_model)
    post = cache.resid_post
    assert (post[:-1] - cache.resid_pre[1:]).abs().max() <= ATOL
    assert (post[-1, 0] - cache.resid_final[0]).abs().max() <= ATOL


def test_recomputed_logits_equal_the_models(tiny_model: LoadedModel) -> None:
    cache, ids = capture(tiny_model)
    for position in range(ids.shape[1]):
        x = cache.resid_final[0, position]
        for mode in ("fixed", "recompute"):
            projector = final_projector(tiny_model, x, mode)
            assert (projector.logits(x) - cache.logits[0, position]).abs().max() <= ATOL


def test_fixed_mode_layer_contributions_add_up(tiny_model: LoadedModel) -> None:
    """bs(resid_final) = bs(embeddings) + Σ_l bs(attn_l) + Σ_l bs(ffn_l) in fixed mode."""
    cache, ids = capture(tiny_model)
    last = ids.shape[1] - 1
    projector = final_projector(tiny_model, cache.resid_final[0, last], "fixed")
    parts = projector.linear(cache.attn_out[:, 0, last]).sum(0)
    parts = parts + projector.linear(cache.mlp_out[:, 0, last]).sum(0)
    total = projector.logits(cache.resid_pre[0, 0, last]) + parts
    assert (total - cache.logits[0, last]).abs().max() <= ATOL


def test_logprob_increase_matches_its_definition(tiny_model: LoadedModel) -> None:
    """I(v|x) = log softmax(bs(x+v))[w] − log softmax(bs(x))[w], bs through the real final norm
    in recompute mode, with margins (bs(x+v) − bs(x))[a] − (…)[b]."""
    cache, ids = capture(tiny_model)
    last, target, margin = ids.shape[1] - 1, 3, (3, 4)
    model, adapter = tiny_model.model, tiny_model.adapter
    final_norm = model.get_submodule(adapter.spec.final_norm)
    unembed = model.get_submodule(adapter.spec.unembed)
    bases = cache.resid_pre[:, 0, last]
    heads = torch.stack(
        [head_outputs(cache.z[layer, 0, last], w_o(tiny_model, layer)) for layer in range(3)]
    )
    projector = final_projector(tiny_model, cache.resid_final[0, last], "recompute")
    got = logprob_increase(projector, bases, heads, target, margin, chunk=3)
    with torch.no_grad():
        for layer in range(bases.shape[0]):
            base_logits = unembed(final_norm(bases[layer]))
            for head in range(heads.shape[1]):
                logits = unembed(final_norm(bases[layer] + heads[layer, head]))
                expected = (
                    torch.log_softmax(logits, -1)[target]
                    - torch.log_softmax(base_logits, -1)[target]
                )
                assert abs(got.increase[layer, head] - expected) <= ATOL
                delta = logits - base_logits
                assert got.margin is not None
                assert abs(got.margin[layer, head] - (delta[3] - delta[4])) <= ATOL


@pytest.mark.parametrize("chunk", [None, 3])
def test_fixed_mode_increase_uses_the_frozen_scale(
    tiny_model: LoadedModel, chunk: int | None
) -> None:
    """Every head of every layer, in one block or in blocks of 3 (the reused block storage)."""
    cache, ids = capture(tiny_model)
    last, target = ids.shape[1] - 1, 5
    projector = final_projector(tiny_model, cache.resid_final[0, last], "fixed")
    bases = cache.resid_pre[:, 0, last]
    heads = torch.stack(
        [
            head_outputs(cache.z[layer, 0, last], w_o(tiny_model, layer))
            for layer in range(bases.shape[0])
        ]
    )
    got = logprob_increase(projector, bases, heads, target, chunk=chunk).increase
    for layer in range(bases.shape[0]):
        before = torch.log_softmax(projector.logits(bases[layer]), -1)[target]
        for head in range(heads.shape[1]):
            shifted = projector.logits(bases[layer]) + projector.linear(heads[layer, head])
            after = torch.log_softmax(shifted, -1)[target]
            assert abs(got[layer, head] - (after - before)) <= ATOL
    base, vector = cache.resid_pre[1, 0, last], cache.attn_out[1, 0, last]
    # and bs_fixed(base + v) = bs_fixed(base) + bs_linear(v)
    assert (
        projector.logits(base + vector) - projector.logits(base) - projector.linear(vector)
    ).abs().max() <= ATOL


def test_query_and_key_weights_reproduce_the_modules(tiny_model: LoadedModel) -> None:
    """W_Q/b_Q/W_K from the adapter give the module's own (pre-rotary) queries and keys."""
    loaded = tiny_model
    cache, ids = capture(loaded)
    g, layer = loaded.geometry, 1
    x_hat = cache.normalized[layer, 0]  # [S, D]
    w_q, b_q, w_k = loaded.adapter.w_qk(loaded.model, layer, g)
    queries = torch.einsum("sd,hde->she", x_hat, w_q) + b_q
    keys = torch.einsum("sd,hde->she", x_hat, w_k)
    with torch.no_grad():
        if loaded.adapter.spec.qkv is not None:
            qkv = loaded.adapter.sub(loaded.model, layer, "attn.c_attn")(x_hat)
            width = g.n_heads * g.d_head
            q_ref, k_ref = qkv[:, :width], qkv[:, width : 2 * width]
        else:
            q_ref = loaded.adapter.sub(loaded.model, layer, "self_attn.q_proj")(x_hat)
            k_ref = loaded.adapter.sub(loaded.model, layer, "self_attn.k_proj")(x_hat)
    assert (queries.reshape(len(x_hat), -1) - q_ref).abs().max() <= ATOL
    assert (keys.reshape(len(x_hat), -1) - k_ref).abs().max() <= ATOL


def test_right_padded_batch_matches_single_prompts(tiny_model: LoadedModel) -> None:
    tokenizer = tiny_model.tokenizer
    prompts = [EXAMPLE_PROMPT, "good : foo bad : bar cat :"]
    batch = tokenizer(prompts, return_tensors="pt", padding=True, padding_side="right")
    g = tiny_model.geometry
    together = run_with_cache(
        tiny_model.model, tiny_model.adapter, g, batch.input_ids, batch.attention_mask
    )
    for row, prompt in enumerate(prompts):
        alone, ids = capture(tiny_model, prompt)
        n = ids.shape[1]
        assert (together.logits[row, :n] - alone.logits[0]).abs().max() <= ATOL
        assert (together.z[:, row, :n] - alone.z[:, 0]).abs().max() <= ATOL
        assert (
            together.pattern[:, row, :, n - 1, :n] - alone.pattern[:, 0, :, n - 1]
        ).abs().max() <= ATOL


@pytest.mark.parametrize("chunk", [3, 5, 7, 64])
@pytest.mark.parametrize("labels", [[2, 5, 8, 11], [11, 2, 8]])
def test_fixed_mode_fast_path_equals_the_direct_computation(
    tiny_model: LoadedModel, chunk: int, labels: list[int]
) -> None:
    """position_views_fixed (one projection per value, labels first) = separate projections of
    a·v and v, whether a block holds part of one head's positions or several heads, with the
    labels in any order."""
    cache, ids = capture(tiny_model)
    g, last = tiny_model.geometry, ids.shape[1] - 1
    kv = torch.tensor([g.kv_head(h) for h in range(g.n_heads)])
    layer = 2
    values = value_outputs(cache.v[layer, 0], w_o(tiny_model, layer), kv)  # [H, S, D]
    rows = cache.pattern[layer, 0, :, last]
    bases = cache.resid_pre[layer, 0, last].expand(g.n_heads, -1)
    projector = final_projector(tiny_model, cache.resid_final[0, last], "fixed")
    rank_ids = ids[0, labels]
    fast = position_views_fixed(
        projector,
        bases,
        direct_value_logits(projector, values),
        rows,
        3,
        labels,
        rank_ids,
        5,
        (3, 4),
        chunk=chunk,
    )
    slow = logprob_increase(projector, bases, subhead_values(rows, values), 3, (3, 4))
    assert (fast.contribution.increase - slow.increase).abs().max() <= ATOL
    assert fast.contribution.margin is not None and slow.margin is not None
    assert (fast.contribution.margin - slow.margin).abs().max() <= ATOL
    flat_ranks = rank_ids.expand(g.n_heads, -1).reshape(-1)
    plain = summarize_projections(
        projector.project, values[:, labels].reshape(-1, values.shape[-1]), 5, flat_ranks, 3
    )
    weighted = summarize_projections(
        projector.project,
        (rows[:, labels, None] * values[:, labels]).reshape(-1, values.shape[-1]),
        5,
        flat_ranks,
        3,
    )
    assert torch.equal(fast.value.ranks, plain.ranks)
    assert torch.equal(fast.value.top_ids, plain.top_ids)
    assert torch.allclose(fast.value.top_values, plain.top_values, atol=ATOL)
    assert torch.allclose(fast.weighted.top_values, weighted.top_values, atol=ATOL)


def test_factored_values_project_like_the_values(tiny_model: LoadedModel) -> None:
    """bs of v_p W_O^h through the head's factored unembedding U_h equals the direct
    projection of the values, for every head of a layer and any slice of them, also where
    only some heads have their U_h (the values of those without it alone given)."""
    cache, ids = capture(tiny_model)
    g, last = tiny_model.geometry, ids.shape[1] - 1
    layer = 1
    weights = w_o(tiny_model, layer)
    kv = torch.tensor([g.kv_head(h) for h in range(g.n_heads)])
    values = value_outputs(cache.v[layer, 0], weights, kv)  # [H, S, D]
    projector = final_projector(tiny_model, cache.resid_final[0, last], "fixed")
    unembeddings = [head_unembedding(projector, weights[h]) for h in range(g.n_heads)]
    z = torch.stack([cache.v[layer, 0][:, g.kv_head(h)] for h in range(g.n_heads)])
    factored = FactoredValues(values[:0], z, unembeddings)  # no head needs its values
    # the odd heads without U_h: only their values are kept
    mixed = FactoredValues(
        values[1::2], z, [None if h % 2 else u for h, u in enumerate(unembeddings)]
    )
    direct = direct_value_logits(projector, values)
    blocks = [
        (slice(None), slice(None)),
        (slice(1, 3), slice(2, 7)),
        (slice(3, 4), slice(1, 5)),  # mixed: a head without U_h alone, projected directly
        (slice(2, 3), slice(None)),  # one head, its product returned as it is
    ]
    for heads, positions in blocks:
        want = direct(heads, positions)
        for values_of in (factored, mixed):
            got = values_of.logits(projector, heads, positions)
            assert got.shape == want.shape
            assert (got - want).abs().max() <= ATOL * max(1.0, float(want.abs().max()))


def _wide_projector(mode: str) -> VocabProjector:
    """A projector over a real-sized vocabulary (49,152 tokens, like SmolLM2's), logits ~N(0, 4)."""
    generator = torch.Generator().manual_seed(0)
    d_model = 32
    norm = FinalNorm("rms", 1 + 0.1 * torch.randn(d_model, generator=generator), None, 1e-5)
    w_u = 0.7 * torch.randn(49_152, d_model, generator=generator)
    return VocabProjector(norm, w_u, None, mode, torch.tensor(0.5))  # type: ignore[arg-type]


@pytest.mark.parametrize("mode", ["fixed", "recompute"])
def test_a_zero_write_raises_the_log_probability_by_exactly_zero(mode: str) -> None:
    """I(0 | x) = 0 exactly, on a real-sized vocabulary: both log-probabilities of an increase go
    through one log-softmax kernel, so their fp32 sums of 49,152 exponentials round alike (with
    two kernels they differed by up to ~8e-6, and every increase carried that)."""
    projector = _wide_projector(mode)
    generator = torch.Generator().manual_seed(1)
    bases = 1.6 * torch.randn(4, projector.w_u.shape[1], generator=generator)
    zeros = bases.new_zeros(4, 3, bases.shape[1])
    for target in (0, 777, 49_151):
        assert logprob_increase(projector, bases, zeros, target).increase.abs().max() == 0
        if mode == "fixed":
            whole = whole_increase(projector, bases, zeros, target)
            assert whole.increase.abs().max() == 0
            part, rest = part_increases(projector, bases, zeros, zeros, target)
            assert part.abs().max() == 0 and rest.abs().max() == 0
            values = bases.new_ones(4, 5, bases.shape[1])
            silent = bases.new_zeros(4, 5)  # no attention: every a_p · v_p W_O^h is zero
            views = position_views_fixed(
                projector,
                bases,
                direct_value_logits(projector, values),
                silent,
                target,
                [],
                torch.empty(0, dtype=torch.long),
                1,
            )
            assert views.contribution.increase.abs().max() == 0


def test_labels_first_puts_the_labels_first_and_keeps_every_position_once() -> None:
    assert labels_first([5, 1], 7) == [5, 1, 0, 2, 3, 4, 6]
    assert labels_first([], 3) == [0, 1, 2]
    with pytest.raises(ValueError, match="distinct"):
        labels_first([2, 2], 4)
