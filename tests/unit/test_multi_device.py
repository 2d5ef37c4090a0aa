"""The multi-device path (`--device auto`: a model's layers spread over several GPUs, the analysis
on the unembedding's device) on a machine with one device: the same code with the layers placed
on virtual devices (tests/device_stub.py), where any operation mixing two of them raises as torch
does for two GPUs. Every cross-layer gather goes through `device_memory.gather`/`to_device`;
results must equal the single-device ones exactly. Where two CUDA devices are lent, the same
placements run on them (never faked: without them those cases are not generated).
"""

from __future__ import annotations

import pytest
import torch

import model_worker.model.capture as capture_module
from model_worker.model.capture import Keep, run_with_cache
from model_worker.model.loading import LoadedModel
from model_worker.resources.device_memory import gather
from model_worker.resources.unembedding_cache import HeadUnembeddings
from model_worker.run.analyze import analyze
from tests.device_stub import DeviceMismatch, placed, virtual
from tests.tiny_models import EXAMPLE_PROMPT, tiny_gpt2, tiny_llama

#: Llama (untied, rotary, GQA): embedding and first layer on 1, two layers on 2, the final norm
#: and the unembedding (the analysis device) on 3.
LLAMA_MAP = {
    "model.embed_tokens": 1,
    "model.rotary_emb": 1,
    "model.layers.0": 1,
    "model.layers.1": 2,
    "model.layers.2": 2,
    "model.norm": 3,
    "lm_head": 3,
}
#: GPT-2 (tied: the unembedding is the embedding, so the analysis device is the first).
GPT2_MAP = {
    "transformer.wte": 1,
    "transformer.wpe": 1,
    "transformer.h.0": 2,
    "transformer.h.1": 2,
    "transformer.h.2": 3,
    "transformer.ln_f": 3,
    "lm_head": 1,
}


def fresh(loaded: LoadedModel) -> LoadedModel:
    loaded.head_unembeddings = HeadUnembeddings()
    return loaded


def test_the_stub_refuses_what_two_gpus_refuse() -> None:
    """Two virtual devices in one operation raise; moving through `to`/`gather` does not."""
    loaded = tiny_llama()
    layers = loaded.model.model.layers
    expected = torch.stack([layers[0].self_attn.q_proj.weight, layers[1].self_attn.q_proj.weight])
    with placed(loaded.model, LLAMA_MAP):
        first = loaded.model.model.layers[0].self_attn.q_proj.weight
        second = loaded.model.model.layers[1].self_attn.q_proj.weight
        assert first.device == virtual(1) and second.device == virtual(2)
        with pytest.raises(DeviceMismatch):
            torch.stack([first, second])
        with pytest.raises(DeviceMismatch):
            first @ second
        stacked = gather([first, second], virtual(3))
        assert stacked.device == virtual(3)
        assert torch.equal(stacked, expected)
        host = torch.ones(first.shape[1])  # a host tensor mixes with any (as a CPU index does)
        assert (first @ host).device == virtual(1)
    assert not hasattr(first, "_virtual_device")  # the model is left as it was


@pytest.mark.parametrize(
    ("build", "device_map", "analysis"),
    [(tiny_llama, LLAMA_MAP, 3), (tiny_gpt2, GPT2_MAP, 1)],
    ids=["llama", "gpt2"],
)
def test_an_analysis_spread_over_devices_equals_the_single_device_one(
    build: object, device_map: dict[str, int], analysis: int, pinned_kernels: None
) -> None:
    """analyze() (narrowed capture, per-head stage, details with U_h at first sight and label
    keys, a head's towers) with the layers on three devices: every captured tensor lands on
    the analysis device, and the result is the single-device one (every product through one
    kernel: `pinned_kernels`)."""
    assert callable(build)
    loaded: LoadedModel = build()
    kwargs = dict(top_k_heads=4, label_keys="all", towers=["L1H0"])
    alone = analyze(fresh(loaded), EXAMPLE_PROMPT, **kwargs)  # type: ignore[arg-type]
    ids = loaded.tokenizer(EXAMPLE_PROMPT, return_tensors="pt").input_ids
    g = loaded.geometry
    with placed(loaded.model, device_map) as stub:
        spread = analyze(fresh(loaded), EXAMPLE_PROMPT, **kwargs)  # type: ignore[arg-type]
        keep = Keep(positions=(2, ids.shape[1] - 1), rows=(ids.shape[1] - 1,), flow_labels=(2,))
        cache = run_with_cache(loaded.model, loaded.adapter, g, ids, record_qk=True, keep=keep)
        tensors = [cache.resid_pre, cache.z, cache.v, cache.pattern, cache.logits]
        assert cache.qk is not None and cache.flow is not None
        tensors += [cache.resid_final, cache.flow.mass["label_to_last"]]
        tensors += [t for r in cache.qk for t in (r.query, r.key) if t is not None]
        assert {t.device for t in tensors} == {virtual(analysis)}
    assert stub.crossings > 0, "no tensor crossed devices: the placement did not take"
    assert spread.model_dump() == alone.model_dump()


def test_a_cross_layer_gather_outside_the_helper_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """The capture's flow sums, stacked with torch.stack instead of `gather`, fail with the
    layers on two devices (what `--device auto` did on two GPUs)."""
    loaded = tiny_llama()
    monkeypatch.setattr(capture_module, "gather", lambda tensors, _device: torch.stack(tensors))
    with placed(loaded.model, LLAMA_MAP), pytest.raises(DeviceMismatch, match="stack"):
        analyze(fresh(loaded), EXAMPLE_PROMPT, top_k_heads=2)


TWO_GPUS = torch.cuda.is_available() and torch.cuda.device_count() >= 2

if TWO_GPUS:  # never faked: without two CUDA devices this case is not generated

    def test_two_real_gpus() -> None:
        """The Llama placement on cuda:0 / cuda:1 through accelerate's hooks."""
        from accelerate import dispatch_model

        loaded = tiny_llama()
        alone = analyze(fresh(loaded), EXAMPLE_PROMPT, top_k_heads=4, label_keys="all")
        device_map = {name: f"cuda:{0 if index < 2 else 1}" for name, index in LLAMA_MAP.items()}
        dispatch_model(loaded.model, device_map=device_map)
        spread = analyze(fresh(loaded), EXAMPLE_PROMPT, top_k_heads=4, label_keys="all")
        assert [h.name for h in spread.heads[:4]] == [h.name for h in alone.heads[:4]]
        for mine, theirs in zip(spread.heads, alone.heads, strict=True):
            assert mine.increase == pytest.approx(theirs.increase, rel=1e-4, abs=1e-5)
