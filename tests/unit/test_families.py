"""The family matrix: every registered family, on its own tiny random fp32 checkpoint (built from
the spec's `tiny` config), in both norm modes. Each reference is computed through the model's own
modules (out_proj, post-norm, final norm, lm_head), not through the adapter's weight reading.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import Tensor, nn

from model_worker.analysis.contributions import head_outputs
from model_worker.contracts.experiments import EXPERIMENT_NAMES, ExperimentRequest
from model_worker.experiments.job import run_experiment
from model_worker.model.adapters import REGISTRY
from model_worker.model.capture import RunCache, run_with_cache
from model_worker.model.interventions import positionless_heads, zero_heads
from model_worker.model.loading import LoadedModel
from model_worker.model.qk import rotate
from model_worker.run.analyze import analyze
from model_worker.run.state import final_projector
from tests.tiny_models import EXAMPLE_PROMPT, tiny_family

FAMILIES = sorted(REGISTRY)
RTOL = 1e-5  # fp32: relative to the size of the compared values


def close(got: Tensor, expected: Tensor, rtol: float = RTOL) -> bool:
    """|got − expected| ≤ rtol · max(1, |expected|) everywhere."""
    scale = max(1.0, float(expected.abs().max()))
    return float((got - expected).abs().max()) <= rtol * scale


@pytest.fixture(scope="module", params=FAMILIES)
def family(request: pytest.FixtureRequest) -> LoadedModel:
    return tiny_family(request.param)


def capture(loaded: LoadedModel, prompt: str = EXAMPLE_PROMPT) -> tuple[RunCache, Tensor]:
    ids = loaded.tokenizer(prompt, return_tensors="pt").input_ids
    return run_with_cache(loaded.model, loaded.adapter, loaded.geometry, ids), ids


def block(loaded: LoadedModel, layer: int, name: str | None) -> nn.Module | None:
    return None if name is None else loaded.adapter.sub(loaded.model, layer, name)


@contextmanager
def keep_output(module: nn.Module, store: dict[str, Tensor], key: str) -> Iterator[None]:
    """Record `module`'s output (first element of a tuple) under `store[key]`."""

    def hook(_m: nn.Module, _args: Any, output: Any) -> None:
        store[key] = (output[0] if isinstance(output, tuple) else output).detach()

    handle = module.register_forward_hook(hook)
    try:
        yield
    finally:
        handle.remove()


def attention_outputs(loaded: LoadedModel, ids: Tensor) -> list[Tensor]:
    """o (the attention module's own output, before any post-norm) of every layer, [B, S, D]."""
    store: dict[str, Tensor] = {}
    with torch.no_grad(), ExitStack() as stack:
        for layer in range(loaded.geometry.n_layers):
            attn = block(loaded, layer, loaded.adapter.spec.attn)
            assert attn is not None
            stack.enter_context(keep_output(attn, store, str(layer)))
        loaded.model(ids)
    return [store[str(layer)] for layer in range(loaded.geometry.n_layers)]


def direct_head(loaded: LoadedModel, layer: int, head: int, z: Tensor, o: Tensor) -> Tensor:
    """Head `head`'s write into the residual through the model's own modules: the output
    projection of z with every other head zeroed (less the bias), passed through the post-norm
    with its scale frozen at the real o: o_h ⊙ post_norm(o) / o. z [..., H*d], o [..., D]."""
    d = loaded.geometry.d_head
    out_proj = block(loaded, layer, loaded.adapter.spec.out_proj)
    assert out_proj is not None
    only = torch.zeros_like(z)
    only[..., head * d : (head + 1) * d] = z[..., head * d : (head + 1) * d]
    with torch.no_grad():
        o_h = out_proj(only) - out_proj(torch.zeros_like(z))
        post = block(loaded, layer, loaded.adapter.spec.attn_post_norm)
        return o_h if post is None else o_h * post(o) / o


def model_logits(loaded: LoadedModel, x: Tensor, x_final: Tensor, mode: str) -> Tensor:
    """The model's final logits from residual x through its own final norm and lm_head, with the
    norm's scale frozen at x_final in `fixed` mode (ratio of the module's own output)."""
    spec, model = loaded.adapter.spec, loaded.model
    norm, unembed = model.get_submodule(spec.final_norm), model.get_submodule(spec.unembed)
    with torch.no_grad():
        if mode == "recompute":
            logits = unembed(norm(x))
        else:
            centre = isinstance(norm, nn.LayerNorm)
            beta = norm.bias if getattr(norm, "bias", None) is not None else 0.0

            def c(v: Tensor) -> Tensor:
                return v - v.mean(-1, keepdim=True) if centre else v

            ratio = (norm(x_final) - beta) / c(x_final)
            logits = unembed(c(x) * ratio + beta)
        cap = loaded.adapter.final_softcap
        return logits if cap is None else cap * torch.tanh(logits / cap)


def test_heads_plus_bias_equal_what_attention_adds(family: LoadedModel) -> None:
    """Σ_h head_h + bias = attn_out, and head_h = the model's own out_proj (+ post-norm) slice."""
    cache, ids = capture(family)
    adapter, g = family.adapter, family.geometry
    outputs = attention_outputs(family, ids)
    for layer in range(g.n_layers):
        scale = cache.attn_scale[layer, 0]
        heads = head_outputs(cache.z[layer, 0] * scale, adapter.w_out(family.model, layer, g))
        bias = adapter.b_out(family.model, layer)
        total = heads.sum(-2) + (0 if bias is None else scale * bias)
        assert close(total, cache.attn_out[layer, 0])
        for head in range(g.n_heads):
            direct = direct_head(family, layer, head, cache.z[layer, 0], outputs[layer][0])
            assert close(heads[:, head], direct)


def test_residual_bookkeeping_and_embeddings(family: LoadedModel) -> None:
    """resid_pre + attn_out + mlp_out = next resid_pre (parallel blocks too); Lin_0 is the
    embedding as fed (Gemma ×√d, GPT-2 + W_pos)."""
    cache, ids = capture(family)
    spec, model = family.adapter.spec, family.model
    assert close(cache.resid_post[:-1], cache.resid_pre[1:])
    assert close(cache.resid_post[-1, 0], cache.resid_final[0])
    with torch.no_grad():
        embed = model.get_submodule(spec.embed).weight[ids[0]] * family.adapter.embed_scale
        positions = family.adapter.position_embedding(model, ids.shape[1])
        expected = embed if positions is None else embed + positions
    assert close(cache.resid_pre[0, 0], expected)


@pytest.mark.parametrize("mode", ["fixed", "recompute"])
def test_recomputed_final_logits_equal_the_models(family: LoadedModel, mode: str) -> None:
    cache, ids = capture(family)
    for position in range(ids.shape[1]):
        x = cache.resid_final[0, position]
        projector = final_projector(family, x, mode)  # type: ignore[arg-type]
        assert close(projector.cap(projector.logits(x)), cache.logits[0, position])


@pytest.mark.parametrize("mode", ["fixed", "recompute"])
def test_head_increases_equal_a_direct_computation(family: LoadedModel, mode: str) -> None:
    """analyze()'s I(head | Lin) = log softmax of the model's own final norm + lm_head (+ cap) at
    Lin + the head's slice through out_proj (+ post-norm), minus the same at Lin."""
    result = analyze(family, EXAMPLE_PROMPT, target="foo", norm=mode, top_k_heads=2)  # type: ignore[arg-type]
    cache, ids = capture(family)
    last, target = ids.shape[1] - 1, result.target.id
    outputs = attention_outputs(family, ids)
    x_final = cache.resid_final[0, last]
    for summary in result.heads:
        layer, head = summary.layer, summary.head
        v = direct_head(family, layer, head, cache.z[layer, 0, last], outputs[layer][0, last])
        base = cache.resid_pre[layer, 0, last]
        after = torch.log_softmax(model_logits(family, base + v, x_final, mode), -1)[target]
        before = torch.log_softmax(model_logits(family, base, x_final, mode), -1)[target]
        assert summary.increase == pytest.approx(float(after - before), rel=1e-4, abs=2e-5)


@pytest.mark.parametrize("mode", ["fixed", "recompute"])
def test_layer_increases_equal_a_direct_computation(family: LoadedModel, mode: str) -> None:
    """analyze()'s I(attn_l | resid_pre_l) and I(ffn_l | resid_mid_l), by the definition
    through the model's own final norm and lm_head (+ cap): resid_mid = resid_pre + attn_out,
    resid_mid + mlp_out (fixed mode reads this as the next layer's resid_pre)."""
    result = analyze(family, EXAMPLE_PROMPT, target="foo", norm=mode, top_k_heads=2)  # type: ignore[arg-type]
    cache, ids = capture(family)
    last, target = ids.shape[1] - 1, result.target.id
    x_final = cache.resid_final[0, last]

    def logprob(x: Tensor) -> float:
        return float(torch.log_softmax(model_logits(family, x, x_final, mode), -1)[target])

    for row in result.layers:
        pre = cache.resid_pre[row.layer, 0, last]
        mid = pre + cache.attn_out[row.layer, 0, last]
        post = mid + cache.mlp_out[row.layer, 0, last]
        attn, ffn = logprob(mid) - logprob(pre), logprob(post) - logprob(mid)
        assert row.attn_increase == pytest.approx(attn, rel=1e-4, abs=2e-5)
        assert row.ffn_increase == pytest.approx(ffn, rel=1e-4, abs=2e-5)


def test_zeroing_a_head_equals_removing_its_slice(family: LoadedModel) -> None:
    """zero_heads((l, h)) gives the logits of a forward that subtracts head h's slice from the
    output projection's output, and o changes by exactly that slice."""
    cache, ids = capture(family)
    layer, head = 1, 2
    out_proj = block(family, layer, family.adapter.spec.out_proj)
    assert out_proj is not None
    d = family.geometry.d_head

    def remove(_m: nn.Module, args: tuple[Tensor, ...], output: Tensor) -> Tensor:
        only = torch.zeros_like(args[0])
        only[..., head * d : (head + 1) * d] = args[0][..., head * d : (head + 1) * d]
        return output - (out_proj.forward(only) - out_proj.forward(torch.zeros_like(only)))

    store: dict[str, Tensor] = {}
    handle = out_proj.register_forward_hook(remove)
    try:
        with torch.no_grad():
            reference = family.model(ids).logits
    finally:
        handle.remove()
    with keep_output(out_proj, store, "before"), torch.no_grad():
        family.model(ids)
    with zero_heads(family, [(layer, head)]), keep_output(out_proj, store, "after"):
        zeroed = capture(family)[0]
    o_h = direct_head(family, layer, head, cache.z[layer, 0], store["before"][0])
    if family.adapter.spec.attn_post_norm is None:
        assert close(store["after"][0], store["before"][0] - o_h)
    assert close(zeroed.logits, reference)
    assert not close(zeroed.logits, cache.logits)


@contextmanager
def without_positions(loaded: LoadedModel) -> Iterator[None]:
    """The model with its positional signal neutralised: rotary cos = 1, sin = 0 (GPT-J's
    [sin | cos] table likewise), learned position embeddings zero."""
    saved: list[tuple[Tensor, Tensor]] = []
    handles = []

    def identity(_m: nn.Module, _args: Any, out: tuple[Tensor, Tensor]) -> tuple[Tensor, Tensor]:
        return torch.ones_like(out[0]), torch.zeros_like(out[1])

    with torch.no_grad():
        for module in loaded.model.modules():
            table = getattr(module, "embed_positions", None)
            if isinstance(table, Tensor):
                saved.append((table, table.clone()))
                half = table.shape[-1] // 2
                table[..., :half], table[..., half:] = 0.0, 1.0
            elif type(module).__name__.endswith("RotaryEmbedding"):
                handles.append(module.register_forward_hook(identity))
        if loaded.adapter.spec.pos_embed:
            weight = loaded.model.get_submodule(loaded.adapter.spec.pos_embed).weight
            saved.append((weight, weight.clone()))
            weight.zero_()
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()
        with torch.no_grad():
            for tensor, value in saved:
                tensor.copy_(value)


def test_positionless_heads_are_the_models_attention_without_positions(
    family: LoadedModel,
) -> None:
    """With the positions neutralised in the model itself, the recomputed position-free heads
    (the adapter's q/k/v with q/k norms, scaling, soft-cap, sliding window) equal its own z;
    with positions they differ. Checks project_qkv and the attention parameters per family."""
    heads = [(1, 0), (2, 3)]
    cache, _ = capture(family)
    with positionless_heads(family, heads):
        moved = capture(family)[0]
    assert not close(moved.z[1], cache.z[1])
    with without_positions(family):
        plain = capture(family)[0]
        with positionless_heads(family, heads):
            free = capture(family)[0]
    assert close(free.z, plain.z)
    assert not close(plain.z, cache.z)


def test_adapter_queries_and_keys_reproduce_the_models_attention(family: LoadedModel) -> None:
    """The adapter's q/k (q/k norms) rotated as the model rotates them (partial, rotate_half or
    GPT-J pairs), scored with its scaling, soft-cap and windows, give the model's own pattern;
    and W_Q x̂ + b_Q is the query before any q-norm (the reverse-projection weights)."""
    cache, ids = capture(family)
    adapter, g, model = family.adapter, family.geometry, family.model
    positions = torch.arange(ids.shape[1])[None]
    with torch.no_grad():
        for layer in range(g.n_layers):
            x = cache.normalized[layer]
            q, k, v = adapter.project_qkv(model, layer, g, x, x)
            assert close(v, cache.v[layer])
            if adapter.spec.q_norm is None:
                weights = adapter.qkv(model, layer, g)
                assert close(torch.einsum("bsd,hde->bshe", x, weights.w_q) + weights.b_q, q)
                assert close(torch.einsum("bsd,hde->bshe", x, weights.w_k) + weights.b_k, k)
            q, k = (adapter.rotate(model, layer, g, t, positions) for t in (q, k))
            assert close(adapter.pattern(model, layer, g, q, k), cache.pattern[layer])


def test_recorded_queries_and_keys_are_what_the_model_scores_with(family: LoadedModel) -> None:
    """The recorded keys are the adapter's keys rotated by the recorded rotary (the modelling
    file's own function and convention), un-rotating gives them back, and the recorded query,
    key, scaling, soft-cap and mask give the model's pattern. An attention that bypasses the
    recorder (no eager_attention_forward: GPT-J before transformers 5.24) records nothing."""
    adapter, g, model = family.adapter, family.geometry, family.model
    ids = family.tokenizer(EXAMPLE_PROMPT, return_tensors="pt").input_ids
    cache = run_with_cache(model, adapter, g, ids, record_qk=True)
    assert cache.qk is not None
    attn = adapter.sub(model, 0, adapter.spec.attn)
    if not hasattr(sys.modules[type(attn).__module__], "eager_attention_forward"):
        assert all(record.key is None for record in cache.qk)
        return
    positions = list(range(ids.shape[1]))
    kv = [g.kv_head(h) for h in range(g.n_heads)]
    with torch.no_grad():
        for layer, record in enumerate(cache.qk):
            assert record.query is not None and record.key is not None
            assert (record.rotary is None) == (adapter.spec.rotary == "none")
            x = cache.normalized[layer]
            keys = adapter.project_qkv(model, layer, g, x, x)[1][0].transpose(0, 1)  # [n, S, d]
            assert close(rotate(record, keys, positions), record.key[0])
            assert close(rotate(record, record.key[0], positions, inverse=True), keys)
            scores = record.query[0] @ record.key[0, kv].transpose(-1, -2) * record.scaling
            if record.softcap is not None:
                scores = record.softcap * torch.tanh(scores / record.softcap)
            if record.mask is not None:
                scores = scores + record.mask[0]
            assert close(scores.softmax(-1), cache.pattern[layer, 0])


def test_the_declared_block_shape_is_the_models(family: LoadedModel) -> None:
    """Parallel blocks: the FFN reads Lin, so zeroing every head of a layer leaves its FFN
    output unchanged; sequential blocks: the FFN reads Lin + attn and changes."""
    cache, _ = capture(family)
    layer = 1
    with zero_heads(family, [(layer, h) for h in range(family.geometry.n_heads)]):
        zeroed = capture(family)[0]
    assert close(zeroed.resid_pre[layer], cache.resid_pre[layer])
    same_ffn = close(zeroed.mlp_out[layer], cache.mlp_out[layer])
    assert same_ffn == family.adapter.parallel


def test_bad_weights_are_a_clear_load_error(family: LoadedModel) -> None:
    """A checkpoint whose head count does not match its weights: ModelLoadError at wrap time."""
    from model_worker.common.errors import ModelLoadError
    from model_worker.model.loading import wrap_model

    config = family.model.config
    original = config.num_attention_heads
    try:
        config.num_attention_heads = 3  # 3 heads do not divide the projections
        with pytest.raises(ModelLoadError, match="does not match its config"):
            wrap_model(family.model, family.tokenizer, name="broken")  # type: ignore[arg-type]
    finally:
        config.num_attention_heads = original


def test_batched_experiment_increases_equal_analyze(family: LoadedModel) -> None:
    """The experiments' batched fixed-mode head increases (post-norm scale, soft-cap) equal
    analyze()'s for each right-padded row."""
    from model_worker.datasets import build_prompts
    from model_worker.experiments.batching import prepare, run_prompts
    from tests.unit.test_experiments import TINY

    items = prepare(family, build_prompts(TINY, 3, seed=3, variant="imbalanced"))
    for run in run_prompts(family, items, batch_size=3, increases="all"):
        result = analyze(family, run.item.prompt.text, target=run.item.prompt.true_label)
        assert run.increases is not None
        for head in result.heads:
            expected = pytest.approx(head.increase, rel=1e-4, abs=2e-5)
            assert run.increases[head.layer, head.head] == expected


@pytest.mark.parametrize("name", FAMILIES)
def test_every_experiment_runs(name: str, tmp_path: Path) -> None:
    """Each experiment end to end on a tiny dataset (n = 2, one batch: about a second)."""
    from tests.unit.test_experiments import tiny_csv

    loaded = tiny_family(name)
    for experiment in EXPERIMENT_NAMES:
        request = ExperimentRequest(
            name=experiment,
            dataset="upload",
            n=2,
            dataset_text=tiny_csv(tmp_path),
            dataset_filename="tiny.csv",
        )
        result = run_experiment(loaded, request, batch_size=16)
        assert result.metrics and all(isinstance(v, float) for v in result.metrics.values())
        assert result.figures and all(f.series or f.matrix for f in result.figures.values())


def test_a_family_cannot_be_registered_without_its_tiny_test_config() -> None:
    from dataclasses import replace

    with pytest.raises(ValueError, match="needs a tiny test config"):
        replace(REGISTRY["llama"], tiny={})
    with pytest.raises(ValueError, match="fused qkv layout needs qkv only"):
        replace(REGISTRY["llama"], qkv_layout="fused")
