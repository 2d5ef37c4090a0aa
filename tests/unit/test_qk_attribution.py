"""The two towers decomposed (docs/towers.md), on every registered family's tiny random fp32
checkpoint: the terms sum to the score the model computed, the token-level split sums to its
component's term, removing one component and recomputing the score directly changes it by that
component's row (query side) or column (key side), a difference of two positions is the
difference of their decompositions, GPT-2's rotary position part is zero, GQA heads use their
shared key head."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor, nn

from model_worker.analysis.contributions import head_outputs
from model_worker.analysis.scores import score_split
from model_worker.model.adapters import REGISTRY
from model_worker.model.capture import RunCache, run_with_cache
from model_worker.model.loading import LoadedModel
from model_worker.model.qk import LayerQk, rotate
from model_worker.towers.run import TowersError, decompose, layer_record, model_score
from tests.tiny_models import EXAMPLE_PROMPT, tiny_family

FAMILIES = sorted(REGISTRY)
RTOL = 1e-4


def close(got: Tensor | float, expected: Tensor | float, rtol: float = RTOL) -> bool:
    got, expected = torch.as_tensor(got), torch.as_tensor(expected)
    scale = max(1.0, float(expected.abs().max()))
    return float((got - expected).abs().max()) <= rtol * scale


@pytest.fixture(scope="module", params=FAMILIES)
def family(request: pytest.FixtureRequest) -> tuple[LoadedModel, RunCache]:
    loaded = tiny_family(request.param)
    ids = loaded.tokenizer(EXAMPLE_PROMPT, return_tensors="pt").input_ids
    cache = run_with_cache(loaded.model, loaded.adapter, loaded.geometry, ids, record_qk=True)
    return loaded, cache


def last_of(cache: RunCache) -> int:
    return int(cache.resid_pre.shape[2]) - 1


def test_terms_sum_to_the_models_score(family: tuple[LoadedModel, RunCache]) -> None:
    loaded, cache = family
    g, last = loaded.geometry, last_of(cache)
    for layer in range(g.n_layers):
        record = layer_record(cache, layer)
        for head in (0, g.n_heads - 1):
            for found in decompose(loaded, cache, layer, head, last, [0, 2, last]):
                expected = model_score(record, head, g.kv_head(head), last, found.key_position)
                assert close(found.score, expected)
                assert close(found.token_terms.sum(), expected)
                assert close(found.by_query.sum(), expected)
                assert close(found.by_key.sum(), expected)


def test_token_level_terms_sum_to_their_components(family: tuple[LoadedModel, RunCache]) -> None:
    loaded, cache = family
    last = last_of(cache)
    (found,) = decompose(loaded, cache, loaded.geometry.n_layers - 1, 0, last, [2])
    assert close(found.query_split.sum(1), found.by_query)
    assert close(found.key_split.sum(1), found.by_key)
    # a token slot's row of the token matrix = what every component wrote from that token
    assert close(found.token_terms.sum(1), found.query_split.sum(0))
    assert close(found.token_terms.sum(0), found.key_split.sum(0))
    # nothing is read from a token after the position it was read at
    assert float(found.key_split[:, 3:-1].abs().max()) == 0.0


def _exists(model: nn.Module, path: str) -> bool:
    try:
        model.get_submodule(path)
    except AttributeError:
        return False
    return True


def _frozen(module: nn.Module, real: Tensor, x: Tensor, centred: bool) -> Tensor:
    """`module`'s own output on x with its scale frozen at `real`, by the ratio of its real
    output: β + (module(real) − β) ⊙ c(x) / c(real) (c: centring for a LayerNorm)."""
    bias = getattr(module, "bias", None)
    beta = bias.detach() if isinstance(bias, Tensor) else 0.0

    def c(v: Tensor) -> Tensor:
        return v - v.mean(-1, keepdim=True) if centred else v

    with torch.no_grad():
        out = module(real)
    return beta + (out - beta) * c(x) / c(real)


def _side(
    loaded: LoadedModel,
    record: LayerQk,
    layer: int,
    index: int,
    x: Tensor,
    real: Tensor,
    query: bool,
) -> Tensor:
    """The head's query (or key) at one position from the residual x [D], every norm's scale
    frozen at the real residual `real` [D], through the model's own norm modules and rotary."""
    adapter, g, spec, model = loaded.adapter, loaded.geometry, loaded.adapter.spec, loaded.model
    centred = spec.norm == "layer"
    if spec.ln_attn is not None:
        norm = adapter.sub(model, layer, spec.ln_attn)
        x, real = _frozen(norm, real, x, centred), _frozen(norm, real, real, centred)
    weights = adapter.qkv(model, layer, g)
    w, b = (weights.w_q, weights.b_q) if query else (weights.w_k, weights.b_k)
    pre = torch.einsum("m,nmd->nd", x, w) + b  # every head of the side [n, d]
    pre_real = torch.einsum("m,nmd->nd", real, w) + b
    name = spec.q_norm if query else spec.k_norm
    module = None
    if name is not None and _exists(model, f"{spec.layers}.{layer}.{name}"):
        module = adapter.sub(model, layer, name)
    if module is not None:
        if spec.qk_norm_scope == "flat":
            pre = _frozen(module, pre_real.flatten(), pre.flatten(), False).view(pre.shape)
        else:
            per_head = getattr(module, "norms", None)
            if isinstance(per_head, nn.ModuleList):
                module = per_head[index]
                pre, pre_real = pre[index : index + 1], pre_real[index : index + 1]
                index = 0
            pre = _frozen(module, pre_real, pre, isinstance(module, nn.LayerNorm))
    return pre[index][None, None]  # [1, 1, d], as `rotate` takes it


def _score(
    loaded: LoadedModel,
    cache: RunCache,
    layer: int,
    head: int,
    xs: tuple[Tensor, Tensor],
    at: tuple[int, int],
) -> float:
    """The pre-cap score of head (layer, head) from residuals xs = (x_t, x_p), scales frozen."""
    record = layer_record(cache, layer)
    kv = loaded.geometry.kv_head(head)
    reals = [cache.resid_pre[layer, 0, p] for p in at]
    q = _side(loaded, record, layer, head, xs[0], reals[0], True)
    k = _side(loaded, record, layer, kv, xs[1], reals[1], False)
    q, k = rotate(record, q, [at[0]])[0, 0], rotate(record, k, [at[1]])[0, 0]
    return float(q @ k * record.scaling)


def _component(loaded: LoadedModel, cache: RunCache, name: str, position: int) -> Tensor:
    """Component `name` of the residual at `position`, in residual space: a head's output (its
    post-norm scale frozen), an FFN's, or the embedding as fed less any learned position."""
    g = loaded.geometry
    if name == "embed":
        positions = loaded.adapter.position_embedding(loaded.model, position + 1)
        embed = cache.resid_pre[0, 0, position]
        return embed if positions is None else embed - positions[position].detach()
    layer = int(name[1:].split("H")[0].split(".")[0])
    if name.endswith(".ffn"):
        return cache.mlp_out[layer, 0, position]
    head = int(name.split("H")[1])
    scale = cache.attn_scale[layer, 0, position]
    w_out = loaded.adapter.w_out(loaded.model, layer, g)
    return head_outputs(cache.z[layer, 0, position] * scale, w_out)[head]


def test_removing_a_component_changes_the_score_by_its_row_or_column(
    family: tuple[LoadedModel, RunCache],
) -> None:
    loaded, cache = family
    g, last = loaded.geometry, last_of(cache)
    layer, head, source = g.n_layers - 1, g.n_heads - 1, 2
    (found,) = decompose(loaded, cache, layer, head, last, [source])
    names = list(found.names)
    x_t, x_p = cache.resid_pre[layer, 0, last], cache.resid_pre[layer, 0, source]
    whole = _score(loaded, cache, layer, head, (x_t, x_p), (last, source))
    assert close(whole, found.score)
    for name in ("embed", "L0H1", f"L{layer - 1}.ffn", f"L{layer - 1}H0"):
        without_q = _score(
            loaded,
            cache,
            layer,
            head,
            (x_t - _component(loaded, cache, name, last), x_p),
            (last, source),
        )
        without_k = _score(
            loaded,
            cache,
            layer,
            head,
            (x_t, x_p - _component(loaded, cache, name, source)),
            (last, source),
        )
        row, column = found.by_query[names.index(name)], found.by_key[names.index(name)]
        assert close(whole - without_q, row), name
        assert close(whole - without_k, column), name


def test_difference_is_the_difference_of_decompositions(
    family: tuple[LoadedModel, RunCache],
) -> None:
    loaded, cache = family
    last = last_of(cache)
    p, q = decompose(loaded, cache, loaded.geometry.n_layers - 1, 1, last, [2, 6])
    diff = p.minus(q)
    assert close(diff.terms, p.terms - q.terms)
    assert close(diff.score, p.score - q.score)
    assert close(diff.token_terms, p.token_terms - q.token_terms)
    assert close(diff.by_key, p.by_key - q.by_key)
    assert close(diff.query_split.sum(1), diff.by_query)


def test_position_part_is_the_rotary_remainder(family: tuple[LoadedModel, RunCache]) -> None:
    """Σ content terms = the content score of the head panel (pre-cap); GPT-2 (learned
    positions) has no position part, and its position embedding is a component."""
    loaded, cache = family
    g, last = loaded.geometry, last_of(cache)
    layer, head = g.n_layers - 1, 0
    record = layer_record(cache, layer)
    sources = [0, 3, 6, last]
    found = decompose(loaded, cache, layer, head, last, sources)
    position_part = torch.stack([(f.terms - f.content_terms).sum() for f in found])
    if record.rotary is None:
        assert float(position_part.abs().max()) == 0.0
    if loaded.adapter.spec.pos_embed is not None:
        assert "pos_embed" in found[0].names
    assert record.query is not None and record.key is not None
    plain = score_split(
        query=record.query[0, head, last],
        keys=record.key[0, g.kv_head(head), : last + 1],
        scaling=record.scaling,
        softcap=None,
        mask=None,
        unrotate=None if record.rotary is None else lambda x, p: rotate(record, x, p, inverse=True),
    )
    content = torch.stack([f.content_terms.sum() for f in found])
    assert close(content, plain.content[sources])


def test_gqa_heads_use_their_shared_key_head() -> None:
    loaded = tiny_family("llama")
    g = loaded.geometry
    assert g.n_kv_heads < g.n_heads
    ids = loaded.tokenizer(EXAMPLE_PROMPT, return_tensors="pt").input_ids
    cache = run_with_cache(loaded.model, loaded.adapter, g, ids, record_qk=True)
    last, layer = ids.shape[1] - 1, g.n_layers - 1
    found = [decompose(loaded, cache, layer, h, last, [3])[0] for h in range(g.n_heads)]
    record = layer_record(cache, layer)
    assert record.key is not None
    for head, f in enumerate(found):
        key = record.key[0, g.kv_head(head), 3]
        assert close(f.key.sum(0), key)
        same = [o for o in range(g.n_heads) if g.kv_head(o) == g.kv_head(head)]
        assert all(torch.equal(found[o].key, f.key) for o in same)
    assert not torch.equal(found[0].key, found[-1].key)


def test_bad_positions_are_one_sentence() -> None:
    loaded = tiny_family("gpt2")
    ids = loaded.tokenizer(EXAMPLE_PROMPT, return_tensors="pt").input_ids
    cache = run_with_cache(loaded.model, loaded.adapter, loaded.geometry, ids, record_qk=True)
    n = ids.shape[1]
    for bad in (n, -1, 10_000):
        with pytest.raises(TowersError, match="outside the prompt"):
            decompose(loaded, cache, 1, 0, n - 1, [bad])
    plain = run_with_cache(loaded.model, loaded.adapter, loaded.geometry, ids)
    with pytest.raises(TowersError, match="queries and keys"):
        decompose(loaded, plain, 1, 0, n - 1, [0])


@pytest.mark.parametrize("name", ["phi", "stablelm"])
def test_layernorm_qk_norms(name: str) -> None:
    """Phi's and StableLM's q/k LayerNorms (StableLM: one per head), which their tiny configs
    leave off (`qk_layernorm` is not taken from the config's keyword arguments): switched on."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from model_worker.model.loading import wrap_model
    from tests.tiny_models import WORDS, randomize_norms_and_biases, word_tokenizer

    spec = REGISTRY[name]
    torch.manual_seed(0)
    config = AutoConfig.for_model(name, vocab_size=len(WORDS), **spec.tiny)
    config.qk_layernorm = True
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    randomize_norms_and_biases(model, spec.norm_offset)
    loaded = wrap_model(model.eval(), word_tokenizer(), name=f"tiny-{name}-qk")
    ids = loaded.tokenizer(EXAMPLE_PROMPT, return_tensors="pt").input_ids
    cache = run_with_cache(loaded.model, loaded.adapter, loaded.geometry, ids, record_qk=True)
    assert loaded.adapter.sub(loaded.model, 0, spec.q_norm or "") is not None
    family = (loaded, cache)
    test_terms_sum_to_the_models_score(family)
    test_removing_a_component_changes_the_score_by_its_row_or_column(family)
