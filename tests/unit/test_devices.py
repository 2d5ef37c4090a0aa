"""The engine's exact identities on every device torch has here: the CPU always, CUDA where it
is present (never skipped, never faked: without CUDA its cases are simply not generated).

Every registered family's tiny random fp32 checkpoint is moved to the device and checked as
`test_families.py` checks it on the CPU (heads + bias = attention output, residual bookkeeping,
recomputed final logits, head increases = a direct computation through the model's own modules,
zeroing a head), and analyze() and the experiments on the device must agree with the CPU's.
fp32 matrix products are IEEE on CUDA unless `torch.set_float32_matmul_precision` says
otherwise (TF32 loosens them to ~1e-3): these tests keep torch's default, "highest".
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import Tensor, nn

from model_worker.analysis.contributions import head_outputs
from model_worker.contracts.analysis import AnalysisResult
from model_worker.contracts.experiments import EXPERIMENT_NAMES, ExperimentRequest
from model_worker.experiments.job import run_experiment
from model_worker.model.adapters import REGISTRY
from model_worker.model.capture import RunCache, run_with_cache
from model_worker.model.interventions import zero_heads
from model_worker.model.loading import LoadedModel
from model_worker.run.analyze import analyze
from model_worker.run.state import final_projector
from tests.tiny_models import EXAMPLE_PROMPT, tiny_family
from tests.unit.test_experiments import tiny_csv
from tests.unit.test_families import attention_outputs, block, close, direct_head, model_logits

DEVICES = ["cpu", *(["cuda"] if torch.cuda.is_available() else [])]
FAMILIES = sorted(REGISTRY)
CASES = [(device, family) for device in DEVICES for family in FAMILIES]


def on_device(family: str, device: str) -> LoadedModel:
    """The family's tiny checkpoint (seeded: the same weights on every call) on `device`."""
    loaded = tiny_family(family)
    loaded.model.to(device)
    return loaded


@pytest.fixture(scope="module", params=CASES, ids=[f"{d}-{f}" for d, f in CASES])
def model(request: pytest.FixtureRequest) -> LoadedModel:
    device, family = request.param
    return on_device(family, device)


def capture(loaded: LoadedModel) -> tuple[RunCache, Tensor]:
    ids = loaded.tokenizer(EXAMPLE_PROMPT, return_tensors="pt").input_ids.to(loaded.device)
    return run_with_cache(loaded.model, loaded.adapter, loaded.geometry, ids), ids


def test_the_default_fp32_matmul_precision_is_ieee() -> None:
    """The tolerances below assume IEEE fp32 products (no TF32)."""
    assert torch.get_float32_matmul_precision() == "highest"


def test_the_cache_lives_on_the_models_device(model: LoadedModel) -> None:
    cache, _ = capture(model)
    assert cache.z.device.type == cache.resid_final.device.type == model.device.type


def test_heads_plus_bias_equal_what_attention_adds(model: LoadedModel) -> None:
    """Σ_h head_h + bias = attn_out, and head_h = the model's own out_proj (+ post-norm) slice."""
    cache, ids = capture(model)
    adapter, g = model.adapter, model.geometry
    outputs = attention_outputs(model, ids)
    for layer in range(g.n_layers):
        scale = cache.attn_scale[layer, 0]
        w_out = adapter.w_out(model.model, layer, g).to(cache.z.device)
        heads = head_outputs(cache.z[layer, 0] * scale, w_out)
        bias = adapter.b_out(model.model, layer)
        total = heads.sum(-2) + (0 if bias is None else scale * bias.to(scale.device))
        assert close(total, cache.attn_out[layer, 0])
        for head in range(g.n_heads):
            direct = direct_head(model, layer, head, cache.z[layer, 0], outputs[layer][0])
            assert close(heads[:, head], direct)


def test_residual_bookkeeping_and_embeddings(model: LoadedModel) -> None:
    """resid_pre + attn_out + mlp_out = the next resid_pre, the last one the final residual;
    Lin_0 is the embedding as fed (Gemma ×√d, GPT-2 + W_pos)."""
    cache, ids = capture(model)
    spec, adapter = model.adapter.spec, model.adapter
    assert close(cache.resid_post[:-1], cache.resid_pre[1:])
    assert close(cache.resid_post[-1, 0], cache.resid_final[0])
    with torch.no_grad():
        table = model.model.get_submodule(spec.embed).weight
        assert isinstance(table, Tensor)
        embed = table[ids[0]] * adapter.embed_scale
        positions = adapter.position_embedding(model.model, ids.shape[1])
        expected = embed if positions is None else embed + positions.to(embed.device)
    assert close(cache.resid_pre[0, 0], expected)


@pytest.mark.parametrize("mode", ["fixed", "recompute"])
def test_recomputed_final_logits_equal_the_models(model: LoadedModel, mode: str) -> None:
    cache, ids = capture(model)
    for position in range(ids.shape[1]):
        x = cache.resid_final[0, position]
        projector = final_projector(model, x, mode)  # type: ignore[arg-type]
        assert close(projector.cap(projector.logits(x)), cache.logits[0, position])


def test_head_increases_equal_a_direct_computation(model: LoadedModel) -> None:
    """analyze()'s fixed-mode I(head | Lin) on the device = the model's own final norm + lm_head
    at Lin + the head's slice through out_proj (+ post-norm), minus the same at Lin."""
    result = analyze(model, EXAMPLE_PROMPT, target="foo", top_k_heads=2)
    cache, ids = capture(model)
    last, target = ids.shape[1] - 1, result.target.id
    outputs = attention_outputs(model, ids)
    x_final = cache.resid_final[0, last]
    for summary in result.heads:
        layer, head = summary.layer, summary.head
        v = direct_head(model, layer, head, cache.z[layer, 0, last], outputs[layer][0, last])
        base = cache.resid_pre[layer, 0, last]
        after = torch.log_softmax(model_logits(model, base + v, x_final, "fixed"), -1)[target]
        before = torch.log_softmax(model_logits(model, base, x_final, "fixed"), -1)[target]
        assert summary.increase == pytest.approx(float(after - before), rel=1e-4, abs=2e-5)


def test_zeroing_a_head_equals_removing_its_slice(model: LoadedModel) -> None:
    """zero_heads((1, 2)) gives the logits of a forward that subtracts the head's slice from the
    output projection's output."""
    _, ids = capture(model)
    layer, head, d = 1, 2, model.geometry.d_head
    out_proj = block(model, layer, model.adapter.spec.out_proj)
    assert out_proj is not None

    def remove(_m: nn.Module, args: tuple[Tensor, ...], output: Tensor) -> Tensor:
        only = torch.zeros_like(args[0])
        only[..., head * d : (head + 1) * d] = args[0][..., head * d : (head + 1) * d]
        return output - (out_proj.forward(only) - out_proj.forward(torch.zeros_like(only)))

    handle = out_proj.register_forward_hook(remove)
    try:
        with torch.no_grad():
            reference = model.model(ids).logits
    finally:
        handle.remove()
    with zero_heads(model, [(layer, head)]):
        zeroed = capture(model)[0]
    assert close(zeroed.logits, reference)


def agree(got: AnalysisResult, expected: AnalysisResult) -> None:
    """Two analyses of one prompt agree to fp32 accuracy: the same target and tokens, the same
    per-head increases and attention sums, the same detailed heads where the ranking is clear."""
    assert got.target.id == expected.target.id
    assert got.target.logprob == pytest.approx(expected.target.logprob, rel=1e-5, abs=1e-5)
    assert [t.id for t in got.tokens] == [t.id for t in expected.tokens]
    mine = {h.name: h for h in got.heads}
    for head in expected.heads:
        other = mine[head.name]
        assert other.increase == pytest.approx(head.increase, rel=1e-4, abs=2e-5)
        assert other.attn_true == pytest.approx(head.attn_true, abs=1e-5)
        assert other.attn_false == pytest.approx(head.attn_false, abs=1e-5)
    for name, detail in expected.head_details.items():
        if name in got.head_details:
            assert got.head_details[name].attention == pytest.approx(detail.attention, abs=1e-5)


@pytest.mark.parametrize("mode", ["fixed", "recompute"])
def test_analyze_on_the_device_equals_the_cpus(model: LoadedModel, mode: str) -> None:
    """The same weights analysed on the device and on the CPU give the same result (on the CPU
    itself: analyze() is deterministic)."""
    reference = tiny_family(model.name.removeprefix("tiny-"))
    kwargs = {"norm": mode, "top_k_heads": 3, "rank_by": "label", "extra_heads": ["L0H0"]}
    got = analyze(model, EXAMPLE_PROMPT, **kwargs)  # type: ignore[arg-type]
    agree(got, analyze(reference, EXAMPLE_PROMPT, **kwargs))  # type: ignore[arg-type]


def test_recurring_heads_on_the_device_equal_the_cpus(model: LoadedModel) -> None:
    """Heads detailed a third time project through their kept U_h (on a GPU several factored
    heads share a block of logits: `device_branches`); the result equals the CPU's, whose
    heads recur the same way."""
    reference = tiny_family(model.name.removeprefix("tiny-"))
    kwargs = {"top_k_heads": 3, "extra_heads": ["L0H0"]}
    for loaded in (model, reference):
        for _ in range(2):
            analyze(loaded, EXAMPLE_PROMPT, **kwargs)  # type: ignore[arg-type]
    assert model.head_unembeddings.nbytes > 0 and reference.head_unembeddings.nbytes > 0
    got = analyze(model, EXAMPLE_PROMPT, **kwargs)  # type: ignore[arg-type]
    agree(got, analyze(reference, EXAMPLE_PROMPT, **kwargs))  # type: ignore[arg-type]


@pytest.mark.parametrize("device", DEVICES)
def test_every_experiment_runs_on_the_device(device: str, tmp_path: Path) -> None:
    """Each experiment end to end on the device (Llama, tiny dataset), metrics as on the CPU."""
    csv = tiny_csv(tmp_path)
    for experiment in EXPERIMENT_NAMES:
        request = ExperimentRequest(
            name=experiment, dataset="upload", n=2, dataset_text=csv, dataset_filename="tiny.csv"
        )
        got = run_experiment(on_device("llama", device), request, batch_size=16)
        expected = run_experiment(tiny_family("llama"), request, batch_size=16)
        assert got.metrics.keys() == expected.metrics.keys()
        for key, value in expected.metrics.items():
            assert got.metrics[key] == pytest.approx(value, rel=1e-4, abs=1e-5, nan_ok=True)
